// ledger.hpp — the Ledger: current and peak bytes per category, the composition at the overall
// peak, and a timeline of allocation events for reports (memory over a step, Chrome traces).
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "memory/category.hpp"
#include "memory/phase.hpp"

namespace shardlab {

struct LedgerEvent {
  double t_ms;          // since the ledger was created
  Category category;
  int64_t delta;        // +bytes on allocation, -bytes on free
  uint64_t total_after; // all categories, after this event
  std::string tag;
  Phase phase;          // what the runtime was doing (set_phase)
};

using CategoryBytes = std::array<uint64_t, kNumCategories>;

class Ledger {
 public:
  explicit Ledger(size_t max_events = 1'000'000);

  void on_alloc(Category c, uint64_t bytes, const std::string& tag);
  void on_free(Category c, uint64_t bytes, const std::string& tag);
  void set_phase(Phase phase) { phase_ = phase; }
  const Phase& phase() const { return phase_; }

  uint64_t current(Category c) const { return current_[static_cast<int>(c)]; }
  uint64_t peak(Category c) const { return peak_[static_cast<int>(c)]; }
  uint64_t current_total() const { return total_; }
  uint64_t peak_total() const { return peak_total_; }
  const CategoryBytes& current_by_category() const { return current_; }
  const CategoryBytes& peak_by_category() const { return peak_; }
  // What was live, by category, at the moment the total peaked, and what was happening then.
  const CategoryBytes& composition_at_peak() const { return at_peak_; }
  const Phase& phase_at_peak() const { return phase_at_peak_; }

  const std::vector<LedgerEvent>& timeline() const { return events_; }
  // The timeline is kept only while recording (on by default); clear_timeline() starts it afresh.
  void set_recording(bool on) { recording_ = on; }
  void clear_timeline() {
    events_.clear();
    dropped_ = 0;
  }
  uint64_t dropped_events() const { return dropped_; }
  // Peaks restart from what is live now (e.g. to measure one training step); the timeline is kept.
  void reset_peaks();
  // The peaks as they stand, to measure something aside (an evaluation between steps) and then
  // put them back, so a step's figures stay the step's.
  struct Peaks {
    CategoryBytes peak{}, at_peak{};
    uint64_t total = 0;
    Phase phase;
  };
  Peaks peaks() const { return {peak_, at_peak_, peak_total_, phase_at_peak_}; }
  void restore_peaks(const Peaks& p) {
    peak_ = p.peak;
    at_peak_ = p.at_peak;
    peak_total_ = p.total;
    phase_at_peak_ = p.phase;
  }
  // The clock origin of t_ms.
  std::chrono::steady_clock::time_point start() const { return start_; }

 private:
  void record(Category c, int64_t delta, const std::string& tag);

  CategoryBytes current_{}, peak_{}, at_peak_{};
  uint64_t total_ = 0, peak_total_ = 0;
  Phase phase_, phase_at_peak_;
  std::vector<LedgerEvent> events_;
  size_t max_events_;
  bool recording_ = true;
  uint64_t dropped_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace shardlab
