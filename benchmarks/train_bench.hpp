// train_bench.hpp — training-step throughput: tokens/s and achieved GFLOP/s (llm.c's count,
// 6N + 6·L·C·T FLOPs per token) beside the sgemm GFLOP/s this machine reaches on the same
// model's matrix shapes, measured in the same run. With a memory lever (--activation-checkpointing,
// --offload) the same configuration without it runs too, its steps interleaved with the lever's,
// and both are printed with the ratio: what the lever costs. On several ranks (`--nproc N`) the
// strategy runs over the real communicator, the batch is the global one, and rank 0 prints.
// Under --pp each stage's measured bubble (its idle share of the pipelined part of the step) is
// printed beside the schedule's theory.
#pragma once
#include <cstdio>

#include "memory/pool.hpp"
#include "shard/strategy.hpp"
#include "src/comm/communicator.hpp"
#include "src/model/unit.hpp"
#include "shard/step_config.hpp"

namespace shardlab {

struct TrainBenchConfig {
  ModelSpec spec;
  int64_t batch = 8;
  int steps = 10;   // timed
  int warmup = 2;   // untimed
  StrategyConfig strategy;  // one rank of it (sim communicator) or every rank of `world`
  Checkpointing checkpointing = Checkpointing::none;
  int64_t accum = 1;               // micro-steps per step: the pipeline's micro-batches under --pp
  ParallelLayout layout;           // the mesh's degrees, sequence parallelism, the pipeline
  double peak_tflops = 0;  // the device's dense peak, for MFU (0 = not printed)
  OptimConfig optim;       // --optimizer (Muon's update time is printed beside the step)
  bool levers() const { return checkpointing != Checkpointing::none || strategy.offload != Offload::none; }
};

struct TrainBenchResult {
  double ms_per_step = 0, tokens_per_s = 0, gflops = 0, sgemm_gflops = 0, sgemm_picked_gflops = 0;
  double mfu = 0;  // gflops / peak (0 without a peak)
  double baseline_ms_per_step = 0;  // without the levers (0 when none was asked for)
  double update_ms = 0;             // --optimizer muon: rank 0's update per step (median)
  // Several ranks: the last step's bus bytes on the tensor-parallel axis and on the data-parallel
  // ones (world included), and their time as estimated from an isolated all-reduce (not measured).
  struct Comm {
    double tp_bytes = 0, dp_bytes = 0, tp_est_ms = 0, dp_est_ms = 0;
  } comm;
  // Under --pp, per pipeline stage (the first data-parallel rank's of each): the median over the
  // timed steps of its idle share of the pipelined part, and the schedule's theory.
  std::vector<double> bubble;
  double bubble_theory = 0;
};

// world: the ranks' communicator when there are several (no levers then); nullptr = one rank.
TrainBenchResult run_train_benchmark(Pool& pool, const TrainBenchConfig& cfg, std::FILE* out,
                                     Communicator* world = nullptr);

}  // namespace shardlab
