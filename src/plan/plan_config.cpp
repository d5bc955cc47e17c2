// plan_config.cpp — the plan's configuration and its entries: the rates' description, the pins'
// checks, and what an entry is (its run's TrainConfig, its time model's layout, its labels).
#include <fmt/format.h>

#include "src/core/units.hpp"
#include "src/plan/plan.hpp"

namespace shardlab {

std::string PlanRates::describe() const {
  return fmt::format("rates ({}):\n{}{}  data-parallel overlap {:.0f}% of the overlappable traffic; attention {}\n",
                     source, device.describe(), achievable.describe(), 100 * dp_overlap,
                     flash_attention ? "flash (no s x s scores in memory)" : "with its s x s scores in memory");
}

void PlanConfig::validate() const {
  train.spec.validate();
  SHARD_REQUIRE(world >= 1 && world <= (1 << 20), "--world {}: expected 1 to 2^20 ranks", world);
  SHARD_REQUIRE(ranks_per_node >= 1, "--ranks-per-node {}: expected at least one rank", ranks_per_node);
  SHARD_REQUIRE(world % ranks_per_node == 0 || world < ranks_per_node,
                "--ranks-per-node {} does not divide --world {}: every node needs the same ranks", ranks_per_node, world);
  SHARD_REQUIRE(device_memory > 0, "plan needs --device-memory (each rank's device budget) with --calibrate");
  SHARD_REQUIRE(global_batch >= 0, "--global-batch {}: expected a positive number of sequences", global_batch);
  const DeviceRates& d = rates.device;
  for (const Rate* r : {&d.flops, &d.hbm, &d.intra, &d.inter, &d.host, &d.host_adamw})
    SHARD_REQUIRE(r->value > 0, "plan rates must be positive: {} ({})", r->value, r->from);
  SHARD_REQUIRE(rates.dp_overlap >= 0 && rates.dp_overlap <= 1, "--overlap {}: expected 0 to 1", rates.dp_overlap);
  const PlanPins& p = pins;
  for (auto [flag, v] : {std::pair{"--tp", p.tp}, std::pair{"--pp", p.pp}, std::pair{"--pp-virtual", p.pp_virtual},
                         std::pair{"--dp-shard", p.dp_shard}})
    SHARD_REQUIRE(!v || *v >= 1, "{} {}: expected at least 1 (or leave it out to search it)", flag, v.value_or(0));
  SHARD_REQUIRE(!p.micro_batch || *p.micro_batch >= 1, "--micro-batch {}: expected at least 1", p.micro_batch.value_or(0));
  SHARD_REQUIRE(!p.strategy || *p.strategy != StrategyKind::dp,
                "plan --strategy dp: the single-master baseline is not a layout plan ranks (ddp or zero1-3)");
  SHARD_REQUIRE(!p.sequence_parallel || !*p.sequence_parallel || !p.tp || *p.tp > 1,
                "--sequence-parallel needs --tp 2 or more (it splits the tensor-parallel regions' activations)");
  if (p.schedule && p.pp_virtual) require_pp_schedule(*p.schedule, p.pp.value_or(1), *p.pp_virtual, 0);
  SHARD_REQUIRE(!p.offload || !p.strategy || offload_for(*p.strategy, *p.offload) == *p.offload,
                "--offload {} does not apply to --strategy {} (optimizer: zero1-3; params: zero3)",
                offload_name(p.offload.value_or(Offload::none)), strategy_name(p.strategy.value_or(StrategyKind::ddp)));
}

TrainConfig PlanEntry::config(const PlanConfig& p) const {
  TrainConfig t = p.train;
  t.strategy = strategy;
  t.layout = layout;
  t.checkpointing = checkpointing;
  t.accum = accum;
  t.batch = micro_batch * accum * layout.dims.dp();
  // One unit prefetched, fixed: a step stopped at the budget and a whole one predict the same step
  // (train's --prefetch auto may prefetch less where that budget is tighter still).
  if (t.strategy.prefetch == kPrefetchAuto) t.strategy.prefetch = kPrefetchDepth;
  return t;
}

TimeLayout PlanEntry::time_layout(const PlanConfig& p) const {
  TimeLayout l;
  l.tp = layout.dims.tp;
  l.pp = layout.dims.pp;
  l.virtual_stages = layout.pipeline.virtual_stages;
  l.dp = layout.dims.dp();
  l.dp_shard = layout.dims.dp_shard;
  l.cp = layout.dims.cp;
  l.ep = layout.dims.ep;
  l.cp_method = layout.cp.method;
  l.schedule = layout.pipeline.schedule;
  l.micro_batch = micro_batch;
  l.global_batch = p.batch();
  l.recompute = checkpointing;
  l.sequence_parallel = layout.sequence_parallel;
  l.flash_attention = p.rates.flash_attention;
  l.dp_strategy = strategy.kind;
  l.offload = strategy.offload;
  l.zeropp = strategy.zeropp;
  l.dp_overlap = p.rates.dp_overlap;
  const MixedPrecisionPolicy& pr = p.train.strategy.precision;
  l.act_bytes = l.param_bytes = static_cast<int>(dtype_size(pr.param_dtype));
  l.grad_bytes = static_cast<int>(dtype_size(pr.reduce_dtype));
  return l;
}

std::string PlanEntry::peak_text() const {
  if (!predicted) return "-";
  return layout.dims.pp > 1 ? fmt::format("{} (s{})", format_bytes(double(peak)), peak_stage)
                              : format_bytes(double(peak));
}

std::string PlanEntry::label() const {
  const ParallelDims& d = layout.dims;
  std::string s = fmt::format("tp {}{} pp {}", d.tp, layout.sequence_parallel ? "+sp" : "", d.pp);
  if (d.pp > 1) s += fmt::format(" {}", layout.pipeline.schedule->label(layout.pipeline.virtual_stages));
  if (d.cp > 1) s += fmt::format(" cp {}{}", d.cp, layout.cp.method == CpMethod::ring ? " ring" : "");
  if (d.ep > 1) s += fmt::format(" ep {}", d.ep);
  s += fmt::format(" dp {} {}", d.dp(), strategy_name(strategy.kind));
  if (d.dp_replicate > 1) s += fmt::format(" S={}", d.dp_shard);
  if (strategy.offload != Offload::none) s += fmt::format(" off:{}", offload_name(strategy.offload));
  if (strategy.zeropp.any()) s += fmt::format(" {}", strategy.zeropp.label());
  return s;
}

}  // namespace shardlab
