#include "memory/ledger.hpp"

#include <algorithm>

#include "src/core/check.hpp"

namespace shardlab {

Ledger::Ledger(size_t max_events) : max_events_(max_events), start_(std::chrono::steady_clock::now()) {}

void Ledger::on_alloc(Category c, uint64_t bytes, const std::string& tag, Tier tier) {
  TierState& s = tiers_[static_cast<int>(tier)];
  int i = static_cast<int>(c);
  s.current[i] += bytes;
  s.total += bytes;
  s.peak[i] = std::max(s.peak[i], s.current[i]);
  if (s.total > s.peak_total) {
    s.peak_total = s.total;
    s.at_peak = s.current;
    s.phase_at_peak = phase_;
  }
  record(c, static_cast<int64_t>(bytes), tag, tier);
}

void Ledger::on_free(Category c, uint64_t bytes, const std::string& tag, Tier tier) {
  TierState& s = tiers_[static_cast<int>(tier)];
  int i = static_cast<int>(c);
  SHARD_CHECK(s.current[i] >= bytes, "ledger: freeing {} bytes of {} '{}' on the {} tier but only {} are live", bytes,
              category_name(c), tag, tier_name(tier), s.current[i]);
  s.current[i] -= bytes;
  s.total -= bytes;
  record(c, -static_cast<int64_t>(bytes), tag, tier);
}

void Ledger::reset_peaks() {
  for (TierState& s : tiers_) {
    s.peak = s.current;
    s.peak_total = s.total;
    s.at_peak = s.current;
    s.phase_at_peak = phase_;
  }
}

Ledger::Peaks Ledger::peaks() const {
  Peaks p;
  for (int t = 0; t < kNumTiers; ++t) p[t] = {tiers_[t].peak, tiers_[t].at_peak, tiers_[t].peak_total, tiers_[t].phase_at_peak};
  return p;
}

void Ledger::restore_peaks(const Peaks& p) {
  for (int t = 0; t < kNumTiers; ++t) {
    tiers_[t].peak = p[t].peak;
    tiers_[t].at_peak = p[t].at_peak;
    tiers_[t].peak_total = p[t].total;
    tiers_[t].phase_at_peak = p[t].phase;
  }
}

void Ledger::record(Category c, int64_t delta, const std::string& tag, Tier tier) {
  if (!recording_) return;
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  events_.push_back({t, c, delta, of(tier).total, tag, phase_, tier});
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
    case PhaseKind::weight: return "weight grads " + unit();
  }
  return "";
}

}  // namespace shardlab
