// kv_cache.cpp — the CPU KV cache of decoding: writing a step's keys and values, and attention of
// the new positions over every cached one.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cpu/kernel_util.hpp"

namespace shardlab::cpu {

void copy_rows(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) std::copy_n(src + r * src_ld, width, dst + r * dst_ld);
}

void kv_cache_write(float* k_cache, float* v_cache, const float* qkv, int64_t B, int64_t T, int64_t S, int64_t H,
                    int64_t KV, int64_t hd, int64_t pos0) {
  const int64_t W = (H + 2 * KV) * hd, KVd = KV * hd;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* k = qkv + (b * T + t) * W + H * hd;
      const int64_t row = (b * S + pos0 + t) * KVd;
      std::copy_n(k, KVd, k_cache + row);
      std::copy_n(k + KVd, KVd, v_cache + row);
    }
}

// attention_forward's rows pos0 + t, with the same products (sgemm, scaled scores then a v) and the
// same softmax, over the cache's rows instead of qkv's: a decoded position's output differs from
// the whole sequence's only by the GEMM library's summation order for other shapes.
void attention_cached(float* out, const float* qkv, const float* k_cache, const float* v_cache, int64_t B, int64_t T,
                      int64_t S, int64_t H, int64_t KV, int64_t hd, int64_t pos0) {
  const int64_t C = H * hd, W = C + 2 * KV * hd, KVd = KV * hd, group = H / KV, P = pos0 + T;  // keys the last query sees
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel for schedule(static) if (B * H > 1 && B * H * T * P * hd > kParallelMin)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    const float* q = qkv + b * T * W + h * hd;
    const float* k = k_cache + b * S * KVd + (h / group) * hd;
    const float* v = v_cache + b * S * KVd + (h / group) * hd;
    std::vector<float> a(static_cast<size_t>(T * P));  // (T, P) scores, then probabilities
    sgemm(Trans::N, Trans::T, T, P, hd, scale, q, W, k, KVd, 0.f, a.data(), P);
    for (int64_t t = 0; t < T; ++t) causal_softmax_row(a.data() + t * P, pos0 + t, P);
    sgemm(Trans::N, Trans::N, T, hd, P, 1.f, a.data(), P, v, KVd, 0.f, out + b * T * C + h * hd, C);
  }
}

}  // namespace shardlab::cpu
