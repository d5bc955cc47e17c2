// gemm_bench.hpp — sgemm throughput of a Backend on the shapes a GPT-2 step uses, every transpose
// combination: the machine's own GFLOP/s ceiling that step benchmarks compare against.
#pragma once
#include <cstdio>

#include "memory/pool.hpp"

namespace shardlab {

struct GemmBenchConfig {
  int64_t dim = 768;      // model width C; shapes are (B*T, C) x (C, 3C) and friends
  int64_t tokens = 1024;  // B*T rows
  double seconds = 0.3;   // minimum time per shape (three windows of a third each; the best counts)
};

// Prints one line per (shape, transposes) and returns the mean GFLOP/s over all lines.
double run_gemm_benchmark(Pool& pool, const GemmBenchConfig& cfg, std::FILE* out);

}  // namespace shardlab
