// step_config.hpp — what one training step needs: the model, the strategy, the optimizer and its
// schedule, accumulation, recomputation and the transport. TrainConfig extends it (trainer.hpp)
// with the run around the steps (data, validation, checkpoints, logs), so the list exists once:
// a prediction (src/train/predict) takes a StepConfig and cannot see, or validate, the rest.
#pragma once
#include <cstdint>

#include "optim/optimizer.hpp"
#include "shard/strategy.hpp"  // StrategyConfig; with it the model spec, Checkpointing and CommKind
#include "shard/pipeline/schedule.hpp"

namespace shardlab {

// Pipeline parallelism beyond its degree (strategy.dims.pp): the schedule, the virtual stages per
// rank and the split (shard/pipeline/schedule.hpp). The micro-batches are the accumulation micro-steps.
struct PipelineConfig {
  PpSchedule schedule;     // --pp-schedule (the default unless given)
  int virtual_stages = 1;  // --pp-virtual
  std::vector<int> split;  // --pp-split: units per chunk; empty = balanced by cost
  // bench-train: the stages enter each step's pipelined part together (a barrier on the pipeline
  // group), so a stage's measured bubble is the schedule's and not the skew the previous step's
  // uneven optimizer work leaves between the stages.
  bool align_steps = false;
};

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
};

}  // namespace shardlab
