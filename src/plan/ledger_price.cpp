#include "src/plan/ledger_price.hpp"

#include "src/train/price_layout.hpp"

namespace shardlab {

void price_from_ledgers(const PlanConfig& pc, std::vector<PlanEntry>& entries, size_t top, DeviceModel device) {
  device.ranks_per_node = pc.ranks_per_node;
  size_t priced = 0;
  for (PlanEntry& e : entries) {
    if (priced == top || !e.fits) break;  // the fitting entries come first
    ++priced;
    const TrainConfig config = e.config(pc);
    if (offload_unpriced(config)) {
      e.ledger_top_op = "not priced: --offload's host work is not in the ledger yet";
      continue;
    }
    const LayoutPrice p = price_layout(config, pc.world, e.micro_batch, Device::cuda, device);
    e.ledger_step_ms = p.step_s() * 1e3;
    const StagePrice& slowest = p.slowest();
    if (!slowest.price.ops.empty()) e.ledger_top_op = slowest.price.ops.front().name;
  }
}

}  // namespace shardlab
