// attention.cpp — the CPU causal self-attention kernels (grouped-query heads included).
//
// Attention reads q, k, v straight out of the fused (B, T, (H + KV) hs + KV vs) buffer through its
// leading dimension and writes head h's output into columns [h*vs, (h+1)*vs) of (B, T, H vs): no
// permutation copies. Values may have a head dimension vs of their own (DeepSeek's latent attention);
// vs == hs is every other family's. With KV == H these are GPT-2's (B, T, 3C) and the very same
// GEMM calls as before grouped heads existed, so multi-head results did not change by a bit.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cpu/kernel_util.hpp"

namespace shardlab::cpu {

// Query head h reads K/V head h / (H / KV), at column C + (h / group) hs of the row (its v at
// C + KV hs + (h / group) vs).
void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                       int64_t hs, int64_t vs) {
  const int64_t C = H * hs, C3 = C + KV * (hs + vs), group = H / KV, Co = H * vs;
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for schedule(static) if (B * H > 1 && B * T * C > kParallelMin)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    int64_t b = bh / H, h = bh % H;
    const float* q = qkv + b * T * C3 + h * hs;
    const float* k = qkv + b * T * C3 + C + (h / group) * hs;
    const float* v = qkv + b * T * C3 + C + KV * hs + (h / group) * vs;
    float* a = att + bh * T * T;
    sgemm(Trans::N, Trans::T, T, T, hs, scale, q, C3, k, C3, 0.f, a, T);  // scores, scaled
    for (int64_t t = 0; t < T; ++t) causal_softmax_row(a + t * T, t, T);
    sgemm(Trans::N, Trans::N, T, vs, T, 1.f, a, T, v, C3, 0.f, out + b * T * Co + h * vs, Co);
  }
}

