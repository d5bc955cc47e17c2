// activation.cpp — the CPU GELU (tanh approximation) and SwiGLU kernels, through kernel_util.hpp's
// vectorisable exp and tanh.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cpu/kernel_util.hpp"

namespace shardlab::cpu {

void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float x = inp[i];
    float u = kGeluScale * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.f + fast_tanh(u));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float x = inp[i];
    float u = kGeluScale * (x + 0.044715f * x * x * x);
    float th = fast_tanh(u);
    float sech2 = 1.f - th * th;
    float grad = 0.5f * (1.f + th) + 0.5f * x * sech2 * kGeluScale * (1.f + 3.f * 0.044715f * x * x);
    dinp[i] = grad * dout[i];
  }
}

// silu(g) = g sigmoid(g), with e^-g from fast_exp so the loops vectorize; its clamp to e^87 only
// touches g < -87, where silu is below 1e-36 either way.
void swiglu_forward(float* out, const float* gate_up, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (N * F > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* g = gate_up + i * 2 * F;
    const float* u = g + F;
    float* o = out + i * F;
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) o[j] = g[j] / (1.f + fast_exp(-g[j])) * u[j];
  }
}

// d silu(g) / dg = sig (1 + g (1 - sig)).
void swiglu_backward(float* dgate_up, const float* gate_up, const float* dout, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (N * F > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* g = gate_up + i * 2 * F;
    const float* u = g + F;
    const float* d = dout + i * F;
    float* dg = dgate_up + i * 2 * F;
    float* du = dg + F;
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) {
      const float sig = 1.f / (1.f + fast_exp(-g[j]));
      dg[j] = d[j] * u[j] * sig * (1.f + g[j] * (1.f - sig));
      du[j] = d[j] * g[j] * sig;
    }
  }
}

}  // namespace shardlab::cpu
