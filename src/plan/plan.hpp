// plan.hpp — `shardlab plan`: the layouts of a model on N devices — tensor parallelism (tp), pipeline
// parallelism (pp, virtual stages, schedule), data parallelism (strategy, shard group x replicas),
// sequence parallelism, activation checkpointing, offload, micro-batch and accumulation for the
// global batch — each with its predicted step time (the model of src/plan/plan_time.hpp, one
// place) and, for the ones the search reaches, its peak memory per tier predicted exactly (the
// real step on the meta backend with a simulated mesh, every distinct pipeline stage), ranked
// fastest first; optionally the top K measured on real ranks.
//
// The search (a branch and bound on the time model):
//   1. enumerate every layout the flags leave free (a flag given pins its dimension): tp within a
//      node that the model can be split over (the trainer's rule, tp_split_problem: the heads, the
//      KV heads and the MLP width), pp dividing world / tp with at least pp x v units, v in
//      {2, 3, 4, 6, 8} for interleaved-1f1b, the data-parallel degree dp = world / (tp pp)
//      sharded over the whole of it or over a node's share (hybrid), ddp/zero1-3, offload where the
//      strategy has it, none/attention/blocks, power-of-two micro-batches dividing B / dp; context
//      parallelism cp dividing world / (tp pp) up to 32 with pieces of at least 128 positions (the
//      fused attention only; dp = world / (tp pp cp); --cp-method as given, allgather by default);
//   2. predict each one's time (microseconds each) and sort;
//   3. walk them fastest first and settle whether each fits: a lower bound of a stage's peak over
//      the budget rules it out without a prediction (its model states, the activations of the
//      micro-batches in flight at its first backward, a gathered block: plan.cpp's stage_bound),
//      as does a smaller micro-batch of the same layout that did not fit; the rest are predicted,
//      each stage's peak checked against its bound. The walk ends when `keep` fit.
//      Once `keep_not_fitting` layouts did not fit, no report shows another's peak: a step then
//      stops at its first allocation past the budget, and a layout at its first stage past it.
// So the top `keep` are exactly those an exhaustive search would rank first (the test holds the
// search to the exhaustive one), and a 405B search over 16,384 GPUs predicts a few hundred steps.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "src/core/device_peaks.hpp"
#include "src/plan/plan_time.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {

// The rates of the time model and where they came from.
struct PlanRates {
  DeviceRates device = device_rates(kH100_80GB);
  Achievable achievable;
  double dp_overlap = 0.9;      // share of overlappable data-parallel traffic hidden
  bool flash_attention = true;  // the attention as this runtime runs it (--attention; flash by default)
  std::string source = "h100-80gb preset";
  std::string describe() const;  // every rate and share, one per line
};

// The dimensions a flag pins; unset = searched.
struct PlanPins {
  std::optional<int> tp, pp, pp_virtual, dp_shard, cp, ep;
  std::optional<PpSchedule> schedule;
  std::optional<bool> sequence_parallel;
  std::optional<StrategyKind> strategy;
  std::optional<Checkpointing> checkpointing;
  std::optional<Offload> offload;
  std::optional<int64_t> micro_batch;
};

struct PlanConfig {
  TrainConfig train;         // model, dtypes, optimizer, cp's method (the layout and the batch are searched)
  int world = 8;
  int ranks_per_node = 8;
  uint64_t device_memory = 0;  // per rank; required
  std::string budget_note;     // where a preset's budget comes from (printed after it), "" when given
  uint64_t host_memory = 0;    // per rank; 0 = unlimited
  int64_t global_batch = 0;    // sequences per step; 0 = 8 per rank
  PlanPins pins;
  // The ZeRO++ levers a zero3 layout whose shard group spans nodes is tried with as well (beside
  // plain zero3): hpZ, which changes no number, unless --secondary-shard none; the lossy ones
  // (qwZ's int8 weights, qgZ's quantized gradients) only when asked (--zeropp, --quantize-*).
  ZeroPP zeropp{0, 0, true, 256};
  // Offload ranks as if its step took this much longer, unless --offload pins it: a layout that
  // moves state to the host is chosen where nothing else fits, or where it is clearly faster.
  double offload_rank_factor = 1.1;
  PlanRates rates;
  size_t keep = 15;            // configurations that fit to find (the walk's end)
  size_t keep_not_fitting = 200;  // the fastest that do not fit to list, with their peaks (enough for any report)
  bool exhaustive = false;     // predict every candidate's memory (no pruning): the test's oracle
  void validate() const;
  int64_t batch() const { return global_batch > 0 ? global_batch : 8 * int64_t{world}; }
};

struct PlanEntry {
  StrategyConfig strategy;   // kind, offload (the dtypes of the command line's)
  ParallelLayout layout;     // degrees (tp, pp, dp_shard, dp_replicate), sequence parallelism, schedule, virtual stages
  Checkpointing checkpointing = Checkpointing::none;
  int64_t micro_batch = 0, accum = 0;
  bool fits = false;
  bool predicted = false;    // its memory was predicted (else ruled out by a bound, `why` says which)
  std::string why;           // when it does not fit: which tier, by how much
  uint64_t peak = 0, host_peak = 0;
  int peak_stage = 0;        // the pipeline stage whose device peak is the largest
  TimePrediction time;
  double step_ms() const { return time.split.total * 1e3; }
  std::optional<double> measured_step_ms;
  std::optional<double> ledger_step_ms;  // --ledger-top: the step priced from its cost ledger
  std::string ledger_top_op;             // and the operation that takes most of it (or why not priced)
  std::optional<uint64_t> measured_peak;
  TrainConfig config(const PlanConfig& p) const;  // the run this entry describes
  TimeLayout time_layout(const PlanConfig& p) const;  // what the time model sees
  std::string label() const;  // "tp 8 pp 4 1f1b dp 32 zero1"
  std::string peak_text() const;  // "61.19 GiB (s0)" (the stage under --pp), "-" when not predicted
};

struct PlanResult {
  std::vector<PlanEntry> entries;  // fitting ones first (fastest first), then the rest walked (fastest first)
  size_t candidates = 0;           // layouts enumerated (time predicted)
  size_t walked = 0;               // reached by the walk
  size_t predictions = 0;          // memory predictions (steps on the meta backend, one per stage)
  size_t stopped_at_budget = 0;    // of them, steps stopped at their first allocation past a budget
  size_t ruled_by_bound = 0, ruled_by_micro_batch = 0, not_runnable = 0;
  double seconds = 0;
};

PlanResult make_plan(const PlanConfig& cfg, std::FILE* progress = nullptr);
void print_plan(const PlanConfig& cfg, const PlanResult& plan, size_t show, std::FILE* out);
std::string mb_text(const PlanEntry& e);  // "4 x 8": micro-batch x accumulation, as the tables show it

}  // namespace shardlab
