// embedding.cpp — the CPU embedding kernels: token (and learned position) lookups and their
// gradients, whole and vocabulary-parallel. Gradients are summed per thread and folded in thread
// order, so a run is bit-reproducible at a given thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cpu/kernel_util.hpp"

namespace shardlab::cpu {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T,
                       int64_t C, int64_t V) {
  check_ids(tokens, B * T, V, "token");
#pragma omp parallel for schedule(static) if (B * T * C > kParallelMin)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    int32_t tok = tokens[bt];
    const float* e = wte + tok * C;
    float* o = out + bt * C;
    if (wpe) {
      const float* p = wpe + (bt % T) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else {
      std::copy_n(e, C, o);
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B, int64_t T,
                        int64_t C) {
  // Sequential over positions: several positions may share a token row, and the order is fixed.
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const float* d = dout + bt * C;
    float* e = dwte + static_cast<int64_t>(tokens[bt]) * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) e[c] += d[c];
    if (dwpe) {
      float* p = dwpe + (bt % T) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) p[c] += d[c];
    }
  }
}

void embedding_forward_shard(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                             int64_t T, int64_t C, int64_t V, int64_t v0) {
#pragma omp parallel for schedule(static) if (B * T * C > kParallelMin)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t row = static_cast<int64_t>(tokens[bt]) - v0;
    const float* p = wpe ? wpe + (bt % T) * C : nullptr;
    float* o = out + bt * C;
    if (row >= 0 && row < V) {
      const float* e = wte + row * C;
      if (p) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
      } else {
        std::copy_n(e, C, o);
      }
    } else if (p) {
      std::copy_n(p, C, o);
    } else {
      std::fill_n(o, C, 0.f);
    }
  }
}

void embedding_backward_shard(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                              int64_t T, int64_t C, int64_t V, int64_t v0) {
  // Sequential over positions, as embedding_backward: a fixed order of additions.
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const float* d = dout + bt * C;
    const int64_t row = static_cast<int64_t>(tokens[bt]) - v0;
    if (row >= 0 && row < V) {
      float* e = dwte + row * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) e[c] += d[c];
    }
    if (dwpe) {
      float* p = dwpe + (bt % T) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) p[c] += d[c];
    }
  }
}

}  // namespace shardlab::cpu
