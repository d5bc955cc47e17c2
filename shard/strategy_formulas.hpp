// strategy_formulas.hpp — each strategy's textbook figures, in one table: ZeRO's model states per
// rank, and the bus bytes one step moves per rank, by link and by whether compute can hide them.
// compare prints these as its theory columns, plan's time model divides them by link bandwidths,
// and the estimator's tests hold the prediction (src/train/predict) against the model states.
// The prediction itself never uses them: it runs the real step.
#pragma once
#include <cstdint>

#include "shard/strategy.hpp"

namespace shardlab {

// ZeRO's model-state formulas (paper, section 5): bytes per rank for Psi parameters, K bytes of
// optimizer state per parameter, 2-byte parameters and gradients: DDP (and DP's rank 0)
// (2+2+K)Psi, ZeRO-1 4Psi + K Psi/N, ZeRO-2 2Psi + (2+K)Psi/N, ZeRO-3 (4+K)Psi/N.
double zero_model_states(StrategyKind k, double psi, int world, double optimizer_bytes = 12);

struct TrafficInputs {
  double params = 0;    // Psi
  int world = 1;        // N
  int dp_shard = 0;  // S: zero1-3's state sharded within groups of S ranks, replicated over the rest (0 = the world)
  DType param_dtype = DType::f32, reduce_dtype = DType::f32;  // what parameters and gradients move in
  int64_t batch = 0, seq = 0, vocab = 0;  // dp only: the global batch's logits (f32) and their gradient
};

// One step of one rank. Each collective moves a volume (bytes of the whole model's parameters p or
// gradients g, or of the logits) and costs the bus factor of its link: (S-1)/S within a shard
// group, (G-1)/G of a 1/S shard across the G = N/S groups, (N-1)/N over the world, 1 for
// broadcast and reduce (src/comm/communicator.cpp's table). The volumes:
//
//   strategy  group, overlapped    group, exposed   across (hybrid)   world          rooted
//   ddp       -                    -                -                 2g all-reduce  -
//   zero1     g reduce-scatter     p all-gather     2g all-reduce     -              -
//   zero2     g, every micro-step  p all-gather     2g, every micro   -              -
//   zero3     g + 2p (gather for forward and backward, reduce-scatter), every micro-step; across 2g
//   dp        -                    -                -                 2 x logits     p broadcast + g reduce
//
// Accumulation: zero2 and zero3 repeat their overlapped and across parts every micro-step
// (per_micro); compare's theory counts one micro-step, plan's time model all of them.
struct StepTraffic {
  StrategyKind kind = StrategyKind::ddp;
  int S = 1, G = 1, N = 1;  // shard group, groups, world
  double p = 0, g = 0;      // bytes of the whole model's parameters and gradients as they move
  double group_overlapped = 0, group_exposed = 0, across = 0, world = 0, rooted = 0;  // volumes (above)
  bool per_micro = false;

  double fs() const { return (S - 1.0) / S; }
  double fg() const { double groups = double(N) / S; return (groups - 1) / groups; }
  double fn() const { return (N - 1.0) / N; }
  // Bus bytes per rank of each part.
  double group_overlapped_bus() const { return fs() * group_overlapped; }
  double group_exposed_bus() const { return fs() * group_exposed; }
  double across_bus() const { return fg() * across / S; }
  double world_bus() const { return fn() * world; }
  // Within the shard group and across groups (compare's hybrid columns), and everything (its theory).
  double intra_bus() const { return fs() * (group_overlapped + group_exposed); }
  double total_bus() const { return N == 1 ? 0 : intra_bus() + across_bus() + world_bus() + rooted; }
  // --offload: bytes over the host link per step: each reduced gradient shard to the host (once, or
  // every micro-step past zero1), the updated parameter shard back, and with `params` each
  // parameter shard to the device for its two gathers every micro-step.
  double host_link(Offload off, double accum) const;
};

StepTraffic step_traffic(StrategyKind k, const TrafficInputs& in);

// Muon under ZeRO (optim/muon.hpp): every unit holding matrices has its momentum-updated gradient
// all-gathered and the owners' results reduce-scattered, f32, over the shard group of S ranks:
// 2 (S-1)/S x 4 padded_u bus bytes per rank and step (padded_u: the unit rounded up to S). DDP and
// DP hold every matrix whole: 0.
double muon_exchange_bytes(StrategyKind k, const std::vector<UnitLayout>& units, int S);

// Muon under tensor parallelism of degree T: each split matrix a rank iterates (all of them under
// ddp and dp; under ZeRO those it owns in its shard group of S, as the optimizer assigns owners) has
// its T parts all-gathered in f32: (T-1)/T x 4 x the whole matrix per matrix. `units` are this
// rank's tensor-parallel parts; `rank` its place in the shard group.
double muon_tp_bytes(StrategyKind k, const std::vector<UnitLayout>& units, int S, int rank, int T);

}  // namespace shardlab
