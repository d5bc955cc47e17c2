#include "src/train/price_layout.hpp"

#include <algorithm>

#include "shard/pipeline/schedule.hpp"
#include "src/comm/mesh.hpp"
#include "src/train/predict.hpp"

namespace shardlab {
namespace {

void set_links(DeviceModel& d, const ParallelDims& dims, int rank) {
  d.links.clear();
  const MeshCoord me = mesh_coord(dims, rank);
  for (const CommAxisRow& row : kCommAxes) {
    const bool across = d.ranks_per_node > 0 && (row.axis == CommAxis::dp_shard_cross ||
                                                 group_crosses_nodes(dims, me, row.axis, d.ranks_per_node));
    d.links[row.name] = across ? d.inter.value : d.link.value;
  }
}

}  // namespace

bool offload_unpriced(const StepConfig& step) { return step.strategy.offload != Offload::none; }

double LayoutPrice::bubble_s(const StagePrice& s) const {
  return bubble_share > 0 && bubble_share < 1 ? s.price.total * bubble_share / (1 - bubble_share) : 0;
}

const StagePrice& LayoutPrice::slowest() const {
  SHARD_CHECK(!stages.empty(), "a layout priced without stages");
  const StagePrice* worst = &stages.front();
  for (const StagePrice& s : stages)
    if (step_s(s) > step_s(*worst)) worst = &s;
  return *worst;
}

LayoutPrice price_layout(const StepConfig& step, int world, int64_t micro_batch, Device target, DeviceModel d) {
  SHARD_REQUIRE(!offload_unpriced(step), "--offload {}: the host's part of the step (its optimizer, the copies over "
                "the host link) is not priced yet; the step time is predicted without --offload",
                offload_name(step.strategy.offload));
  LayoutPrice p;
  const ParallelDims dims = step.layout.dims.resolved(world);
  for (int k = 0; k < dims.pp; ++k) {
    MeshCoord first;
    first.pp = k;
    const int rank = mesh_rank(dims, first);
    set_links(d, dims, rank);
    p.stages.push_back({k, rank, price_step(step_costs(step, world, rank, micro_batch, target), d)});
  }
  if (dims.pp > 1) {
    const PipelineConfig& pc = step.layout.pipeline;
    const PipeSchedule s = build_schedule(pc.schedule, dims.pp, pc.virtual_stages, static_cast<int>(step.accum));
    p.bubble_share = simulated_bubble(s, 1.0, 2.0);
  }
  return p;
}

}  // namespace shardlab
