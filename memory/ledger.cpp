#include "memory/ledger.hpp"

#include <algorithm>

#include "src/core/check.hpp"

namespace shardlab {

Ledger::Ledger(size_t max_events) : max_events_(max_events), start_(std::chrono::steady_clock::now()) {}

void Ledger::on_alloc(Category c, uint64_t bytes, const std::string& tag) {
  int i = static_cast<int>(c);
  current_[i] += bytes;
  total_ += bytes;
  peak_[i] = std::max(peak_[i], current_[i]);
  if (total_ > peak_total_) {
    peak_total_ = total_;
    at_peak_ = current_;
    phase_at_peak_ = phase_;
  }
  record(c, static_cast<int64_t>(bytes), tag);
}

void Ledger::on_free(Category c, uint64_t bytes, const std::string& tag) {
  int i = static_cast<int>(c);
  SHARD_CHECK(current_[i] >= bytes, "ledger: freeing {} bytes of {} '{}' but only {} are live", bytes,
              category_name(c), tag, current_[i]);
  current_[i] -= bytes;
  total_ -= bytes;
  record(c, -static_cast<int64_t>(bytes), tag);
}

void Ledger::reset_peaks() {
  peak_ = current_;
  peak_total_ = total_;
  at_peak_ = current_;
  phase_at_peak_ = phase_;
}

void Ledger::record(Category c, int64_t delta, const std::string& tag) {
  if (!recording_) return;
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  events_.push_back({t, c, delta, total_, tag, phase_});
}

}  // namespace shardlab

namespace shardlab {

std::string phase_label(const Phase& p, const std::vector<std::string>& unit_names) {
  auto unit = [&] {
    return p.unit >= 0 && static_cast<size_t>(p.unit) < unit_names.size() ? unit_names[static_cast<size_t>(p.unit)]
                                                                          : "unit " + std::to_string(p.unit);
  };
  switch (p.kind) {
    case PhaseKind::idle: return "";
    case PhaseKind::begin_step: return "begin step";
    case PhaseKind::forward: return "forward " + unit();
    case PhaseKind::loss: return "loss";
    case PhaseKind::backward: return "backward " + unit();
    case PhaseKind::optimizer: return "optimizer step";
  }
  return "";
}

}  // namespace shardlab
