// kernel_util.hpp — what several CPU kernel files share: the vocabulary check on token ids, a
// vectorisable exp and tanh, and the causal softmax of one row of attention scores.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

#include "src/core/check.hpp"

namespace shardlab::cpu {

// Checked before any parallel loop: an exception must not leave an OpenMP region.
inline void check_ids(const int32_t* ids, int64_t n, int64_t V, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    SHARD_CHECK(ids[i] >= 0 && ids[i] < V, "{} id {} at position {} outside vocabulary of {}", what, ids[i], i, V);
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

// e^x for x in about [-87, 88], within 2 ulp of expf, written so loops over it vectorize (libm's
// expf and tanhf are scalar calls and took over a third of a training step). Range reduction
// x = n ln2 + r, |r| <= ln2/2, then a degree-6 Taylor polynomial for e^r, then 2^n by exponent bits.
inline float fast_exp(float x) {
  x = std::min(88.f, std::max(-87.f, x));
  const float t = x * 1.44269504088896341f;
  // Round to nearest by adding and subtracting 1.5 * 2^23 (no branch, no libm call: the loops
  // around this must vectorize).
  const float fn = (t + 12582912.f) - 12582912.f;
  const int32_t n = static_cast<int32_t>(fn);
  float r = x - fn * 0.693145751953125f - fn * 1.428606765330187e-06f;  // ln2 split in two for accuracy
  float p = 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  return p * std::bit_cast<float>((n + 127) << 23);
}

// tanh through e^{-2|u|}: no cancellation for large |u|; absolute error about 1e-7 everywhere,
// which is what GELU's 1 + tanh(u) sees.
inline float fast_tanh(float u) {
  const float e = fast_exp(-2.f * std::fabs(u));
  return std::copysign((1.f - e) / (1.f + e), u);
}

// A row of scaled scores into causal softmax probabilities: positions [0, last] normalised (the
// max subtracted, float terms summed), the rest of the row's n entries zero.
inline void causal_softmax_row(float* row, int64_t last, int64_t n) {
  float mx = row[0];
  for (int64_t s = 1; s <= last; ++s) mx = std::max(mx, row[s]);
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t s = 0; s <= last; ++s) {
    row[s] = fast_exp(row[s] - mx);
    sum += row[s];
  }
  const float inv = 1.f / sum;
  for (int64_t s = 0; s <= last; ++s) row[s] *= inv;
  for (int64_t s = last + 1; s < n; ++s) row[s] = 0.f;
}

}  // namespace shardlab::cpu
