#include "memory/estimate.hpp"

namespace shardlab {

uint64_t Estimate::model_state_total() const {
  uint64_t s = 0;
  for (uint64_t b : model_states) s += b;
  return s;
}

HostEstimate host_estimate(const Ledger& ledger, const CategoryBytes& host_states) {
  return {host_states, ledger.peak_by_category(Tier::host), ledger.composition_at_peak(Tier::host),
          ledger.peak_total(Tier::host)};
}

Estimate estimate_from_ledger(const Ledger& ledger, const CategoryBytes& states, const CategoryBytes& host_states) {
  Estimate e;
  e.model_states = states;
  e.peak_by_category = ledger.peak_by_category();
  e.at_peak = ledger.composition_at_peak();
  e.peak = ledger.peak_total();
  e.peak_phase = ledger.phase_at_peak();
  e.host = host_estimate(ledger, host_states);
  CategoryBytes live = states, host_live = host_states;
  for (const LedgerEvent& ev : ledger.timeline()) {
    CategoryBytes& l = ev.tier == Tier::device ? live : host_live;
    int k = static_cast<int>(ev.category);
    l[k] = static_cast<uint64_t>(static_cast<int64_t>(l[k]) + ev.delta);
    e.timeline.push_back({ev.phase, live, host_live});
  }
  return e;
}

}  // namespace shardlab
