// plan_bound.hpp — what plan knows of a layout's stages without predicting them: which units each
// holds, which must be predicted, and a lower bound of each one's device peak that rules a layout
// out when it passes the budget (plan.hpp, step 3). Each prediction is checked against its bound.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "src/model/unit.hpp"
#include "src/plan/plan.hpp"

namespace shardlab {

// What a stage of a (tp, pp, v, schedule) layout holds: each stage's parameters on one rank and its
// chunks (first unit, count; model order), and the stages whose memory must be predicted (one per
// distinct set of units: a stage with the same units as an earlier one keeps no more micro-batches
// in flight, so never more memory; but under a split backward, which makes later stages owe more
// weight passes, every stage).
struct StageFacts {
  std::vector<double> params;
  std::vector<std::vector<std::pair<int, int>>> chunks;
  std::vector<std::vector<int>> chunk_ids;  // each stage's chunks' global indices
  std::vector<int> distinct;
  std::vector<double> unit_params;  // each unit's on one rank
};

class PlanBounds {
 public:
  explicit PlanBounds(const PlanConfig& c) : c_(c) {}

  // A lower bound of a stage's device peak, in parts (stage()).
  struct Bound {
    double states = 0, activations = 0, gathered = 0, compute_copy = 0;
    double staged = 0;     // a second moment's: ZeRO-1's reductions in flight beside the states (stage())
    double accumulated = 0;  // a third's: pipelined ZeRO-2/3's full gradients (and ZeRO-3's gathered units)
    uint64_t total() const {
      return static_cast<uint64_t>(
          (states + std::max({activations + gathered + compute_copy, staged, accumulated})) * 0.999);
    }
  };

  const StageFacts& stage_facts(const PlanEntry& e);
  // Stage k's bound. The moment: the end of the last forward the stage runs before its first
  // backward (the schedule's order; one micro-batch without a pipeline). Live then, beside the
  // model states (all set up before the step and live through it): each micro-batch in flight's
  // activations on the stage (f32; the saved ones in --activation-dtype), that is every unit's
  // output (a chunk's last one only for the chunk just run: the others were sent on), what the
  // units saved for their backward (Unit::saved_elems_at_least) and each chunk's received input;
  // and under ZeRO-3 the parameters of the unit just run when it is a block, gathered whole for
  // its compute (a head's may be tied); with parameters below f32, that unit's f32 compute copy (shard/mixed_precision.hpp: made for its
  // forward, released after it). A second moment, under ZeRO-1 over MPI with gradients reduced below f32 and no offload: the
  // stage's last backward, when every unit's gradient reduce-scatter has been issued and none is
  // waited for before the optimizer step (shard/zero.cpp), each staged in f32 by the transport
  // (src/comm/mpi_comm.cpp): 4 bytes a parameter sent and 4 / S received (S the shard group), beside
  // the model states; the activations are not counted there. A third, under a pipeline without a
  // split backward whose every unit ran a backward before the last micro-batch (two micro-batches
  // or more; interleaved, twice pp), ZeRO-2 or 3: just before the stage's first
  // backward of the last micro-batch every unit of the stage holds its full gradient (accumulated
  // over the step, reduce-scattered after the unit's last micro-batch) and under ZeRO-3 its gathered
  // parameters (kept from the first forward to the last backward; strategy.hpp, pipelined()).
  Bound stage(const PlanEntry& e, int k);
  // The largest stage's: what rules a layout out without a prediction.
  Bound layout(const PlanEntry& e);

 private:
  double state_bytes(const PlanEntry& e) const;
  const std::vector<std::unique_ptr<Unit>>& rank_units(const ParallelDims& d, bool sp);
  const std::vector<int>& in_flight(const PlanEntry& e, int k);

  const PlanConfig& c_;
  std::map<std::tuple<int, int, int, int, std::string>, StageFacts> stages_;
  std::map<std::tuple<int, bool, int>, std::vector<std::unique_ptr<Unit>>> units_;
  std::map<std::tuple<const char*, int, int, int, int>, std::vector<int>> flights_;  // by the registry's names
};

}  // namespace shardlab
