// attention_bench.hpp — attention forward + backward alone (`shardlab bench-attention`): the fused
// kernels (and, where the (H, T, T) buffers fit, the naive ones) at each (T, heads, head dim),
// batch 1, multi-head or grouped-query, f32, on one backend with its threads. Per point: the best
// of `repeats` timings of forward and of backward, the GFLOP/s that gives (causal: half of
// 4 T² hd per head forward, 2.5 times that backward), the bytes the pass holds (inputs, outputs,
// saved, workspace) and the growth of the process's peak resident memory (run one point per
// process for that one: benchmarks/compare_attention.sh does, against PyTorch's
// scaled_dot_product_attention).
#pragma once
#include <cstdio>
#include <vector>

#include "src/backend/backend.hpp"
#include "src/model/spec.hpp"

namespace shardlab {

struct AttentionBenchConfig {
  std::vector<int64_t> seqs{512, 2048};
  std::vector<int64_t> heads{8};
  std::vector<int64_t> head_dims{64};
  int64_t group = 1;  // query heads per K/V head (grouped-query attention; 1 = multi-head)
  bool causal = true;
  int repeats = 3;  // timed (the best is reported)
  int warmup = 1;
  std::vector<AttentionKernel> kernels{AttentionKernel::flash};
  int64_t naive_max_bytes = int64_t{4} << 30;  // naive points whose (H, T, T) buffers exceed this are skipped
};

void run_attention_benchmark(Backend& be, const AttentionBenchConfig& cfg, std::FILE* out);

}  // namespace shardlab
