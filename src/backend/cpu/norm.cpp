// norm.cpp — the CPU LayerNorm and RMSNorm kernels. Rows run under OpenMP with a static schedule;
// the weight (and bias) gradients are per-thread partials folded in thread order, so a run is
// bit-reproducible at a given thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cpu/kernel_util.hpp"

namespace shardlab::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * C;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += x[c];
    float m = s / C;
    float v = 0.f;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    float r = 1.f / std::sqrt(v / C + eps);
    float* o = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = (x[c] - m) * r * w[c] + b[c];
    mean[i] = m;
    rstd[i] = r;
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C) {
  int threads = (N * C > kParallelMin) ? omp_get_max_threads() : 1;
  std::vector<float> partial(static_cast<size_t>(threads) * 2 * C, 0.f);  // per thread: dw, db
#pragma omp parallel num_threads(threads)
  {
    float* pdw = partial.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * C;
    float* pdb = pdw + C;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const float* x = inp + i * C;
      const float* d = dout + i * C;
      float m = mean[i], r = rstd[i];
      float dnorm_mean = 0.f, dnorm_norm_mean = 0.f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int64_t c = 0; c < C; ++c) {
        float norm = (x[c] - m) * r;
        float dnorm = w[c] * d[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= C;
      dnorm_norm_mean /= C;
      float* di = dinp + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        float norm = (x[c] - m) * r;
        float dnorm = w[c] * d[c];
        pdb[c] += d[c];
        pdw[c] += norm * d[c];
        di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
      }
    }
  }
  for (int t = 0; t < threads; ++t) {
    const float* pdw = partial.data() + static_cast<size_t>(t) * 2 * C;
    for (int64_t c = 0; c < C; ++c) {
      dw[c] += pdw[c];
      db[c] += pdw[C + c];
    }
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * C;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += x[c] * x[c];
    const float r = 1.f / std::sqrt(ss / C + eps);
    float* o = out + i * C;
    // (x r) w, HF's order: the normalised row is rounded before the weight multiplies it.
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = (x[c] * r) * w[c];
    rstd[i] = r;
  }
}

// With xhat = x r: dx = r (w dy - xhat mean(w dy xhat)); dw = sum over rows of dy xhat, per-thread
// partials folded in thread order as layernorm_backward does.
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                      int64_t N, int64_t C) {
  const int threads = (N * C > kParallelMin) ? omp_get_max_threads() : 1;
  std::vector<float> partial(static_cast<size_t>(threads) * C, 0.f);
#pragma omp parallel num_threads(threads)
  {
    float* pdw = partial.data() + static_cast<size_t>(omp_get_thread_num()) * C;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const float* x = inp + i * C;
      const float* d = dout + i * C;
      const float r = rstd[i];
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < C; ++c) dot += w[c] * d[c] * (x[c] * r);
      dot /= C;
      float* di = dinp + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float xhat = x[c] * r;
        pdw[c] += d[c] * xhat;
        di[c] += (w[c] * d[c] - xhat * dot) * r;
      }
    }
  }
  for (int t = 0; t < threads; ++t) {
    const float* pdw = partial.data() + static_cast<size_t>(t) * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dw[c] += pdw[c];
  }
}

// Per head as rmsnorm_forward per row: (x r) w, r = 1 / sqrt(mean(x^2) + eps).
void head_rmsnorm_forward(float* x, float* pre, float* rstd, const float* w, int64_t N, int64_t W, int64_t col0,
                          int64_t heads, int64_t hd, float eps) {
#pragma omp parallel for schedule(static) if (N * heads * hd > kParallelMin)
  for (int64_t i = 0; i < N; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + i * W + col0 + h * hd;
      float* p = pre + (i * heads + h) * hd;
      float ss = 0.f;
      for (int64_t c = 0; c < hd; ++c) {
        p[c] = v[c];
        ss += v[c] * v[c];
      }
      const float r = 1.f / std::sqrt(ss / hd + eps);
      for (int64_t c = 0; c < hd; ++c) v[c] = (p[c] * r) * w[c];
      rstd[i * heads + h] = r;
    }
}

// As rmsnorm_backward per head; dw summed over (row, head) in order on one thread (hd wide: small).
void head_rmsnorm_backward(float* dx, float* dw, const float* pre, const float* w, const float* rstd, int64_t N,
                           int64_t W, int64_t col0, int64_t heads, int64_t hd) {
  for (int64_t i = 0; i < N; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      const float* d = dx + i * W + col0 + h * hd;
      const float* p = pre + (i * heads + h) * hd;
      const float r = rstd[i * heads + h];
      for (int64_t c = 0; c < hd; ++c) dw[c] += d[c] * (p[c] * r);
    }
#pragma omp parallel for schedule(static) if (N * heads * hd > kParallelMin)
  for (int64_t i = 0; i < N; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      float* d = dx + i * W + col0 + h * hd;
      const float* p = pre + (i * heads + h) * hd;
      const float r = rstd[i * heads + h];
      float dot = 0.f;
      for (int64_t c = 0; c < hd; ++c) dot += w[c] * d[c] * (p[c] * r);
      dot /= static_cast<float>(hd);
      for (int64_t c = 0; c < hd; ++c) d[c] = (w[c] * d[c] - (p[c] * r) * dot) * r;
    }
}

}  // namespace shardlab::cpu
