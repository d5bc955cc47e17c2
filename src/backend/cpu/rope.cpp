// rope.cpp — the CPU rotary position embedding (HF's rotate_half convention), in place.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cpu/kernel_util.hpp"

namespace shardlab::cpu {

void rope(float* x, int64_t B, int64_t T, int64_t W, int64_t heads, int64_t head_dim, const RopeFreqs& freqs,
          int64_t pos0, bool inverse) {
  const int64_t half = head_dim / 2;
  // cos and sin per (t, i), shared by every batch entry and head: libm's cosf and sinf are scalar
  // calls, so computing them once keeps the rotation itself a plain vector loop.
  std::vector<float> table(static_cast<size_t>(T) * 2 * half);
  const float sign = inverse ? -1.f : 1.f;
#pragma omp parallel for schedule(static) if (T * half > kParallelMin / 16)
  for (int64_t t = 0; t < T; ++t) {
    const float pos = static_cast<float>(pos0 + t);
    float* c = table.data() + t * 2 * half;
    float* s = c + half;
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * freqs.inv_freq[i];
      c[i] = std::cos(angle);
      s[i] = sign * std::sin(angle);
    }
  }
#pragma omp parallel for schedule(static) if (B * T * heads * head_dim > kParallelMin)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const float* c = table.data() + (bt % T) * 2 * half;
    const float* s = c + half;
    float* row = x + bt * W;
    for (int64_t h = 0; h < heads; ++h) {
      float* x1 = row + h * head_dim;
      float* x2 = x1 + half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float a = x1[i], b = x2[i];
        x1[i] = a * c[i] - b * s[i];
        x2[i] = b * c[i] + a * s[i];
      }
    }
  }
}

}  // namespace shardlab::cpu
