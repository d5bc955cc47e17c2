// compare.hpp — `shardlab compare`: the same model, data and seed trained under each strategy,
// then one table: loss agreement, speed, peak memory per rank by category, communication per rank
// per step against theory, and the savings against DDP and DP.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "memory/category.hpp"
#include "memory/report.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {

struct CompareConfig {
  TrainConfig train;                 // strategy.kind is ignored: each of `strategies` runs in turn
  std::vector<StrategyKind> strategies = all_strategies();
  uint64_t budget = 0;               // per-rank pool budget for every run (0 = none)
  uint64_t host_budget = 0;          // per-rank host-tier budget (--host-memory; 0 = none)
  double tolerance = 1e-4;           // max relative loss deviation from the first strategy
};

// One axis's traffic in a run's last step, rank 0's (under --pp the first stage's), and what the
// theory says it is: tp, tp_micro_step_bus_bytes per micro-step plus the gradient norm's float; pp,
// the activations and their gradients, the tied embedding's gradient, the loss and the norm; cp,
// cp::micro_step_bus_bytes per micro-step. A new axis is a row of count_axes and of the table's
// notes, not fields here.
struct AxisTraffic {
  CommAxis axis = CommAxis::tp;
  int degree = 1;
  double bytes = 0, theory = 0;
};

struct StrategyResult {
  StrategyKind kind = StrategyKind::ddp;
  std::string name;                  // strategy_label(kind, offload): "zero3", "zero3 off:params"
  bool oom = false;                  // did not fit the budget
  std::string error;                 // the out-of-memory message, when oom
  std::vector<float> losses;
  std::vector<int64_t> val_steps;    // the steps validated (--val-every, and the last), 1-based
  std::vector<float> val_losses;     // the validation loss at each of them
  double max_rel_dev = 0;            // against the first strategy, per step
  bool quantized = false;            // ZeRO++'s qwZ or qgZ: held to kQuantizedTolerance at least
  double ms_per_step = 0, tokens_per_s = 0;  // median step, first step excluded
  double comm_bytes = 0;             // rank 0, bus bytes, last step
  double comm_theory = 0;            // what the strategy's pattern predicts, same units
  // Hybrid sharding (--dp-shard S < the data-parallel ranks): the last step's bus bytes on the
  // mesh's dp_shard axis (within the shard group) and dp_replicate axis (across the replica
  // groups), and the theory's for each (0 without hybrid sharding).
  int dp_shard = 0;
  double comm_intra = 0, comm_inter = 0, theory_intra = 0, theory_inter = 0;
  // The model-parallel axes the run used (degree > 1), in the order their theories were added: rank
  // 0's bus bytes on each in the last step beside the theory's (compare.cpp's count_axes).
  std::vector<AxisTraffic> axes;
  const AxisTraffic* traffic_on(CommAxis a) const;  // nullptr: the run did not use that axis
  // By link (--ranks-per-node R; 0: one node): rank 0's bus bytes in the last step on each axis,
  // and their sum over the axes whose groups stay inside a node and over those that cross one.
  int ranks_per_node = 0;
  std::array<double, kNumCommAxes> axis_bytes{};
  double node_intra = 0, node_inter = 0;
  // Peak over the run of each category and of the total, for rank 0 and for the largest other rank;
  // and each category's bytes at the moment of the total's peak (they add up to it): rank 0's, and
  // that of the other rank whose total peak is the largest.
  std::array<uint64_t, kNumCategories> peak0{}, peak_other{};
  std::array<uint64_t, kNumCategories> at_peak0{}, at_peak_other{};
  uint64_t total0 = 0, total_other = 0;
  uint64_t host0 = 0, host_other = 0;  // the host tier's peak (--offload)
  MemoryRow memory;                  // rank 0: predicted and measured, the last step recorded
  std::vector<StepStats> steps;      // rank 0's, each step (val_loss where validated): the run report
};

struct CompareResult {
  std::vector<StrategyResult> runs;
  bool agree = true;
  std::string disagreement;  // which strategy, step and losses, when !agree
};

// ZeRO++'s quantized rows change the arithmetic by design: they agree when their last loss (and
// last validation loss) is within 1% of the first row's (ZeRO++'s bar for qwZ and qgZ), or the
// given tolerance if looser; every step's deviation still shows in max_rel_dev.
inline constexpr double kQuantizedTolerance = 1e-2;
// Fills max_rel_dev of every run and agree/disagreement against the first run that fit.
void check_agreement(CompareResult& r, double tolerance);

// Collective over the group's ranks (each run opens its own communicator). Prints the tables on
// rank 0 to `out`.
CompareResult run_compare(Backend& be, const ProcessGroup& group, const CompareConfig& cfg, std::FILE* out);
std::string compare_json(const CompareConfig& cfg, const CompareResult& r, int world);

}  // namespace shardlab
