// layout.cpp — ParallelLayout's rules (layout.hpp). Each one lives here once: the Trainer checks a
// run with them, and the prediction, profile and plan through the Trainer they build.
#include "shard/layout.hpp"

#include <algorithm>
#include <numeric>

#include <fmt/ranges.h>

#include "src/core/check.hpp"
#include "src/model/family.hpp"

namespace shardlab {

void ParallelLayout::validate_pipeline(const ModelSpec& spec, int64_t micro_batches) const {
  const PipelineConfig& pc = pipeline;
  const int pp = dims.pp;
  require_pp_schedule(pc.schedule, pp, pc.virtual_stages, micro_batches);
  const std::vector<UnitLayout> layout = family_of(spec).layout(spec);
  const int units = static_cast<int>(layout.size()), chunks = pp * pc.virtual_stages;
  const std::string model = fmt::format("{} units ({} .. {})", units, layout.front().name, layout.back().name);
  SHARD_REQUIRE(chunks <= units, "--pp {} x --pp-virtual {} = {} stages, but the model has {}: every stage needs at "
                "least one", pp, pc.virtual_stages, chunks, model);
  if (pc.split.empty()) return;
  const std::string given = fmt::format("{}", fmt::join(pc.split, ","));
  SHARD_REQUIRE(static_cast<int>(pc.split.size()) == chunks,
                "--pp-split {} gives {} count{}; --pp {} x --pp-virtual {} needs {} (one per chunk)", given,
                pc.split.size(), pc.split.size() == 1 ? "" : "s", pp, pc.virtual_stages, chunks);
  SHARD_REQUIRE(std::all_of(pc.split.begin(), pc.split.end(), [](int c) { return c >= 1; }),
                "--pp-split {}: every chunk needs at least one unit", given);
  const int64_t sum = std::accumulate(pc.split.begin(), pc.split.end(), int64_t{0});
  SHARD_REQUIRE(sum == units, "--pp-split {} sums to {} units, but the model has {} ({} .. {})", given, sum, units,
                layout.front().name, layout.back().name);
}

ParallelDims ParallelLayout::dims_under(StrategyKind k) const {
  ParallelDims d = dims;
  if (zero_stage(k) == 0) {  // one replica group: the whole data-parallel group
    d.dp_shard = dims.is_resolved() ? dims.dp_replicate * dims.dp_shard : 0;  // ep stays its own axis
    d.dp_replicate = dims.is_resolved() ? 1 : 0;
  }
  return d;
}

void ParallelLayout::check_strategy(const StrategyConfig& s) const {
  SHARD_REQUIRE(dims.dp_shard >= 0 && dims.dp_shard <= (1 << 20) && dims.dp_replicate >= 0 &&
                    dims.dp_replicate <= (1 << 20),
                "--dp-shard {} --dp-replicate {}: expected 0 (what the world leaves) or a group size", dims.dp_shard,
                dims.dp_replicate);
  SHARD_REQUIRE(s.kind != StrategyKind::dp || dims.pp == 1,
                "--pp {} with --strategy dp: the single-master baseline keeps the whole model on rank 0; use ddp or "
                "zero1-3 with pipeline parallelism",
                dims.pp);
  SHARD_REQUIRE(s.kind != StrategyKind::dp || dims.cp == 1,
                "--cp {} with --strategy dp: the single-master baseline keeps the whole model on rank 0; use ddp or "
                "zero1-3 with context parallelism",
                dims.cp);
  SHARD_REQUIRE(s.kind != StrategyKind::dp || dims.tp == 1,
                "--tp {} with --strategy dp: the single-master baseline keeps the whole model on rank 0; use ddp or "
                "zero1-3 with tensor parallelism",
                dims.tp);
  SHARD_REQUIRE(s.kind != StrategyKind::dp || dims.ep == 1,
                "--ep {} with --strategy dp: the single-master baseline keeps the whole model on rank 0; use ddp or "
                "zero1-3 with expert parallelism",
                dims.ep);
  SHARD_REQUIRE(!dims.hybrid() || zero_stage(s.kind) > 0,
                "--dp-shard {} (--shard-group) with --strategy {}: only zero1, zero2 and zero3 shard state; {} "
                "replicates it over every data-parallel rank",
                dims.dp_shard, strategy_name(s.kind), strategy_name(s.kind));
  SHARD_REQUIRE(ranks_per_node >= 0 && ranks_per_node <= (1 << 20),
                "--ranks-per-node {}: expected 0 (one node) or a count of ranks", ranks_per_node);
  SHARD_REQUIRE(!s.zeropp.hierarchical() || ranks_per_node > 0,
                "ZeRO++'s {} works node by node: give --ranks-per-node (how many consecutive ranks share a node)",
                s.zeropp.label());
}

void ParallelLayout::validate(const ModelSpec& spec, const StrategyConfig& strategy, int64_t batch,
                              int64_t micro_batches, int world) const {
  check_strategy(strategy);
  const ParallelDims d = dims.resolved(world);
  const int dp = d.dp();
  SHARD_REQUIRE(ranks_per_node == 0 || world % ranks_per_node == 0,
                "--ranks-per-node {} does not divide the world of {} ranks into nodes", ranks_per_node, world);
  SHARD_REQUIRE(batch % (static_cast<int64_t>(dp) * micro_batches) == 0,
                "--batch {} is not divisible by {} data-parallel ranks x --accum {}: every rank needs whole "
                "micro-batches",
                batch, dp, micro_batches);
  // A mixture of experts: expert parallelism splits the experts over data-parallel ranks
  // (parallel/ep.hpp); tensor parallelism replicates them in its group; context parallelism
  // composes as it is (routing is per token; the statistics add up over dp x cp as the gradients
  // do); pipeline stages pass the balancing statistics on behind their messages (executor.cpp).
  // Not yet: the zero-bubble split backward, whose W pass holds operands by their blocks while
  // blocks/moe.cpp's expert slices start where the routing puts them (the meta backend's balanced
  // routing would predict other copies).
  SHARD_REQUIRE(!spec.moe.enabled() || d.pp == 1 || !pipeline.schedule->splits_backward,
                "{} is a mixture of experts: --pp {} with --pp-schedule {} is not written yet (experts run "
                "pipelined under gpipe, 1f1b and interleaved-1f1b)", spec.name, d.pp, pipeline.schedule.name());
  if (d.ep > 1) family_of(spec).layout(spec, tp(0), ep(0));  // the experts against --ep (the family's checks)
  SHARD_REQUIRE(!sequence_parallel || d.tp > 1,
                "--sequence-parallel splits activations over the tensor-parallel group: it needs --tp 2 or more");
  if (d.cp > 1) {
    check_cp_seq(spec.seq, d.cp, cp.balance);
    SHARD_REQUIRE(spec.attention == AttentionKernel::flash,
                  "--cp {} with --attention {}: context parallelism merges the pieces' attention through the fused "
                  "kernel's log-sum-exp; use --attention flash",
                  d.cp, attention_kernel_name(spec.attention));
  }
  if (sequence_parallel) {
    const int64_t rows = batch / dp / micro_batches * (spec.seq / d.cp);
    SHARD_REQUIRE(rows % d.tp == 0,
                  "--sequence-parallel: a micro-batch's {} token rows ({} sequences of {}) do not split over --tp {}",
                  rows, batch / dp / micro_batches, spec.seq, d.tp);
  }
  if (d.pp > 1) {
    ParallelLayout{d, pipeline, sequence_parallel, cp, ranks_per_node}.validate_pipeline(spec, micro_batches);
  } else {
    SHARD_REQUIRE(pipeline.virtual_stages == 1 && pipeline.split.empty(),
                  "--pp-virtual {} / --pp-split: pipeline options need --pp 2 or more", pipeline.virtual_stages);
  }
}

}  // namespace shardlab
