// step_config.hpp — what one training step needs: the model, the strategy, the optimizer and its
// schedule, accumulation, recomputation and the transport. TrainConfig extends it (trainer.hpp)
// with the run around the steps (data, validation, checkpoints, logs), so the list exists once:
// a prediction (src/train/predict) takes a StepConfig and cannot see, or validate, the rest.
#pragma once
#include <cstdint>

#include "optim/optimizer.hpp"
#include "shard/strategy.hpp"  // StrategyConfig; with it the model spec, Checkpointing and CommKind
#include "shard/layout.hpp"  // ParallelLayout, PipelineConfig

namespace shardlab {

struct StepConfig {
  ModelSpec spec;
  StrategyConfig strategy;
  int64_t accum = 1;  // micro-steps per step
  uint64_t seed = 1337;
  OptimConfig optim;
  LrSchedule schedule;
  float grad_clip = 1.f;         // 0 = off
  CommKind comm = CommKind::mpi;  // the transport (--comm, resolved): predictions hold what it holds
  Checkpointing checkpointing = Checkpointing::none;  // --activation-checkpointing
  // --sequence-parallel: with tensor parallelism (strategy.dims.tp > 1), the activations between
  // its regions split along the token rows too (src/model/tp.hpp).
  bool sequence_parallel = false;
  PipelineConfig pipeline;
  // The placement beyond the strategy, as one value (shard/layout.hpp): its rules and the per-rank
  // model (shard/parallel_model.hpp) take it.
  ParallelLayout layout() const { return {strategy.dims, pipeline, sequence_parallel}; }
};

}  // namespace shardlab
