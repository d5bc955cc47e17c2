// muon.cpp — the CPU Muon passes (ops/muon.hpp), in torch's arithmetic.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "src/backend/cpu/kernel_util.hpp"
#include "src/backend/cpu/kernels.hpp"

namespace shardlab::cpu {
namespace {

inline float bf16_round(float x) { return bf16_bits_to_f32(f32_to_bf16_bits(x)); }

// torch.lerp(a, b, w) for float: a + w (b - a) when |w| < 0.5, else b - (b - a)(1 - w).
inline float lerp(float a, float b, float w) { return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.f - w); }

}  // namespace

void muon_momentum(const float* g, float* buf, float* update, int64_t n, const MuonMomentumArgs& a) {
  const float mu = a.momentum, gs = a.grad_scale;
  const bool nesterov = a.nesterov;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float grad = g[i] * gs;
    const float b = lerp(buf[i], grad, 1.f - mu);
    buf[i] = b;
    update[i] = nesterov ? lerp(grad, b, mu) : b;
  }
}

void muon_normalize(float* x, int64_t n, float eps, bool bf16_math) {
  double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  float norm = static_cast<float>(std::sqrt(s));
  // torch: x.div_(x.norm().clamp(min=eps)); on a bf16 tensor the norm and the clamp are bf16.
  if (bf16_math) norm = bf16_round(std::max(bf16_round(norm), bf16_round(eps)));
  else norm = std::max(norm, eps);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] = bf16_math ? bf16_round(x[i] / norm) : x[i] / norm;
}

void round_to_bf16(float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] = bf16_round(x[i]);
}

void muon_apply(float* p, const float* update, int64_t n, float keep, float lr) {
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) p[i] = p[i] * keep + (-lr) * update[i];
}

}  // namespace shardlab::cpu
