// ledger.hpp — the Ledger: current and peak bytes per category and per memory tier (device,
// host), the composition at each tier's peak, and a timeline of allocation events for reports
// (memory over a step, Chrome traces). One Ledger serves both tiers of a rank's Pool, so a phase,
// a reset of the peaks or a cleared timeline applies to both at once.
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
  uint64_t total_after; // all categories of this event's tier, after this event
  std::string tag;
  Phase phase;          // what the runtime was doing (set_phase)
  Tier tier = Tier::device;
};

using CategoryBytes = std::array<uint64_t, kNumCategories>;

class Ledger {
 public:
  explicit Ledger(size_t max_events = 1'000'000);

  void on_alloc(Category c, uint64_t bytes, const std::string& tag, Tier tier = Tier::device);
  void on_free(Category c, uint64_t bytes, const std::string& tag, Tier tier = Tier::device);
  void set_phase(Phase phase) { phase_ = phase; }
  const Phase& phase() const { return phase_; }

  // Every query is of one tier, the device's unless named.
  uint64_t current(Category c, Tier t = Tier::device) const { return of(t).current[static_cast<int>(c)]; }
  uint64_t peak(Category c, Tier t = Tier::device) const { return of(t).peak[static_cast<int>(c)]; }
  uint64_t current_total(Tier t = Tier::device) const { return of(t).total; }
  uint64_t peak_total(Tier t = Tier::device) const { return of(t).peak_total; }
  const CategoryBytes& current_by_category(Tier t = Tier::device) const { return of(t).current; }
  const CategoryBytes& peak_by_category(Tier t = Tier::device) const { return of(t).peak; }
  // What was live, by category, at the moment the tier's total peaked, and what was happening then.
  const CategoryBytes& composition_at_peak(Tier t = Tier::device) const { return of(t).at_peak; }
  const Phase& phase_at_peak(Tier t = Tier::device) const { return of(t).phase_at_peak; }

  const std::vector<LedgerEvent>& timeline() const { return events_; }
  // The timeline is kept only while recording (on by default); clear_timeline() starts it afresh.
  void set_recording(bool on) { recording_ = on; }
  void clear_timeline() {
    events_.clear();
    dropped_ = 0;
  }
  uint64_t dropped_events() const { return dropped_; }
  // Peaks (of both tiers) restart from what is live now (e.g. to measure one training step); the
  // timeline is kept.
  void reset_peaks();
  // The peaks as they stand, to measure something aside (an evaluation between steps) and then
  // put them back, so a step's figures stay the step's.
  struct TierPeaks {
    CategoryBytes peak{}, at_peak{};
    uint64_t total = 0;
    Phase phase;
  };
  using Peaks = std::array<TierPeaks, kNumTiers>;
  Peaks peaks() const;
  void restore_peaks(const Peaks& p);
  // The clock origin of t_ms.
  std::chrono::steady_clock::time_point start() const { return start_; }

 private:
  struct TierState {
    CategoryBytes current{}, peak{}, at_peak{};
    uint64_t total = 0, peak_total = 0;
    Phase phase_at_peak;
  };
  const TierState& of(Tier t) const { return tiers_[static_cast<int>(t)]; }
  void record(Category c, int64_t delta, const std::string& tag, Tier tier);

  std::array<TierState, kNumTiers> tiers_{};
  Phase phase_;
  std::vector<LedgerEvent> events_;
  size_t max_events_;
  bool recording_ = true;
  uint64_t dropped_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace shardlab
