#include "src/train/predict.hpp"

#include "src/comm/sim_comm.hpp"
#include "src/model/blocks/attention.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {

namespace {

// The run of one step of `step` with `micro_batch` sequences per rank and micro-step: only the
// StepConfig part of a TrainConfig is set (data, validation, checkpoints, logs and samples are not
// part of a step, and their options must not be validated here).
TrainConfig step_config(const StepConfig& step, int world, int rank, int64_t micro_batch, bool timeline) {
  SHARD_REQUIRE(world >= 1 && rank >= 0 && rank < world, "predict: rank {} of a world of {}", rank, world);
  SHARD_REQUIRE(micro_batch >= 1 && micro_batch <= (int64_t{1} << 24), "--micro-batch {}: expected 1 to 16777216",
                micro_batch);
  TrainConfig c;
  static_cast<StepConfig&>(c) = step;
  c.batch = micro_batch * c.accum * c.layout.dims.resolved(world).dp();  // tensor-parallel ranks share a batch
  c.steps = 1;
  c.record_step = timeline;
  return c;
}

// Token values are never read on the meta backend: zeros stand in for the data.
std::shared_ptr<TokenStream> stand_in(int64_t tokens) {
  return std::make_shared<TokenStream>(zero_stream(tokens, "(prediction: no data)"));
}

// The step; with budgets, nullopt at its first allocation past one (predict.hpp).
std::optional<Estimate> run_step(const StepConfig& step, int world, int rank, int64_t micro_batch, bool timeline,
                                 const PoolConfig* budgets) {
  if (budgets && step.strategy.prefetch == kPrefetchAuto && step.strategy.kind == StrategyKind::zero3 &&
      budgets->budget > 0) {  // --prefetch auto: the deepest step that fits is the prediction itself
    StepConfig s = step;
    for (int d = kPrefetchDepth;; --d) {
      s.strategy.prefetch = d;
      std::optional<Estimate> e = run_step(s, world, rank, micro_batch, timeline, budgets);
      if (e || d == 0) return e;
    }
  }
  TrainConfig c = step_config(step, world, rank, micro_batch, timeline);
  if (budgets) c.strategy.prefetch = auto_prefetch(step, world, rank, micro_batch, *budgets);  // no prediction left
  auto be = make_meta_backend({}, nullptr, c.device == Device::cuda);  // as the step's device computes
  Pool pool(*be);  // no budget while the model states are set up: the step's peak starts after
  auto comm = make_sim_communicator(rank, world, pool, sim_transport(c.comm));
  Trainer t(*be, pool, *comm, c, stand_in(c.spec.seq + 1));
  if (budgets) {
    // The step's peak starts from what is live now; over a budget already, it cannot fit.
    auto over = [](uint64_t live, uint64_t budget) { return budget > 0 && live > budget; };
    if (over(pool.ledger().current_total(), budgets->budget) ||
        over(pool.ledger().current_total(Tier::host), budgets->host_budget))
      return std::nullopt;
    pool.set_budgets(*budgets);
  }
  try {
    t.step(0);
  } catch (const OutOfMemory&) {
    if (!budgets) throw;
    return std::nullopt;
  }
  return t.measured_step();
}

}  // namespace

int auto_prefetch(const StepConfig& step, int world, int rank, int64_t micro_batch, PoolConfig budgets) {
  if (step.strategy.prefetch != kPrefetchAuto) return step.strategy.prefetch;
  if (step.strategy.kind != StrategyKind::zero3 || budgets.budget == 0) return kPrefetchDepth;  // nothing to decide
  StepConfig s = step;
  for (int d = kPrefetchDepth; d > 0; --d) {
    s.strategy.prefetch = d;
    if (run_step(s, world, rank, micro_batch, false, &budgets)) return d;
  }
  return 0;
}

Estimate predict_step(const StepConfig& step, int world, int rank, int64_t micro_batch, bool timeline) {
  return *run_step(step, world, rank, micro_batch, timeline, nullptr);
}

std::optional<Estimate> predict_step_within(const StepConfig& step, int world, int rank, int64_t micro_batch,
                                            PoolConfig budgets) {
  return run_step(step, world, rank, micro_batch, false, &budgets);
}

std::vector<GemmDesc> step_gemms(const StepConfig& step, int world, int rank, int64_t micro_batch) {
  TrainConfig c = step_config(step, world, rank, micro_batch, false);
  std::vector<GemmDesc> gemms;
  auto be = make_meta_backend([&gemms](const GemmDesc& d) { gemms.push_back(d); });
  Pool pool(*be);
  auto comm = make_sim_communicator(rank, world, pool, sim_transport(c.comm));
  Trainer t(*be, pool, *comm, c, stand_in(c.spec.seq + 1));
  t.step(0);
  return gemms;
}

CostLedger step_costs(const StepConfig& step, int world, int rank, int64_t micro_batch, Device target) {
  SHARD_REQUIRE(target == Device::cpu || target == Device::cuda, "step costs: a step runs on cpu or cuda, not {}",
                device_name(target));
  TrainConfig c = step_config(step, world, rank, micro_batch, false);
  blocks::check_attention_kernel(c.spec, target, false);  // as a run there would, whatever this binary has
  CostLedger ledger(target);
  auto be = make_meta_backend({}, &ledger);
  Pool pool(*be);
  auto comm = make_sim_communicator(rank, world, pool, sim_transport(c.comm));
  comm->stats().cost = &ledger;  // its collectives, and its sub-communicators'
  Trainer t(*be, pool, *comm, c, stand_in(c.spec.seq + 1));
  ledger.clear();  // set-up (initialisation, the first gathers' buffers) is not the step
  t.step(0);
  CostLedger step_only = ledger;  // what the Trainer's teardown would add is not the step either
  return step_only;
}

Estimate predict_eval(const StepConfig& step, int world, int rank, int64_t micro_batch) {
  TrainConfig c = step_config(step, world, rank, micro_batch, false);
  // A stand-in stream whose second half is one validation sequence, repeated to fill the batch.
  const int64_t half = c.spec.seq + 1;
  c.val_fraction = 0.5;
  c.val_batches = 1;
  auto be = make_meta_backend({}, nullptr, c.device == Device::cuda);  // as the step's device computes
  Pool pool(*be);
  auto comm = make_sim_communicator(rank, world, pool, sim_transport(c.comm));
  Trainer t(*be, pool, *comm, c, stand_in(2 * half));
  t.evaluate();
  return t.measured_eval();
}

}  // namespace shardlab
