// adamw_rate.hpp — the host optimizer of --offload against the memory bandwidth it can use: what
// bench-adamw prints and plan --calibrate takes as the AdamW rate.
//
// AdamW over f32 buffers reads the parameter, gradient and both moments and writes the parameter
// and both moments: 28 bytes per element, a handful of flops. On the host it should run at the
// memory's speed, so the yardstick is STREAM's triad (a = b + s * c, 24 bytes per element counted
// as STREAM counts them), measured by the same binary, with the same threads, in the same run.
#pragma once
#include <cstdio>

#include "memory/pool.hpp"

namespace shardlab {

struct AdamwBenchConfig {
  int64_t elements = int64_t{1} << 25;  // per array: 128 MiB of f32, past any cache
  int repeats = 10;                     // the best of these is reported (STREAM's convention)
};

struct AdamwBenchResult {
  double triad_gbs = 0, adamw_gbs = 0, adamw_elements_per_s = 0;
};

// Runs on the host tier of `pool` with its backend (the one --offload's update runs on).
AdamwBenchResult run_adamw_benchmark(Pool& pool, const AdamwBenchConfig& cfg, std::FILE* out);

}  // namespace shardlab
