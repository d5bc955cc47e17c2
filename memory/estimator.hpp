// estimator.hpp — the analytic memory model: from plain descriptions of the units (parameter
// counts and activation sizes) and of the strategy (name, world, dtypes, micro-batch, prefetch,
// buckets, accumulation), predict each category of bytes a rank holds, the peak of a training
// step, and when in the step the peak happens.
//
// The prediction replays, symbolically, the allocations a step makes in the order it makes them
// (forward unit by unit, loss, backward unit by unit, gradient norm, optimizer), so activations,
// gathered units, in-flight reductions and workspaces are in it, not only model states. Model
// states reproduce ZeRO's formulas; `zero_model_states` gives the formulas themselves.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "memory/ledger.hpp"
#include "src/core/dtype.hpp"

namespace shardlab {

// One unit, for a given micro-batch (B sequences of T tokens). Sizes in f32 elements.
struct UnitMemDesc {
  std::string name;
  int64_t params = 0;         // real parameters
  int64_t out_elems = 0;      // forward output
  int64_t saved_elems = 0;    // kept from forward for backward
  int64_t backward_workspace_elems = 0;  // scratch alive during its backward
  std::vector<size_t> borrows;  // units whose parameters it also computes with (tied weights)
};

struct EstimateConfig {
  std::string strategy = "ddp";  // dp | ddp | zero1 | zero2 | zero3
  int world = 1;
  int rank = 0;                  // dp: rank 0 differs from the others
  int64_t positions = 0;         // B * T of one micro-batch on this rank
  int64_t vocab = 0;
  int64_t accum = 1;
  DType param_dtype = DType::f32, reduce_dtype = DType::f32;
  std::string optimizer = "adamw";  // adamw (2 states) | sgd (1)
  double bucket_mb = 25;
  int prefetch = 1;
  int max_gathered = 0;          // 0 = prefetch + 2
  bool reshard_after_forward = true;
};

// One point of the predicted step: after an allocation or a free, what is live, and the phase.
struct EstimatePoint {
  std::string phase;
  CategoryBytes live{};
};

struct Estimate {
  CategoryBytes model_states{};   // persistent: parameters, gradients, master weights, optimizer
  CategoryBytes peak_by_category{};  // each category's own peak over the step
  CategoryBytes at_peak{};        // composition when the total peaks
  uint64_t peak = 0;              // total at the peak
  std::string peak_phase;         // e.g. "backward head"
  std::vector<EstimatePoint> timeline;  // the step, allocation by allocation
  uint64_t model_state_total() const;
};

Estimate estimate_step(const std::vector<UnitMemDesc>& units, const EstimateConfig& cfg);

// ZeRO's model-state formulas (paper, section 5): bytes per rank for Psi parameters, K bytes of
// optimizer state per parameter, 2-byte parameters and gradients: DDP (2+2+K)Psi, ZeRO-1
// 4Psi + K Psi/N, ZeRO-2 2Psi + (2+K)Psi/N, ZeRO-3 (4+K)Psi/N.
double zero_model_states(const std::string& strategy, double psi, int world, double k = 12);

}  // namespace shardlab
