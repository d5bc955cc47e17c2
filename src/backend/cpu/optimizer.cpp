// optimizer.cpp — the CPU AdamW and SGD updates over flat f32 buffers.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cpu/kernel_util.hpp"

namespace shardlab::cpu {

namespace {
inline float grad_at(const float* g, int64_t i) { return g[i]; }
inline float grad_at(const uint16_t* g, int64_t i) { return bf16_bits_to_f32(g[i]); }  // exact

// G: the gradient's storage (f32, or bf16 bits widened as read: the same values an f32 copy holds).
template <class G>
void adamw(float* p, const G* g, float* m, float* v, int64_t n, const AdamWArgs& a) {
  // Locals, not struct fields, so the compiler keeps them in registers and vectorizes the loop.
  const float b1 = a.beta1, b2 = a.beta2, eps = a.eps, lr = a.lr, wd = a.weight_decay, gs = a.grad_scale;
  const float inv_bc1 = 1.f / (1.f - std::pow(b1, static_cast<float>(a.step)));
  const float inv_bc2 = 1.f / (1.f - std::pow(b2, static_cast<float>(a.step)));
  // Seven streams (four read, three written back): the hardware prefetcher alone leaves memory
  // idle, so each tile of one cache line asks for the lines of its four inputs 1 KiB ahead
  // (bench-adamw on one thread of an AVX2 EPYC: about 78% -> 86% of the triad bandwidth). The
  // arithmetic per element is unchanged.
  constexpr int64_t kTile = 16, kAhead = 256;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t t = 0; t < n; t += kTile) {
    if (t + kAhead < n) {
      __builtin_prefetch(p + t + kAhead);
      __builtin_prefetch(g + t + kAhead);
      __builtin_prefetch(m + t + kAhead);
      __builtin_prefetch(v + t + kAhead);
    }
    const int64_t end = std::min(n, t + kTile);
#pragma omp simd
    for (int64_t i = t; i < end; ++i) {
      float grad = grad_at(g, i) * gs;
      float mi = b1 * m[i] + (1.f - b1) * grad;
      float vi = b2 * v[i] + (1.f - b2) * grad * grad;
      m[i] = mi;
      v[i] = vi;
      p[i] -= lr * ((mi * inv_bc1) / (std::sqrt(vi * inv_bc2) + eps) + wd * p[i]);
    }
  }
}

}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a) {
  adamw(p, g, m, v, n, a);
}
void adamw_update_bf16_grad(float* p, const uint16_t* g, float* m, float* v, int64_t n, const AdamWArgs& a) {
  adamw(p, g, m, v, n, a);
}

void sgd_update(float* p, const float* g, float* buf, int64_t n, const SgdArgs& a) {
  const float lr = a.lr, mu = a.momentum, wd = a.weight_decay, gs = a.grad_scale;
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float b = mu * buf[i] + g[i] * gs + wd * p[i];
    buf[i] = b;
    p[i] -= lr * b;
  }
}

}  // namespace shardlab::cpu
