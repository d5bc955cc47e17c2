#include "src/train/predict.hpp"

#include "src/comm/sim_comm.hpp"

namespace shardlab {

Estimate predict_step(const TrainConfig& cfg, int world, int rank, int64_t micro_batch, bool timeline) {
  SHARD_REQUIRE(world >= 1 && rank >= 0 && rank < world, "predict: rank {} of a world of {}", rank, world);
  SHARD_REQUIRE(micro_batch >= 1 && micro_batch <= (int64_t{1} << 24), "--micro-batch {}: expected 1 to 16777216",
                micro_batch);
  // Only what shapes a training step's memory is taken from the run (an allowlist: data, validation,
  // checkpoints, logs and samples are not part of a step, and their options must not be validated here).
  TrainConfig c;
  c.spec = cfg.spec;
  c.strategy = cfg.strategy;
  c.optim = cfg.optim;
  c.schedule = cfg.schedule;
  c.accum = cfg.accum;
  c.grad_clip = cfg.grad_clip;
  c.seed = cfg.seed;
  c.batch = micro_batch * c.accum * world;
  c.steps = 1;
  c.record_step = timeline;
  // Token values are never read on the meta backend: one sequence of zeros stands in for the data.
  auto tokens = std::make_shared<TokenStream>();
  tokens->tokens.assign(static_cast<size_t>(c.spec.seq + 1), 0);
  tokens->source = "(prediction: no data)";
  auto be = make_meta_backend();
  Pool pool(*be);  // no budget: the prediction says how much; callers compare it with theirs
  auto comm = make_sim_communicator(rank, world, pool);
  Trainer t(*be, pool, *comm, c, std::move(tokens));
  t.step(0);
  return t.measured_step();
}

}  // namespace shardlab
