// kernels.cpp — the CPU backend's layer (embedding, LayerNorm, RMSNorm, rotary positions, GELU,
// SwiGLU, attention, cross-entropy) and optimizer kernels.
//
// Threads: loops over rows run under OpenMP with a static schedule, so results do not depend on
// timing. Reductions across rows (LayerNorm's weight/bias gradients, embedding gradients) are
// done per thread and folded in thread order, so a run is bit-reproducible at a given thread count.
// Attention reads q, k, v straight out of the fused (B, T, (H + 2 KV) hs) buffer through its leading
// dimension and writes head h's output into columns [h*hs, (h+1)*hs) of (B, T, C): no permutation
// copies. With KV == H these are GPT-2's (B, T, 3C) and the very same GEMM calls as before grouped
// heads existed, so multi-head results did not change by a bit.
#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cpu/gemm.hpp"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

namespace shardlab::cpu {
namespace {
// Checked before any parallel loop: an exception must not leave an OpenMP region.
void check_ids(const int32_t* ids, int64_t n, int64_t V, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    SHARD_CHECK(ids[i] >= 0 && ids[i] < V, "{} id {} at position {} outside vocabulary of {}", what, ids[i], i, V);
}
}  // namespace

void sgemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  sgemm_with(gemm_pick(GemmShape{ta, tb, m, n, k, lda, ldb}), ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

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

void rope(float* x, int64_t B, int64_t T, int64_t W, int64_t heads, int64_t head_dim, const RopeFreqs& freqs,
          int64_t pos0, bool inverse) {
  const int64_t half = head_dim / 2;
  // cos and sin per (t, i), shared by every batch entry and head: libm's cosf and sinf are scalar
  // calls, so computing them once keeps the rotation itself a plain vector loop.
  std::vector<float> table(static_cast<size_t>(T) * 2 * half);
  const float sign = inverse ? -1.f : 1.f;
#pragma omp parallel for schedule(static) if (T * half > kParallelMin / 16)
  for (int64_t t = 0; t < T; ++t) {
    const float pos = static_cast<float>(pos0 + t);
    float* c = table.data() + t * 2 * half;
    float* s = c + half;
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * freqs.inv_freq[i];
      c[i] = std::cos(angle);
      s[i] = sign * std::sin(angle);
    }
  }
#pragma omp parallel for schedule(static) if (B * T * heads * head_dim > kParallelMin)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const float* c = table.data() + (bt % T) * 2 * half;
    const float* s = c + half;
    float* row = x + bt * W;
    for (int64_t h = 0; h < heads; ++h) {
      float* x1 = row + h * head_dim;
      float* x2 = x1 + half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float a = x1[i], b = x2[i];
        x1[i] = a * c[i] - b * s[i];
        x2[i] = b * c[i] + a * s[i];
      }
    }
  }
}

void add_bias(float* x, const float* bias, int64_t N, int64_t OC) {
#pragma omp parallel for schedule(static) if (N * OC > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    float* row = x + i * OC;
#pragma omp simd
    for (int64_t c = 0; c < OC; ++c) row[c] += bias[c];
  }
}

namespace {
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
}  // namespace

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

namespace {
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
}  // namespace

// Query head h reads K/V head h / (H / KV), at column C + (h / group) hs of the row (v KV hs further).
void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t H,
                       int64_t KV) {
  const int64_t hs = C / H, C3 = C + 2 * KV * hs, group = H / KV;
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for schedule(static) if (B * H > 1 && B * T * C > kParallelMin)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    int64_t b = bh / H, h = bh % H;
    const float* q = qkv + b * T * C3 + h * hs;
    const float* k = qkv + b * T * C3 + C + (h / group) * hs;
    const float* v = k + KV * hs;
    float* a = att + bh * T * T;
    sgemm(Trans::N, Trans::T, T, T, hs, scale, q, C3, k, C3, 0.f, a, T);  // scores, scaled
    for (int64_t t = 0; t < T; ++t) causal_softmax_row(a + t * T, t, T);
    sgemm(Trans::N, Trans::N, T, hs, T, 1.f, a, T, v, C3, 0.f, out + b * T * C + h * hs, C);
  }
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

