// estimate.hpp — Estimate: the memory of one training step of one rank, by category, as a Ledger
// recorded it: the model states held between steps, each category's peak, the composition and
// phase at the step's peak, and the step's allocations in order.
//
// Predictions are made by running the real step on the meta backend (src/backend/meta), which
// allocates and computes nothing, through the sim communicator: the runner, the strategies and the
// transport staging exist once, and the prediction is whatever they allocate (src/train/predict).
// A measurement fills the same struct from a real run's ledger, so the two compare field by field.
#pragma once
#include <cstdint>
#include <vector>

#include "memory/ledger.hpp"

namespace shardlab {

// One point of the step: after an allocation or a free, what is live, and the phase.
struct EstimatePoint {
  Phase phase;
  CategoryBytes live{};       // device tier
  CategoryBytes host_live{};  // host tier
};

// The host tier's part of an Estimate (what --offload moves there, and its staging).
struct HostEstimate {
  CategoryBytes model_states{};
  CategoryBytes peak_by_category{};
  CategoryBytes at_peak{};  // composition when the host total peaks
  uint64_t peak = 0;
  bool operator==(const HostEstimate&) const = default;
};

struct Estimate {
  CategoryBytes model_states{};      // persistent: parameters, gradients, master weights, optimizer
  CategoryBytes peak_by_category{};  // each category's own peak over the step
  CategoryBytes at_peak{};           // composition when the total peaks
  uint64_t peak = 0;                 // total at the peak
  Phase peak_phase;                  // e.g. backward of the head
  std::vector<EstimatePoint> timeline;  // the step, allocation by allocation (when recorded)
  HostEstimate host;                    // the same for the host tier (the fields above are the device's)
  uint64_t model_state_total() const;   // device tier
};

// The step a ledger holds: its peaks were reset at the step's start, `states` (device) and
// `host_states` were live then, and its timeline (if it was recording) holds the step's events only.
Estimate estimate_from_ledger(const Ledger& ledger, const CategoryBytes& states, const CategoryBytes& host_states);
// The host tier's part of it alone (no timeline).
HostEstimate host_estimate(const Ledger& ledger, const CategoryBytes& host_states);

}  // namespace shardlab
