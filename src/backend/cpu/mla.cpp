// mla.cpp — the CPU latent attention kernels (ops/mla.hpp): a row at a time, every element of
// qkv written once; the shared rotary key's gradient sums its heads in order.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "src/backend/cpu/kernel_util.hpp"
#include "src/backend/cpu/kernels.hpp"

namespace shardlab::cpu {
namespace {

// cos and sin of position pos0 + t for each pair, (T, 2 half), sin negated for the inverse: as
// cpu::rope computes them (f32 angle, f32 cos and sin).
std::vector<float> rope_table(int64_t T, const RopeFreqs& f, int64_t pos0, bool inverse) {
  std::vector<float> table(static_cast<size_t>(T * 2 * f.half));
  const float sign = inverse ? -1.f : 1.f;
  for (int64_t t = 0; t < T; ++t) {
    const float pos = static_cast<float>(pos0 + t);
    for (int64_t i = 0; i < f.half; ++i) {
      const float angle = pos * f.inv_freq[i];
      table[t * 2 * f.half + i] = std::cos(angle);
      table[t * 2 * f.half + f.half + i] = sign * std::sin(angle);
    }
  }
  return table;
}

// dst (rope channels) = src rotated by (c, s): pair i is (2i, 2i + 1) interleaved, else (i, i + half).
void rotate(float* dst, const float* src, const float* c, const float* s, int64_t half, bool interleave) {
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = interleave ? 2 * i : i, b = interleave ? 2 * i + 1 : i + half;
    const float x1 = src[a], x2 = src[b];
    dst[a] = x1 * c[i] - x2 * s[i];
    dst[b] = x2 * c[i] + x1 * s[i];
  }
}

}  // namespace

void mla_qkv_forward(float* qkv, const float* q, const float* kv, const float* kva, int64_t B, int64_t T,
                     const MlaHeads& m, const RopeFreqs& freqs, int64_t pos0) {
  const std::vector<float> table = rope_table(T, freqs, pos0, false);
  const int64_t H = m.heads, qk = m.qk(), half = m.rope / 2, W = m.width(), kvw = m.nope + m.v;
#pragma omp parallel for schedule(static) if (B * T * W > kParallelMin)
  for (int64_t n = 0; n < B * T; ++n) {
    const float* c = table.data() + (n % T) * 2 * half;
    const float* s = c + half;
    float* row = qkv + n * W;
    const float* qr = q + n * H * qk;
    const float* kvr = kv + n * H * kvw;
    const float* k_rope = kva + n * (m.kv_rank + m.rope) + m.kv_rank;
    for (int64_t h = 0; h < H; ++h) {
      float* qh = row + h * qk;
      float* kh = row + H * qk + h * qk;
      std::memcpy(qh, qr + h * qk, static_cast<size_t>(m.nope) * sizeof(float));
      rotate(qh + m.nope, qr + h * qk + m.nope, c, s, half, m.interleave);
      std::memcpy(kh, kvr + h * kvw, static_cast<size_t>(m.nope) * sizeof(float));
      rotate(kh + m.nope, k_rope, c, s, half, m.interleave);
      std::memcpy(row + 2 * H * qk + h * m.v, kvr + h * kvw + m.nope, static_cast<size_t>(m.v) * sizeof(float));
    }
  }
}

void mla_qkv_backward(float* dq, float* dkv, float* dkva, const float* dqkv, int64_t B, int64_t T, const MlaHeads& m,
                      const RopeFreqs& freqs, int64_t pos0) {
  const std::vector<float> table = rope_table(T, freqs, pos0, true);
  const int64_t H = m.heads, qk = m.qk(), half = m.rope / 2, W = m.width(), kvw = m.nope + m.v;
#pragma omp parallel for schedule(static) if (B * T * W > kParallelMin)
  for (int64_t n = 0; n < B * T; ++n) {
    const float* c = table.data() + (n % T) * 2 * half;
    const float* s = c + half;
    const float* row = dqkv + n * W;
    float* qr = dq + n * H * qk;
    float* kvr = dkv + n * H * kvw;
    float sum[2 * RopeFreqs::kMaxHalf] = {};  // the shared key's gradient, heads in order
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = row + h * qk;
      const float* kh = row + H * qk + h * qk;
      std::memcpy(qr + h * qk, qh, static_cast<size_t>(m.nope) * sizeof(float));
      rotate(qr + h * qk + m.nope, qh + m.nope, c, s, half, m.interleave);
      std::memcpy(kvr + h * kvw, kh, static_cast<size_t>(m.nope) * sizeof(float));
      std::memcpy(kvr + h * kvw + m.nope, row + 2 * H * qk + h * m.v, static_cast<size_t>(m.v) * sizeof(float));
      for (int64_t i = 0; i < m.rope; ++i) sum[i] += kh[m.nope + i];
    }
    rotate(dkva + n * (m.kv_rank + m.rope) + m.kv_rank, sum, c, s, half, m.interleave);
  }
}

}  // namespace shardlab::cpu