namespace {
// One batch entry of attention_backward: qkv, dqkv (T, C3) with C3 = (H + KV) hs + KV vs, att
// (H, T, T), dout (T, Co = H vs), scratch (H, T, T); C = H hs.
struct AttentionGrad {
  const float* qkv;
  float* dqkv;
  const float* att;
  const float* dout;
  float* scratch;
  int64_t T, C, C3, H, KV, hs, vs, Co;
  float scale;
};

// Softmax backward over one head's rows, folding in the score scale: d(pre) = att * (datt - <att,
// datt>) * scale, zero above the diagonal.
void softmax_backward(float* da, const float* a, int64_t T, float scale) {
  for (int64_t t = 0; t < T; ++t) {
    const float* ar = a + t * T;
    float* dr = da + t * T;
    float dot = 0.f;
    for (int64_t s = 0; s <= t; ++s) dot += ar[s] * dr[s];
    for (int64_t s = 0; s <= t; ++s) dr[s] = ar[s] * (dr[s] - dot) * scale;
    for (int64_t s = t + 1; s < T; ++s) dr[s] = 0.f;
  }
}

// Multi-head (KV == H): one thread per head, every gradient written once. These are the GEMM calls
// GPT-2 has always made; keep them as they are, or its losses change in the last bits.
void attention_backward_mha(const AttentionGrad& e) {
  const int64_t T = e.T, C = e.C, C3 = e.C3, hs = e.hs, vs = e.vs, Co = e.Co;
#pragma omp parallel for schedule(static) if (e.H > 1 && T * C > kParallelMin)
  for (int64_t h = 0; h < e.H; ++h) {
    const float* q = e.qkv + h * hs;
    const float* k = q + C;
    const float* v = e.qkv + 2 * C + h * vs;
    float* dq = e.dqkv + h * hs;
    float* dk = dq + C;
    float* dv = e.dqkv + 2 * C + h * vs;
    const float* a = e.att + h * T * T;
    const float* dh = e.dout + h * vs;
    float* da = e.scratch + h * T * T;
    sgemm(Trans::N, Trans::T, T, T, vs, 1.f, dh, Co, v, C3, 0.f, da, T);  // d(att) = dh v^T
    sgemm(Trans::T, Trans::N, T, vs, T, 1.f, a, T, dh, Co, 0.f, dv, C3);  // dv = att^T dh
    softmax_backward(da, a, T, e.scale);
    sgemm(Trans::N, Trans::N, T, hs, T, 1.f, da, T, k, C3, 0.f, dq, C3);  // dq = dpre k
    sgemm(Trans::T, Trans::N, T, hs, T, 1.f, da, T, q, C3, 0.f, dk, C3);  // dk = dpre^T q
  }
}

// Grouped-query (KV < H), in two passes so that few K/V heads (multi-query: one) still give every
// thread work. First, per query head: d(pre) into scratch and dq. Then dk and dv, which sum over a
// group's query heads, in tasks of (K/V head, dk or dv, block of kRows key positions): each task
// is the only writer of its rows and adds the heads in order (the first GEMM writes, the rest
// add), so the result does not depend on the thread count. Causality trims the sum: key s only
// receives from queries t >= s, so a block starting at s0 reads rows [s0, T) of att and d(pre).
void attention_backward_gqa(const AttentionGrad& e) {
  const int64_t T = e.T, C = e.C, C3 = e.C3, hs = e.hs, vs = e.vs, Co = e.Co, KV = e.KV, group = e.H / KV;
#pragma omp parallel for schedule(static) if (T * C > kParallelMin)
  for (int64_t h = 0; h < e.H; ++h) {
    const float* k = e.qkv + C + (h / group) * hs;
    const float* v = e.qkv + C + KV * hs + (h / group) * vs;
    const float* a = e.att + h * T * T;
    float* da = e.scratch + h * T * T;
    sgemm(Trans::N, Trans::T, T, T, vs, 1.f, e.dout + h * vs, Co, v, C3, 0.f, da, T);  // d(att) = dh v^T
    softmax_backward(da, a, T, e.scale);
    sgemm(Trans::N, Trans::N, T, hs, T, 1.f, da, T, k, C3, 0.f, e.dqkv + h * hs, C3);  // dq = dpre k
  }
  constexpr int64_t kRows = 64;
  const int64_t blocks = (T + kRows - 1) / kRows;
#pragma omp parallel for schedule(static) if (T * C > kParallelMin)
  for (int64_t task = 0; task < KV * 2 * blocks; ++task) {
    const int64_t g = task / (2 * blocks), is_v = (task / blocks) % 2, s0 = (task % blocks) * kRows;
    const int64_t rows = std::min(kRows, T - s0);
    const int64_t width = is_v ? vs : hs;
    float* d = e.dqkv + s0 * C3 + C + (is_v ? KV * hs : 0) + g * width;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      // dv (+)= att^T dh; dk (+)= dpre^T q, over query rows t >= s0 and key columns [s0, s0 + rows).
      const float* p = (is_v ? e.att : e.scratch) + h * T * T + s0 * T + s0;
      const float* rhs = is_v ? e.dout + s0 * Co + h * vs : e.qkv + s0 * C3 + h * hs;
      sgemm(Trans::T, Trans::N, rows, width, T - s0, 1.f, p, T, rhs, is_v ? Co : C3, h == g * group ? 0.f : 1.f, d,
            C3);
    }
  }
}
}  // namespace

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int64_t B,
                        int64_t T, int64_t H, int64_t KV, int64_t hs, int64_t vs) {
  const int64_t C = H * hs, C3 = C + KV * (hs + vs), Co = H * vs;
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
  for (int64_t b = 0; b < B; ++b) {
    const AttentionGrad e{qkv + b * T * C3, dqkv + b * T * C3, att + b * H * T * T, dout + b * T * Co, scratch,
                          T, C, C3, H, KV, hs, vs, Co, scale};
    if (KV == H)
      attention_backward_mha(e);
    else
      attention_backward_gqa(e);
  }
}

}  // namespace shardlab::cpu
