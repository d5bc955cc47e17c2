// train_bench.hpp — training-step throughput: tokens/s and achieved GFLOP/s (llm.c's count,
// 6N + 6·L·C·T FLOPs per token) beside the sgemm GFLOP/s this machine reaches on the same
// model's matrix shapes, measured in the same run.
#pragma once
#include <cstdio>

#include "memory/pool.hpp"
#include "src/model/spec.hpp"

namespace shardlab {

struct TrainBenchConfig {
  ModelSpec spec;
  int64_t batch = 8;
  int steps = 10;   // timed
  int warmup = 2;   // untimed
};

struct TrainBenchResult {
  double ms_per_step = 0, tokens_per_s = 0, gflops = 0, sgemm_gflops = 0;
};

TrainBenchResult run_train_benchmark(Pool& pool, const TrainBenchConfig& cfg, std::FILE* out);

}  // namespace shardlab
