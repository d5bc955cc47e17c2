// price_layout.hpp — a layout's step priced from the step itself: each pipeline stage's first rank
// runs the real step on the meta backend with a cost ledger (predict.hpp's step_costs), the device
// model prices it (src/backend/price.hpp), and under --pp the schedule's own simulation adds the
// bubble the stages leave each other (the sim communicator's sends and receives never wait, so a
// stage's ledger holds its work, not its waits).
#pragma once
#include <vector>

#include "src/backend/price.hpp"
#include "shard/step_config.hpp"

namespace shardlab {

struct StagePrice {
  int stage = 0, rank = 0;  // the stage and its first world rank
  StepPrice price;
};

struct LayoutPrice {
  std::vector<StagePrice> stages;  // every pipeline stage (one at --pp 1)
  // The schedule's idle share of a step averaged over its ranks (build_schedule's simulation with a
  // backward twice a forward; 0 at --pp 1), and what it adds to a stage's priced step: busy / (1 -
  // share) - busy.
  double bubble_share = 0;
  double bubble_s(const StagePrice& s) const;
  double step_s(const StagePrice& s) const { return s.price.total + bubble_s(s); }
  double step_s() const { return step_s(slowest()); }
  const StagePrice& slowest() const;  // the stage whose step takes longest (the first of equals)
};

// Offload's host tier (its optimizer on the CPU, the copies over the host link) is not in the
// ledger yet: price_layout refuses such a step (InputError) rather than price it as device work.
bool offload_unpriced(const StepConfig& step);

// `d`'s links set per axis as seen from each stage's rank: an axis whose group crosses a node of
// d.ranks_per_node ranks at d.inter, the others at d.link.
LayoutPrice price_layout(const StepConfig& step, int world, int64_t micro_batch, Device target, DeviceModel d);

}  // namespace shardlab
