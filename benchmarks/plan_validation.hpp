// plan_validation.hpp — the time model of plan_time.hpp against published runs: each row of
// Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM", SC21), Table 1, predicted with one device's rates and the model's constants fixed
// once, never per row. `shardlab bench-plan-validation`; benchmarks/plan_validation.sh runs it.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "src/plan/plan.hpp"
#include "src/plan/plan_time.hpp"

namespace shardlab {

// One row of Table 1: GPT, seq 2048, vocabulary 51,200, full recomputation, mixed precision, plain
// data parallelism, 8 A100 80GB per node (Selene); interleaved where a virtual count is given.
struct PublishedRun {
  const char* name;
  int64_t hidden, layers, heads;
  int tp, pp, virtual_stages, gpus;
  int64_t global_batch, micro_batch;
  double published_tflops;  // achieved TFLOP/s per GPU, recomputation included (eq. 3)
};
const std::vector<PublishedRun>& narayanan2021_table1();

// The model and layout a row describes, as Megatron ran it in 2021: no flash attention, the
// data-parallel all-reduce after the pipeline flush (overlap 0), scatter-gather p2p.
ModelSpec published_model(const PublishedRun& row);
TimeLayout published_layout(const PublishedRun& row);

struct ValidationRow {
  PublishedRun run;
  TimePrediction predicted;
  double error = 0;  // (predicted - published) / published
};
struct ValidationResult {
  std::vector<ValidationRow> rows;
  double mean_abs_error = 0, worst_abs_error = 0;
};

ValidationResult run_plan_validation(const DeviceRates& rates, const Achievable& achievable, std::FILE* out);
std::string plan_validation_json(const DeviceRates& rates, const Achievable& achievable, const ValidationResult& r);

// The free search (`--search`): for each row's model, GPU count and global batch, `plan` on 80 GiB
// devices (a100-80gb's memory) with the row's assumptions (no flash attention, the data-parallel traffic not overlapped,
// bf16), once with the published layout pinned (its time and whether it fits this runtime's memory)
// and once free; the rows with their top configuration, the speed-up and the search's cost.
struct SearchRow {
  PublishedRun run;
  PlanResult published, found;  // the pinned one (one entry) and the free search
};
// Each row's published layout priced from its own step instead of the model (`--ledger`): every
// pipeline stage's meta step on the CUDA target with its cost ledger, priced by the device model
// of src/backend/price.hpp on the a100-80gb preset (src/train/price_layout.hpp), the schedule's
// simulated bubble added. The run as this runtime would run it: naive attention (the rows predate
// fused attention), bf16 parameters and saved activations, full recomputation, DDP.
struct LedgerRow {
  PublishedRun run;
  double step_s = 0, tflops = 0, error = 0;
  std::string top_op;  // the slowest stage's costliest operation
  double top_share = 0;
  double seconds = 0;  // the pricing's own time on this machine
};
std::vector<LedgerRow> run_ledger_validation(std::FILE* out);

std::vector<SearchRow> run_plan_search(const DeviceRates& rates, const Achievable& achievable, std::FILE* out);
PlanConfig published_plan(const PublishedRun& row, const DeviceRates& rates, const Achievable& achievable);

}  // namespace shardlab
