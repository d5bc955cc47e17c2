// loss.cpp — the CPU softmax cross-entropy, whole and vocabulary-parallel (its three steps).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cpu/kernel_util.hpp"

namespace shardlab::cpu {

void cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                   float dloss_scale) {
  check_ids(targets, N, V, "target");
#pragma omp parallel for schedule(static) if (N * V > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* z = logits + i * V;
    const int32_t y = targets[i];
    float mx = z[0];
#pragma omp simd reduction(max : mx)
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, z[j]);
    double sum = 0.0;  // float terms, a double sum: V may be 50257
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < V; ++j) sum += fast_exp(z[j] - mx);
    const float zy = z[y];
    losses[i] = static_cast<float>(std::log(sum)) + mx - zy;
    if (dlogits) {
      const float scale = static_cast<float>(1.0 / sum) * dloss_scale;
      float* d = dlogits + i * V;  // may be z itself: each element is read before it is written
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) d[j] = fast_exp(z[j] - mx) * scale;
      d[y] -= dloss_scale;
    }
  }
}

void vocab_ce_max(float* mx, const float* logits, int64_t N, int64_t Vl, int64_t valid) {
#pragma omp parallel for schedule(static) if (N * valid > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* z = logits + i * Vl;
    float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < valid; ++j) m = std::max(m, z[j]);
    mx[i] = m;
  }
}

void vocab_ce_sums(float* sumexp, float* tlogit, const float* logits, const int32_t* targets, int64_t N, int64_t Vl,
                   int64_t v0, int64_t valid, const float* mx) {
#pragma omp parallel for schedule(static) if (N * valid > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* z = logits + i * Vl;
    const float m = mx[i];
    double sum = 0.0;  // float terms, a double sum, as cross_entropy
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < valid; ++j) sum += fast_exp(z[j] - m);
    sumexp[i] = static_cast<float>(sum);
    const int64_t y = static_cast<int64_t>(targets[i]) - v0;
    tlogit[i] = y >= 0 && y < valid ? z[y] : 0.f;
  }
}

void vocab_ce_finish(float* losses, float* dlogits, const float* logits, const int32_t* targets, int64_t N,
                     int64_t Vl, int64_t v0, int64_t valid, const float* mx, const float* sumexp, const float* tlogit,
                     float dloss_scale) {
#pragma omp parallel for schedule(static) if (N * Vl > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    losses[i] = std::log(sumexp[i]) + mx[i] - tlogit[i];
    if (!dlogits) continue;
    const float* z = logits + i * Vl;
    float* d = dlogits + i * Vl;  // may be z itself: each element is read before it is written
    const float m = mx[i], scale = (1.f / sumexp[i]) * dloss_scale;
#pragma omp simd
    for (int64_t j = 0; j < valid; ++j) d[j] = fast_exp(z[j] - m) * scale;
    std::fill(d + valid, d + Vl, 0.f);
    const int64_t y = static_cast<int64_t>(targets[i]) - v0;
    if (y >= 0 && y < valid) d[y] -= dloss_scale;
  }
}

}  // namespace shardlab::cpu