namespace {
// One batch entry of attention_backward: qkv, dqkv (T, C3) with C3 = (H + 2 KV) hs, att (H, T, T),
// dout (T, C), scratch (H, T, T).
struct AttentionGrad {
  const float* qkv;
  float* dqkv;
  const float* att;
  const float* dout;
  float* scratch;
  int64_t T, C, C3, H, KV, hs;
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
  const int64_t T = e.T, C = e.C, C3 = e.C3, hs = e.hs;
#pragma omp parallel for schedule(static) if (e.H > 1 && T * C > kParallelMin)
  for (int64_t h = 0; h < e.H; ++h) {
    const float* q = e.qkv + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = e.dqkv + h * hs;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* a = e.att + h * T * T;
    const float* dh = e.dout + h * hs;
    float* da = e.scratch + h * T * T;
    sgemm(Trans::N, Trans::T, T, T, hs, 1.f, dh, C, v, C3, 0.f, da, T);  // d(att) = dh v^T
    sgemm(Trans::T, Trans::N, T, hs, T, 1.f, a, T, dh, C, 0.f, dv, C3);  // dv = att^T dh
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
  const int64_t T = e.T, C = e.C, C3 = e.C3, hs = e.hs, KV = e.KV, group = e.H / KV;
#pragma omp parallel for schedule(static) if (T * C > kParallelMin)
  for (int64_t h = 0; h < e.H; ++h) {
    const float* k = e.qkv + C + (h / group) * hs;
    const float* v = k + KV * hs;
    const float* a = e.att + h * T * T;
    float* da = e.scratch + h * T * T;
    sgemm(Trans::N, Trans::T, T, T, hs, 1.f, e.dout + h * hs, C, v, C3, 0.f, da, T);  // d(att) = dh v^T
    softmax_backward(da, a, T, e.scale);
    sgemm(Trans::N, Trans::N, T, hs, T, 1.f, da, T, k, C3, 0.f, e.dqkv + h * hs, C3);  // dq = dpre k
  }
  constexpr int64_t kRows = 64;
  const int64_t blocks = (T + kRows - 1) / kRows;
#pragma omp parallel for schedule(static) if (T * C > kParallelMin)
  for (int64_t task = 0; task < KV * 2 * blocks; ++task) {
    const int64_t g = task / (2 * blocks), is_v = (task / blocks) % 2, s0 = (task % blocks) * kRows;
    const int64_t rows = std::min(kRows, T - s0);
    float* d = e.dqkv + s0 * C3 + C + (is_v ? KV : 0) * hs + g * hs;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      // dv (+)= att^T dh; dk (+)= dpre^T q, over query rows t >= s0 and key columns [s0, s0 + rows).
      const float* p = (is_v ? e.att : e.scratch) + h * T * T + s0 * T + s0;
      const float* rhs = is_v ? e.dout + s0 * C + h * hs : e.qkv + s0 * C3 + h * hs;
      sgemm(Trans::T, Trans::N, rows, hs, T - s0, 1.f, p, T, rhs, is_v ? C : C3, h == g * group ? 0.f : 1.f, d, C3);
    }
  }
}
}  // namespace

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int64_t B,
                        int64_t T, int64_t C, int64_t H, int64_t KV) {
  const int64_t hs = C / H, C3 = C + 2 * KV * hs;
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
  for (int64_t b = 0; b < B; ++b) {
    const AttentionGrad e{qkv + b * T * C3, dqkv + b * T * C3, att + b * H * T * T, dout + b * T * C, scratch,
                          T, C, C3, H, KV, hs, scale};
    if (KV == H)
      attention_backward_mha(e);
    else
      attention_backward_gqa(e);
  }
}

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

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a) {
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
      float grad = g[i] * gs;
      float mi = b1 * m[i] + (1.f - b1) * grad;
      float vi = b2 * v[i] + (1.f - b2) * grad * grad;
      m[i] = mi;
      v[i] = vi;
      p[i] -= lr * ((mi * inv_bc1) / (std::sqrt(vi * inv_bc2) + eps) + wd * p[i]);
    }
  }
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
