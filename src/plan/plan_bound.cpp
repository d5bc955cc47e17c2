#include "src/plan/plan_bound.hpp"

#include <algorithm>

#include "shard/pipeline/registry.hpp"
#include "src/model/family.hpp"
#include "src/model/model.hpp"

namespace shardlab {

const StageFacts& PlanBounds::stage_facts(const PlanEntry& e) {
  const ParallelDims& d = e.layout.dims;
  // The schedule places the chunks (zb-v in a V) and decides what a stage holds.
  auto key = std::tuple{d.tp, d.pp, d.ep, e.layout.pipeline.virtual_stages,
                        std::string(e.layout.pipeline.schedule.name())};
  auto it = stages_.find(key);
  if (it != stages_.end()) return it->second;
  StageFacts f;
  const ModelSpec& s = c_.train.spec;
  const std::vector<UnitLayout> units = family_of(s).layout(s, TpConfig{d.tp, 0, false}, EpConfig{d.ep, 0});
  for (const UnitLayout& u : units) f.unit_params.push_back(double(u.numel));
  if (d.pp == 1) {
    f.distinct = {0};
    f.params = {double(num_params(units))};
    f.chunks = {{{0, static_cast<int>(units.size())}}};
    f.chunk_ids = {{0}};
  } else {
    TrainConfig t = e.config(c_);
    const StageSplit split = stage_split(t.spec, t.layout);
    std::vector<std::vector<int>> seen;
    for (int k = 0; k < d.pp; ++k) {
      double params = 0;
      for (int u : split.units_of(k)) params += f.unit_params.at(static_cast<size_t>(u));
      f.params.push_back(params);
      std::vector<int> what;  // its chunks' sizes, and whether it holds the first or the last unit
      f.chunks.emplace_back();
      f.chunk_ids.push_back(split.chunks_of(k));
      for (int ch : split.chunks_of(k)) {
        what.push_back(split.count(ch));
        f.chunks.back().push_back({split.begin(ch), split.count(ch)});
      }
      what.push_back(k == 0);
      what.push_back(k == split.rank_of(split.chunks() - 1));
      // A split backward's later stages owe more weight passes: each stage is its own.
      if (t.layout.pipeline.schedule->splits_backward) what.push_back(k);
      if (std::find(seen.begin(), seen.end(), what) == seen.end()) {
        seen.push_back(what);
        f.distinct.push_back(k);
      }
    }
  }
  return stages_.emplace(key, std::move(f)).first->second;
}

// The device bytes per parameter the strategy keeps between steps (its model states: all of them
// set up before the step and live through it), sharded over S at best.
double PlanBounds::state_bytes(const PlanEntry& e) const {
  const MixedPrecisionPolicy& pr = c_.train.strategy.precision;
  const double S = double(e.layout.dims.dp_shard) * e.layout.dims.cp;  // ZeRO shards over S x cp
  const double p = double(dtype_size(pr.param_dtype));
  const double g = double(std::min(dtype_size(pr.param_dtype), dtype_size(pr.reduce_dtype)));
  const double opt = (pr.param_dtype == DType::f32 ? 0 : 4) +
                     (c_.train.optim.kind == OptimizerKind::adamw ? 8 : 0);
  const Offload off = e.strategy.offload;
  switch (zero_stage(e.strategy.kind)) {
    case 0: return p + g + opt;
    case 1: return p + g + (off == Offload::none ? opt / S : 0);
    case 2: return p + (off == Offload::none ? (g + opt) / S : 0);
    default: return off == Offload::params ? 0 : off == Offload::optimizer ? p / S : (p + g + opt) / S;
  }
}

// The units of a (tp, sequence parallel, ep) rank, for their output sizes.
const std::vector<std::unique_ptr<Unit>>& PlanBounds::rank_units(const ParallelDims& d, bool sp) {
  auto key = std::tuple{d.tp, sp, d.ep};
  auto it = units_.find(key);
  if (it != units_.end()) return it->second;
  const ModelSpec& s = c_.train.spec;
  return units_.emplace(key, family_of(s).make_units(s, TpConfig{d.tp, 0, sp}, EpConfig{d.ep, 0})).first->second;
}

PlanBounds::Bound PlanBounds::stage(const PlanEntry& e, int k) {
  const ParallelDims& d = e.layout.dims;
  const StageFacts& f = stage_facts(e);
  const std::vector<std::unique_ptr<Unit>>& units = rank_units(d, e.layout.sequence_parallel);
  const ModelSpec& s = c_.train.spec;
  const int64_t B = e.micro_batch, T = s.seq / d.cp;
  const size_t ks = static_cast<size_t>(k);
  const std::vector<int>& flights = in_flight(e, k);
  // Each of the stage's chunks: its received input and the outputs and saved tensors of its
  // units, and its last unit's output, in f32 elements. A saved element counts half of one under
  // --activation-dtype bf16, and on a GPU with low-precision parameters, where some are bf16
  // whatever the flag (blocks::save_product_operand): 2 bytes each, still a lower bound.
  const bool gpu_rounds = c_.train.device == Device::cuda && c_.train.strategy.precision.param_dtype != DType::f32;
  const double saved_share = double(gpu_rounds ? 2 : dtype_size(s.activation_dtype)) / sizeof(float);
  // The model's last output (the logits) held until its backward: on such a GPU the loss may write
  // its gradient in bf16 and free the f32 logits (runner.hpp's logits_gradient): 2 bytes each.
  const double head_share = gpu_rounds && d.tp == 1 && s.loss_chunk == 0 ? 0.5 : 1.0;
  const std::vector<std::pair<int, int>>& chunks = f.chunks.at(ks);
  std::vector<double> whole(chunks.size()), last_out(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto [first, count] = chunks[i];
    for (int u = first > 0 ? first - 1 : first; u < first + count; ++u)
      whole[i] += (static_cast<size_t>(u) + 1 == units.size() ? head_share : 1.0) *
                  double(units.at(static_cast<size_t>(u))->out_elems(s, B, T));
    for (int u = first; u < first + count; ++u)
      whole[i] += saved_share *
                  double(units.at(static_cast<size_t>(u))->saved_elems_at_least(s, B, T, e.checkpointing, d.cp > 1));
    last_out[i] = double(units.at(static_cast<size_t>(first + count - 1))->out_elems(s, B, T));
  }
  const std::vector<int>& ids = f.chunk_ids.at(ks);
  auto index = [&](int chunk) { return static_cast<size_t>(std::find(ids.begin(), ids.end(), chunk) - ids.begin()); };
  const int last_chunk = d.pp * e.layout.pipeline.virtual_stages - 1;
  Bound b;
  b.states = f.params.at(ks) * state_bytes(e);
  for (size_t j = 0; j < flights.size(); ++j) {
    const size_t i = index(flights[j]);
    b.activations += whole.at(i) - (j + 1 < flights.size() && flights[j] < last_chunk ? last_out[i] : 0);
  }
  b.activations *= sizeof(float);
  const auto [first, count] = chunks.at(index(flights.back()));
  const Unit& last = *units.at(static_cast<size_t>(first + count - 1));
  if (zero_stage(e.strategy.kind) == 3 && d.dp_shard * d.cp > 1 && last.recomputable())
    b.gathered = f.unit_params.at(static_cast<size_t>(first + count - 1)) *
                 double(dtype_size(c_.train.strategy.precision.param_dtype));
  // Pipelined ZeRO-3 keeps every unit gathered from its first forward to its last backward: every
  // unit of the chunks in flight is gathered then.
  if (zero_stage(e.strategy.kind) == 3 && d.pp > 1 && d.dp_shard * d.cp > 1) {
    double in_flight = 0;
    std::vector<int> seen;
    for (int chunk : flights) {
      if (std::find(seen.begin(), seen.end(), chunk) != seen.end()) continue;
      seen.push_back(chunk);
      const auto [c0, n] = chunks.at(index(chunk));
      for (int u = c0; u < c0 + n; ++u) in_flight += f.unit_params.at(static_cast<size_t>(u));
    }
    b.gathered = std::max(b.gathered, in_flight * double(dtype_size(c_.train.strategy.precision.param_dtype)));
  }
  const MixedPrecisionPolicy& pr = c_.train.strategy.precision;
  if (pr.param_dtype != DType::f32)
    b.compute_copy = sizeof(float) * f.unit_params.at(static_cast<size_t>(first + count - 1));
  const double S = double(d.dp_shard) * d.cp;
  if (zero_stage(e.strategy.kind) == 1 && S > 1 && e.strategy.offload == Offload::none &&
      c_.train.comm == CommKind::mpi && pr.reduce_dtype != DType::f32)
    b.staged = sizeof(float) * (1 + 1 / S) * f.params.at(ks);
  const int zs = zero_stage(e.strategy.kind);
  // Every unit of the stage ran a backward before the last micro-batch's first: with one chunk a
  // stage, any earlier micro-batch's; interleaved, the first round of pp micro-batches through every
  // chunk (its backwards go a chunk at a time, pp micro-batches each).
  const bool all_backed = e.layout.pipeline.virtual_stages == 1 ? e.accum >= 2 : e.accum >= 2 * int64_t{d.pp};
  if (d.pp > 1 && all_backed && zs >= 2 && !e.layout.pipeline.schedule->splits_backward) {
    const double grad = double(std::min(dtype_size(pr.param_dtype), dtype_size(pr.reduce_dtype)));
    b.accumulated = f.params.at(ks) * (grad + (zs == 3 ? double(dtype_size(pr.param_dtype)) : 0.0));
  }
  return b;
}

// The chunks of the micro-batches stage k has in flight at its first backward (the forwards its
// schedule runs before it), in the order run; one without a pipeline.
const std::vector<int>& PlanBounds::in_flight(const PlanEntry& e, int k) {
  const PipelineConfig& p = e.layout.pipeline;
  const int P = e.layout.dims.pp, V = p.virtual_stages, M = static_cast<int>(e.accum);
  auto key = std::tuple{p.schedule.name(), P, V, M, k};
  auto it = flights_.find(key);
  if (it != flights_.end()) return it->second;
  std::vector<int> chunks;
  if (P == 1) {
    chunks = {0};
  } else {
    for (const PipeAction& a : p.schedule->actions(k, P, V, M)) {
      if (a.kind != PipeAction::forward) break;
      chunks.push_back(a.chunk);
    }
  }
  SHARD_CHECK(!chunks.empty(), "plan: stage {} of {} {} (v {}, {} micro-batches) begins with no forward", k, P,
              p.schedule.name(), V, M);
  return flights_.emplace(key, std::move(chunks)).first->second;
}

// The largest stage bound: what rules a layout out without a prediction.
PlanBounds::Bound PlanBounds::layout(const PlanEntry& e) {
  Bound best;
  for (int k = 0; k < e.layout.dims.pp; ++k) {
    const Bound b = stage(e, k);
    if (b.total() > best.total()) best = b;
  }
  return best;
}

}  // namespace shardlab
