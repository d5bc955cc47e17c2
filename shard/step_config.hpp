// step_config.hpp — what one training step needs: the model, the strategy, the optimizer and its
// schedule, accumulation, recomputation and the transport. TrainConfig extends it (trainer.hpp)
// with the run around the steps (data, validation, checkpoints, logs), so the list exists once:
// a prediction (src/train/predict) takes a StepConfig and cannot see, or validate, the rest. It
// lives below the checkpoint room (src/checkpoint records a step's configuration in its manifest).
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
  // The device the step runs on (--device): a prediction's meta backend hands GEMMs the operands it
  // would (on CUDA bf16 parameters, and activations rounded once where two products read them).
  Device device = Device::cpu;
  // Where the model lives: the mesh's degrees, the pipeline and sequence parallelism, as one value
  // (shard/layout.hpp) whose validate() holds every cross-axis rule; the per-rank model
  // (shard/parallel_model.hpp) is built from it.
  ParallelLayout layout;
  // Runs this configuration under strategy k: what only some strategies take (--offload, hybrid
  // sharding) applied as far as k allows (how profile and compare run one set of options each way).
  void use_strategy(StrategyKind k) {
    strategy = strategy.under(k);
    layout.dims = layout.dims_under(k);
  }
  // The strategy's options and its rules against the degrees, before anything is built.
  void validate_strategy() const {
    strategy.validate();
    layout.check_strategy(strategy);
  }
  // "zero3", "zero3 off:params", "zero2 S=2": the label of a row in reports.
  std::string label() const { return strategy.label(layout.dims); }
};

}  // namespace shardlab
