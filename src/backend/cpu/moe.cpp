// moe.cpp — the CPU mixture-of-experts kernels (ops/moe.hpp): row gathers and weighted combines.
// Every output row is one thread's, and a token's slots add in j order: bit-reproducible at any
// thread count, and the order the CUDA kernels keep.
#include <algorithm>

#include "src/backend/cpu/kernel_util.hpp"
#include "src/backend/cpu/kernels.hpp"
#include "src/core/check.hpp"

namespace shardlab::cpu {

void moe_gather(float* dst, const float* src, const int32_t* token_of, int64_t rows, int64_t N, int64_t C) {
  for (int64_t r = 0; r < rows; ++r)
    SHARD_CHECK(token_of[r] >= 0 && token_of[r] < N, "moe_gather: row {} takes token {} of {}", r, token_of[r], N);
#pragma omp parallel for schedule(static) if (rows * C > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) std::copy_n(src + static_cast<int64_t>(token_of[r]) * C, C, dst + r * C);
}

void moe_combine(float* out, const float* y, const int32_t* pos, const float* w, int64_t N, int64_t k, int64_t C,
                 int64_t rows, bool accumulate) {
  for (int64_t s = 0; s < N * k; ++s)
    SHARD_CHECK(pos[s] >= -1 && pos[s] < rows, "moe_combine: slot {} at row {} of {}", s, pos[s], rows);
#pragma omp parallel for schedule(static) if (N * k * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    float* o = out + n * C;
    if (!accumulate) std::fill_n(o, C, 0.f);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = pos[n * k + j];
      if (r < 0) continue;
      const float* yr = y + static_cast<int64_t>(r) * C;
      const float a = w ? w[n * k + j] : 1.f;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] += a * yr[c];
    }
  }
}

void moe_combine_backward(float* dy, float* dw, const float* dout, const float* y, const int32_t* pos, const float* w,
                          int64_t N, int64_t k, int64_t C, int64_t rows) {
  for (int64_t s = 0; s < N * k; ++s)
    SHARD_CHECK(pos[s] >= -1 && pos[s] < rows, "moe_combine_backward: slot {} at row {} of {}", s, pos[s], rows);
#pragma omp parallel for schedule(static) if (N * k * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* d = dout + n * C;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = n * k + j;
      const int32_t r = pos[s];
      if (r < 0) {
        dw[s] = 0.f;
        continue;
      }
      const float* yr = y + static_cast<int64_t>(r) * C;
      float* dyr = dy + static_cast<int64_t>(r) * C;
      float dot = 0.f;
      for (int64_t c = 0; c < C; ++c) {
        dot += d[c] * yr[c];
        dyr[c] = w[s] * d[c];
      }
      dw[s] = dot;
    }
  }
}

}  // namespace shardlab::cpu
