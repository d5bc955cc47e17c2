// predict.hpp — the memory of one training step of one rank, predicted without training.
//
// The prediction is the real step: the Trainer, the runner, the strategy and the optimizer run on
// the meta backend (which allocates and computes nothing) with the sim communicator playing rank
// `rank` of `world` (holding MPI's staging buffers as MPI would). So there is one implementation of
// each strategy, and what is predicted is what that implementation allocates, in order. The model
// is never materialised: gpt2-xl at world 64 is predicted in milliseconds.
//
// Independent oracles live in the tests: ZeRO's model-state formulas, Korthikanti et al.'s
// activation memory, and measured = predicted against real runs over MPI.
#pragma once
#include <optional>
#include <vector>

#include "memory/estimate.hpp"
#include "memory/pool.hpp"
#include "src/backend/backend.hpp"
#include "src/backend/cost.hpp"
#include "shard/step_config.hpp"

namespace shardlab {

// Rank `rank` of `world` running a step of `step` with micro-batches of `micro_batch` sequences (a
// TrainConfig passes as its StepConfig: its batch, data and the rest are not part of a step).
// With `timeline`, the step's allocations are kept in the result.
Estimate predict_step(const StepConfig& step, int world, int rank, int64_t micro_batch, bool timeline = true);
// The same step within budgets (each tier's; 0 = no limit): nullopt as soon as an allocation of the
// step takes a tier past its budget, so a step that does not fit costs only up to that point. The
// budgets apply from the step's start, as its peak does (construction may pass them transiently).
std::optional<Estimate> predict_step_within(const StepConfig& step, int world, int rank, int64_t micro_batch,
                                            PoolConfig budgets);
// --prefetch auto for zero3: the deepest prefetch, at most kPrefetchDepth, whose step this rank's
// prediction fits within `budgets` (0 when none does: a run that fits with --prefetch 0 fits with
// auto); kPrefetchDepth without a device budget, and for the other strategies (which gather
// nothing ahead). A fixed --prefetch stays. The Trainer calls it with its pool's budgets and takes
// the smallest over the ranks, so every rank issues its gathers in the same order; a prediction
// within budgets resolves it with those.
int auto_prefetch(const StepConfig& step, int world, int rank, int64_t micro_batch, PoolConfig budgets);
// The same for an evaluation pass (validation: forward only, units gathered and freed as in a
// training forward): its peak and composition; model_states as for the step.
Estimate predict_eval(const StepConfig& step, int world, int rank, int64_t micro_batch);
// Every GEMM the model issues in that step, in order (the meta backend's record of them; the
// products a CPU backend runs inside its own kernels, attention's, are not among them).
std::vector<GemmDesc> step_gemms(const StepConfig& step, int world, int rank, int64_t micro_batch);
// What that step costs on `target` (cpu or cuda): every operation, collective, event and host wait
// it issues after set-up, in order (src/backend/cost.hpp), for the device model to price
// (src/backend/price.hpp). The same step as predict_step: on a cuda target its GEMMs take the bf16
// parameters a GPU hands them, which allocates nothing more.
CostLedger step_costs(const StepConfig& step, int world, int rank, int64_t micro_batch, Device target);

}  // namespace shardlab
