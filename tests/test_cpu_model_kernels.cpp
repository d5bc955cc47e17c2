// The CPU backend's layer kernels (GPT-2's, and the Llama family's RMSNorm, rotary positions, SwiGLU
// and grouped-query attention) against naive double-precision references. (The whole model is also
// checked against PyTorch in test_model_reference.cpp.)
#include <catch2/catch.hpp>
#include <cmath>

#include "src/backend/backend.hpp"
#include "tests/test_util.hpp"
#include "src/backend/ops/activation.hpp"
#include "src/backend/ops/attention.hpp"
#include "src/backend/ops/embedding.hpp"
#include "src/backend/ops/kv_cache.hpp"
#include "src/backend/ops/loss.hpp"
#include "src/backend/ops/norm.hpp"
#include "src/backend/ops/rope.hpp"

using namespace shardlab;
using shardlab::test::random_vector;

namespace {
Tensor t1(std::vector<float>& v) { return Tensor::flat(v.data(), DType::f32, static_cast<int64_t>(v.size())); }
std::unique_ptr<Backend> cpu() { return make_cpu_backend(BackendConfig{2}); }
double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}
}  // namespace

TEST_CASE("gelu forward and backward (tanh approximation)", "[kernels]") {
  auto be = cpu();
  const size_t n = 100003;
  auto x = random_vector("gelu", n, -12.f, 12.f), dout = random_vector("dgelu", n);
  std::vector<float> y(n), dx(n);
  ops::gelu_forward(*be, t1(y), t1(x));
  ops::gelu_backward(*be, t1(dx), t1(x), t1(dout));
  std::vector<double> ry(n), rdx(n);
  const double k = std::sqrt(2.0 / M_PI);
  for (size_t i = 0; i < n; ++i) {
    double v = x[i], u = k * (v + 0.044715 * v * v * v), th = std::tanh(u);
    ry[i] = 0.5 * v * (1 + th);
    rdx[i] = (0.5 * (1 + th) + 0.5 * v * (1 - th * th) * k * (1 + 3 * 0.044715 * v * v)) * dout[i];
  }
  // Tolerance: 2e-6 x (1 + |x|) absolute: tanh's absolute error about 1e-7, scaled by x / 2.
  double ey = 0, edx = 0;
  for (size_t i = 0; i < n; ++i) {
    ey = std::max(ey, std::fabs(y[i] - ry[i]) / (1 + std::fabs(x[i])));
    edx = std::max(edx, std::fabs(dx[i] - rdx[i]) / (1 + std::fabs(x[i])));
  }
  INFO("gelu forward error " << ey << ", backward " << edx);
  CHECK(ey < 2e-6);
  CHECK(edx < 2e-6);
}

TEST_CASE("layernorm forward and backward", "[kernels]") {
  auto be = cpu();
  const int64_t N = 300, C = 96;
  auto x = random_vector("ln x", N * C, -3.f, 3.f), w = random_vector("ln w", C), b = random_vector("ln b", C);
  auto dout = random_vector("ln dout", N * C);
  std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C, 0.5f), dw(C, 0.f), db(C, 0.f);
  ops::layernorm_forward(*be, t1(y), t1(mean), t1(rstd), t1(x), t1(w), t1(b), 1e-5f);
  ops::layernorm_backward(*be, t1(dx), t1(dw), t1(db), t1(dout), t1(x), t1(w), t1(mean), t1(rstd));
  std::vector<double> ry(N * C), rdx(N * C), rdw(C, 0), rdb(C, 0);
  for (int64_t i = 0; i < N; ++i) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += x[i * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (x[i * C + c] - m) * (x[i * C + c] - m);
    double r = 1 / std::sqrt(v / C + 1e-5), a = 0, bb = 0;
    for (int64_t c = 0; c < C; ++c) {
      double nrm = (x[i * C + c] - m) * r;
      ry[i * C + c] = nrm * w[c] + b[c];
      a += w[c] * dout[i * C + c];
      bb += w[c] * dout[i * C + c] * nrm;
      rdw[c] += dout[i * C + c] * nrm;
      rdb[c] += dout[i * C + c];
    }
    for (int64_t c = 0; c < C; ++c) {
      double nrm = (x[i * C + c] - m) * r;
      rdx[i * C + c] = 0.5 + (w[c] * dout[i * C + c] - a / C - nrm * bb / C) * r;  // accumulates onto 0.5
    }
  }
  // Tolerances: f32 over C = 96 terms: 1e-5 for outputs and dx, 1e-4 for dw/db (sums over 300 rows).
  CHECK(max_abs_diff(y, ry) < 1e-5);
  CHECK(max_abs_diff(dx, rdx) < 1e-5);
  CHECK(max_abs_diff(dw, rdw) < 1e-4);
  CHECK(max_abs_diff(db, rdb) < 1e-4);
}

TEST_CASE("causal attention forward", "[kernels]") {
  auto be = cpu();
  const int64_t B = 2, T = 9, C = 12, H = 3, hs = C / H;
  auto qkv = random_vector("qkv", B * T * 3 * C, -2.f, 2.f);
  std::vector<float> out(B * T * C), att(B * H * T * T);
  ops::attention_forward(*be, Tensor(out.data(), DType::f32, {B, T, C}), Tensor(att.data(), DType::f32, {B, H, T, T}),
                         Tensor(qkv.data(), DType::f32, {B, T, 3 * C}), H, H);
  std::vector<double> ref(B * T * C, 0.0), ratt(B * H * T * T, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double mx = -1e300, sum = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double d = 0;
          for (int64_t j = 0; j < hs; ++j)
            d += qkv[(b * T + t) * 3 * C + h * hs + j] * qkv[(b * T + u) * 3 * C + C + h * hs + j];
          s[u] = d / std::sqrt(double(hs));
          mx = std::max(mx, s[u]);
        }
        for (int64_t u = 0; u <= t; ++u) sum += (s[u] = std::exp(s[u] - mx));
        for (int64_t u = 0; u <= t; ++u) {
          ratt[((b * H + h) * T + t) * T + u] = s[u] / sum;
          for (int64_t j = 0; j < hs; ++j)
            ref[(b * T + t) * C + h * hs + j] += s[u] / sum * qkv[(b * T + u) * 3 * C + 2 * C + h * hs + j];
        }
      }
  CHECK(max_abs_diff(att, ratt) < 1e-6);  // zero above the diagonal, probabilities below
  CHECK(max_abs_diff(out, ref) < 1e-5);
}

TEST_CASE("cross-entropy loss and its gradient", "[kernels]") {
  auto be = cpu();
  const int64_t N = 7, V = 50;
  auto logits = random_vector("ce", N * V, -5.f, 5.f);
  std::vector<int32_t> tgt = {0, 49, 3, 3, 17, 25, 1};
  std::vector<float> loss(N), dl(N * V);
  ops::cross_entropy(*be, t1(loss), t1(dl), t1(logits), tgt.data(), 0.5f);
  for (int64_t i = 0; i < N; ++i) {
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(logits[i * V + j]));
    for (int64_t j = 0; j < V; ++j) sum += std::exp(logits[i * V + j] - mx);
    CHECK(loss[i] == Approx(std::log(sum) + mx - logits[i * V + tgt[i]]).epsilon(1e-6));
    for (int64_t j = 0; j < V; ++j) {
      double p = std::exp(logits[i * V + j] - mx) / sum;
      CHECK(dl[i * V + j] == Approx(0.5 * (p - (j == tgt[i]))).margin(1e-7));
    }
  }
  std::vector<int32_t> bad = {0, 50, 0, 0, 0, 0, 0};
  CHECK_THROWS_WITH(ops::cross_entropy(*be, t1(loss), t1(dl), t1(logits), bad.data(), 1.f),
                    Catch::Contains("target id 50 at position 1 outside vocabulary of 50"));
}

TEST_CASE("embedding forward and backward", "[kernels]") {
  auto be = cpu();
  const int64_t B = 2, T = 3, C = 4, V = 5;
  auto wte = random_vector("wte", V * C), wpe = random_vector("wpe", T * C), dout = random_vector("demb", B * T * C);
  std::vector<int32_t> tok = {1, 4, 1, 0, 1, 2};
  std::vector<float> out(B * T * C), dwte(V * C, 0.f), dwpe(T * C, 0.f);
  Tensor twte(wte.data(), DType::f32, {V, C}), twpe(wpe.data(), DType::f32, {T, C});
  ops::embedding_forward(*be, t1(out), tok.data(), B, T, twte, twpe);
  ops::embedding_backward(*be, Tensor(dwte.data(), DType::f32, {V, C}), Tensor(dwpe.data(), DType::f32, {T, C}),
                          t1(dout), tok.data(), B, T);
  std::vector<double> rdwte(V * C, 0), rdwpe(T * C, 0);
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t c = 0; c < C; ++c) {
      CHECK(out[bt * C + c] == wte[tok[bt] * C + c] + wpe[(bt % T) * C + c]);
      rdwte[tok[bt] * C + c] += dout[bt * C + c];
      rdwpe[(bt % T) * C + c] += dout[bt * C + c];
    }
  CHECK(max_abs_diff(dwte, rdwte) < 1e-6);  // token 1 appears three times: its gradient is a sum
  CHECK(max_abs_diff(dwpe, rdwpe) < 1e-6);
  std::vector<int32_t> bad = {1, 4, 5, 0, 1, 2};
  CHECK_THROWS_WITH(ops::embedding_forward(*be, t1(out), bad.data(), B, T, twte, twpe),
                    Catch::Contains("token id 5 at position 2 outside vocabulary of 5"));
}

// ---- the Llama family's operations ----

namespace {
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}
}  // namespace

TEST_CASE("rmsnorm forward and backward, accumulating into dinp and dweight", "[kernels]") {
  auto be = cpu();
  // 7 x 13: one thread; 301 x 97: above kParallelMin, so dweight folds per-thread partials.
  for (auto [N, C] : {std::pair<int64_t, int64_t>{7, 13}, {301, 97}}) {
    INFO("N=" << N << " C=" << C);
    const float eps = 1e-5f;
    auto x = random_vector("rms x", N * C, -3.f, 3.f), w = random_vector("rms w", C, 0.5f, 1.5f);
    auto dout = random_vector("rms dout", N * C), dx0 = random_vector("rms dx0", N * C);
    auto dw0 = random_vector("rms dw0", C);
    std::vector<float> y(N * C), rstd(N), dx = dx0, dw = dw0;
    ops::rmsnorm_forward(*be, t1(y), t1(rstd), t1(x), t1(w), eps);
    ops::rmsnorm_backward(*be, t1(dx), t1(dw), t1(dout), t1(x), t1(w), t1(rstd));
    std::vector<double> ry(N * C), rrstd(N), rdx(N * C), rdw(dw0.begin(), dw0.end());
    for (int64_t i = 0; i < N; ++i) {
      double ms = 0, dot = 0;
      for (int64_t c = 0; c < C; ++c) ms += double(x[i * C + c]) * x[i * C + c];
      const double r = 1 / std::sqrt(ms / C + eps);
      rrstd[i] = r;
      // y_c = x_c r w_c, r = (mean x^2 + eps)^-1/2: dy/dx_c = r w_c dy_c - x_c r^3 / C sum_j dy_j w_j x_j.
      for (int64_t c = 0; c < C; ++c) {
        ry[i * C + c] = x[i * C + c] * r * w[c];
        dot += double(dout[i * C + c]) * w[c] * x[i * C + c];
        rdw[c] += double(dout[i * C + c]) * x[i * C + c] * r;
      }
      for (int64_t c = 0; c < C; ++c)
        rdx[i * C + c] = dx0[i * C + c] + r * w[c] * dout[i * C + c] - x[i * C + c] * r * r * r / C * dot;
    }
    // Tolerances: f32 sums of C terms of size ~3: 1e-5 for outputs, 2e-5 for dx; dweight sums N rows.
    CHECK(max_abs_diff(rstd, rrstd) < 1e-5);
    CHECK(max_abs_diff(y, ry) < 1e-5);
    CHECK(max_abs_diff(dx, rdx) < 2e-5);
    CHECK(max_abs_diff(dw, rdw) < 5e-5);
  }
}

namespace {
// HF's default inv_freq = 1 / theta^(2i / head_dim).
RopeFreqs rope_freqs(int64_t head_dim, double theta) {
  RopeFreqs f;
  f.half = head_dim / 2;
  for (int64_t i = 0; i < f.half; ++i) f.inv_freq[i] = static_cast<float>(1 / std::pow(theta, 2.0 * i / head_dim));
  return f;
}
// Rotary embedding in double with HF's f32 angle: pos * inv_freq rounded to f32, then exact cos/sin.
std::vector<double> rope_reference(const std::vector<float>& x, int64_t B, int64_t T, int64_t W, int64_t heads,
                                   int64_t hd, const RopeFreqs& f, int64_t pos0, bool inverse) {
  std::vector<double> r(x.begin(), x.end());
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const float angle = static_cast<float>(pos0 + bt % T) * f.inv_freq[i];
        const double c = std::cos(double(angle)), s = (inverse ? -1 : 1) * std::sin(double(angle));
        const int64_t j1 = bt * W + h * hd + i, j2 = j1 + hd / 2;
        r[j1] = x[j1] * c - x[j2] * s;
        r[j2] = x[j2] * c + x[j1] * s;
      }
  return r;
}
}  // namespace

TEST_CASE("rope rotates the first heads' channel pairs, and its inverse undoes it", "[kernels]") {
  auto be = cpu();
  struct Case {
    int64_t B, T, heads, hd, W, pos0;
  };
  // W wider than heads x hd: the channels after the rotated heads (a fused qkv's v) stay as they are.
  // pos0 = 2^20 + 3: the f32 angle differs from the exact one by up to ~0.06 rad, so HF's rounding is
  // what is checked. 2 x 64 x 8 x 64 is above kParallelMin.
  for (auto [B, T, heads, hd, W, pos0] : {Case{2, 9, 4, 6, 29, 5}, Case{1, 5, 3, 8, 24, (1 << 20) + 3},
                                          Case{2, 64, 8, 64, 8 * 64 + 16, 17}}) {
    INFO("B=" << B << " T=" << T << " heads=" << heads << " hd=" << hd << " W=" << W << " pos0=" << pos0);
    const RopeFreqs f = rope_freqs(hd, 10000.0);
    const auto x0 = random_vector("rope x", B * T * W, -2.f, 2.f);
    std::vector<float> x = x0;
    Tensor tx(x.data(), DType::f32, {B, T, W});
    ops::rope(*be, tx, heads, hd, f, pos0, false);
    CHECK(max_abs_diff(x, rope_reference(x0, B, T, W, heads, hd, f, pos0, false)) < 2e-6);
    for (int64_t bt = 0; bt < B * T; ++bt)
      for (int64_t c = heads * hd; c < W; ++c) REQUIRE(x[bt * W + c] == x0[bt * W + c]);
    ops::rope(*be, tx, heads, hd, f, pos0, true);
    CHECK(max_abs_diff(x, x0) < 2e-6);  // a rotation and its inverse, each rounded in f32
    std::vector<float> xi = x0;
    ops::rope(*be, Tensor(xi.data(), DType::f32, {B, T, W}), heads, hd, f, pos0, true);
    CHECK(max_abs_diff(xi, rope_reference(x0, B, T, W, heads, hd, f, pos0, true)) < 2e-6);
  }
  std::vector<float> x(2 * 3 * 8);
  CHECK_THROWS_WITH(ops::rope(*be, Tensor(x.data(), DType::f32, {2, 3, 8}), 2, 6, rope_freqs(6, 1e4), 0, false),
                    Catch::Contains("W >= heads 2 x head_dim 6"));
}

TEST_CASE("swiglu forward and backward (silu(gate) * up)", "[kernels]") {
  auto be = cpu();
  // 7 x 11: one thread; 64 x 300: above kParallelMin.
  for (auto [N, F] : {std::pair<int64_t, int64_t>{7, 11}, {64, 300}}) {
    INFO("N=" << N << " F=" << F);
    auto gu = random_vector("swiglu gu", N * 2 * F, -12.f, 12.f), dout = random_vector("swiglu dout", N * F);
    std::vector<float> out(N * F), dgu(N * 2 * F, 7.f);  // overwritten, not accumulated
    ops::swiglu_forward(*be, Tensor(out.data(), DType::f32, {N, F}), Tensor(gu.data(), DType::f32, {N, 2 * F}));
    ops::swiglu_backward(*be, Tensor(dgu.data(), DType::f32, {N, 2 * F}), Tensor(gu.data(), DType::f32, {N, 2 * F}),
                         Tensor(dout.data(), DType::f32, {N, F}));
    // Tolerance: 1e-6 x (1 + |g|) x (1 + |up|): e^-g within 2 ulp, then a few f32 roundings.
    double ey = 0, eg = 0, eu = 0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < F; ++j) {
        const double g = gu[i * 2 * F + j], u = gu[i * 2 * F + F + j], d = dout[i * F + j];
        const double sig = 1 / (1 + std::exp(-g)), scale = (1 + std::fabs(g)) * (1 + std::fabs(u));
        ey = std::max(ey, std::fabs(out[i * F + j] - g * sig * u) / scale);
        eg = std::max(eg, std::fabs(dgu[i * 2 * F + j] - d * u * sig * (1 + g * (1 - sig))) / scale);
        eu = std::max(eu, std::fabs(dgu[i * 2 * F + F + j] - d * g * sig) / scale);
      }
    INFO("swiglu forward error " << ey << ", dgate " << eg << ", dup " << eu);
    CHECK(ey < 1e-6);
    CHECK(eg < 1e-6);
    CHECK(eu < 1e-6);
  }
}

namespace {
// Grouped-query causal attention in double: out, att and (for dout) dqkv, over qkv (B, T, (H + 2KV) hd).
struct AttentionReference {
  std::vector<double> out, att, dqkv;
};
AttentionReference attention_reference(const std::vector<float>& qkv, const std::vector<float>& dout, int64_t B,
                                       int64_t T, int64_t H, int64_t KV, int64_t hd) {
  const int64_t W = (H + 2 * KV) * hd, C = H * hd, group = H / KV;
  AttentionReference r{std::vector<double>(B * T * C, 0.0), std::vector<double>(B * H * T * T, 0.0),
                       std::vector<double>(B * T * W, 0.0)};
  const double scale = 1 / std::sqrt(double(hd));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t qo = h * hd, ko = C + (h / group) * hd, vo = ko + KV * hd;
      auto at = [&](int64_t t, int64_t col) { return double(qkv[(b * T + t) * W + col]); };
      std::vector<double> P(T * T, 0.0), dP(T * T, 0.0);
      for (int64_t t = 0; t < T; ++t) {
        double mx = -1e300, sum = 0;
        for (int64_t s = 0; s <= t; ++s) {
          double d = 0;
          for (int64_t j = 0; j < hd; ++j) d += at(t, qo + j) * at(s, ko + j);
          P[t * T + s] = d * scale;
          mx = std::max(mx, P[t * T + s]);
        }
        for (int64_t s = 0; s <= t; ++s) sum += (P[t * T + s] = std::exp(P[t * T + s] - mx));
        for (int64_t s = 0; s <= t; ++s) P[t * T + s] /= sum;
        for (int64_t s = 0; s <= t; ++s) {
          r.att[((b * H + h) * T + t) * T + s] = P[t * T + s];
          for (int64_t j = 0; j < hd; ++j) r.out[(b * T + t) * C + qo + j] += P[t * T + s] * at(s, vo + j);
        }
      }
      // dP = dO v^T; dS = P (dP - <P, dP>) scale; dq = dS k; dk += dS^T q; dv += P^T dO.
      for (int64_t t = 0; t < T; ++t) {
        double dot = 0;
        for (int64_t s = 0; s <= t; ++s) {
          for (int64_t j = 0; j < hd; ++j) dP[t * T + s] += dout[(b * T + t) * C + qo + j] * at(s, vo + j);
          dot += P[t * T + s] * dP[t * T + s];
        }
        for (int64_t s = 0; s <= t; ++s) {
          const double dS = P[t * T + s] * (dP[t * T + s] - dot) * scale;
          for (int64_t j = 0; j < hd; ++j) {
            r.dqkv[(b * T + t) * W + qo + j] += dS * at(s, ko + j);
            r.dqkv[(b * T + s) * W + ko + j] += dS * at(t, qo + j);
            r.dqkv[(b * T + s) * W + vo + j] += P[t * T + s] * dout[(b * T + t) * C + qo + j];
          }
        }
      }
    }
  return r;
}
}  // namespace

TEST_CASE("grouped-query attention forward and backward", "[kernels]") {
  auto be = cpu();
  struct Case {
    int64_t B, T, H, KV, hd;
  };
  // KV = H is GPT-2's multi-head attention; KV = 1 is multi-query. 2 x 72 x (8, 2) x 32 is above
  // kParallelMin, so the K/V heads run on separate threads.
  for (auto [B, T, H, KV, hd] : {Case{2, 9, 4, 2, 6}, Case{2, 9, 6, 3, 6}, Case{2, 9, 4, 1, 6}, Case{2, 9, 3, 3, 6},
                                 Case{2, 72, 8, 2, 32}}) {
    INFO("B=" << B << " T=" << T << " H=" << H << " KV=" << KV << " hd=" << hd);
    const int64_t W = (H + 2 * KV) * hd, C = H * hd;
    auto qkv = random_vector("gqa qkv", B * T * W, -2.f, 2.f), dout = random_vector("gqa dout", B * T * C);
    std::vector<float> out(B * T * C), att(B * H * T * T), dqkv(B * T * W, std::nanf("")),
        scratch(attention_scratch_elems(T, H));
    Tensor tqkv(qkv.data(), DType::f32, {B, T, W}), tatt(att.data(), DType::f32, {B, H, T, T});
    ops::attention_forward(*be, Tensor(out.data(), DType::f32, {B, T, C}), tatt, tqkv, H, KV);
    ops::attention_backward(*be, Tensor(dqkv.data(), DType::f32, {B, T, W}), Tensor(dout.data(), DType::f32, {B, T, C}),
                            tqkv, tatt, H, KV, t1(scratch));
    const AttentionReference r = attention_reference(qkv, dout, B, T, H, KV, hd);
    // Tolerances: f32 dot products of hd terms and softmax sums of T; dk and dv also sum H / KV heads.
    CHECK(max_abs_diff(att, r.att) < 1e-6);
    CHECK(max_abs_diff(out, r.out) < 1e-5);
    CHECK(max_abs_diff(dqkv, r.dqkv) < 2e-5);  // NaN (an element left unwritten) fails too
  }
}

TEST_CASE("grouped-query attention equals multi-head attention over repeated K/V heads", "[kernels]") {
  // HF's repeat_kv: query head h of a GQA model sees the multi-head model whose K/V head h is GQA's
  // head h / (H / KV). The forward matches it; backward, GQA's dk, dv are the sums of the repeats'.
  auto be = cpu();
  const int64_t B = 2, T = 9, H = 6, KV = 2, hd = 6, group = H / KV, C = H * hd, W = (H + 2 * KV) * hd;
  auto qkv = random_vector("rep qkv", B * T * W, -2.f, 2.f), dout = random_vector("rep dout", B * T * C);
  std::vector<float> mha(B * T * 3 * C);
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < hd; ++j) {
        mha[bt * 3 * C + h * hd + j] = qkv[bt * W + h * hd + j];
        mha[bt * 3 * C + C + h * hd + j] = qkv[bt * W + C + (h / group) * hd + j];
        mha[bt * 3 * C + 2 * C + h * hd + j] = qkv[bt * W + C + KV * hd + (h / group) * hd + j];
      }
  std::vector<float> out_g(B * T * C), att_g(B * H * T * T), d_g(B * T * W), out_m(B * T * C), att_m(B * H * T * T),
      d_m(B * T * 3 * C), scratch(attention_scratch_elems(T, H));
  Tensor tdout(dout.data(), DType::f32, {B, T, C});
  Tensor tq_g(qkv.data(), DType::f32, {B, T, W}), tatt_g(att_g.data(), DType::f32, {B, H, T, T});
  ops::attention_forward(*be, Tensor(out_g.data(), DType::f32, {B, T, C}), tatt_g, tq_g, H, KV);
  ops::attention_backward(*be, Tensor(d_g.data(), DType::f32, {B, T, W}), tdout, tq_g, tatt_g, H, KV, t1(scratch));
  Tensor tq_m(mha.data(), DType::f32, {B, T, 3 * C}), tatt_m(att_m.data(), DType::f32, {B, H, T, T});
  ops::attention_forward(*be, Tensor(out_m.data(), DType::f32, {B, T, C}), tatt_m, tq_m, H, H);
  ops::attention_backward(*be, Tensor(d_m.data(), DType::f32, {B, T, 3 * C}), tdout, tq_m, tatt_m, H, H, t1(scratch));
  // The same products with different leading dimensions: the GEMM library may block them
  // differently, so equal to f32 rounding rather than to the bit.
  CHECK(max_abs_diff(att_g, att_m) < 1e-6);
  CHECK(max_abs_diff(out_g, out_m) < 1e-6);
  double e = 0;
  for (int64_t bt = 0; bt < B * T; ++bt) {
    for (int64_t c = 0; c < C; ++c) e = std::max(e, std::fabs(double(d_g[bt * W + c]) - d_m[bt * 3 * C + c]));
    for (int64_t g = 0; g < KV; ++g)
      for (int64_t j = 0; j < hd; ++j) {
        double dk = 0, dv = 0;
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          dk += d_m[bt * 3 * C + C + h * hd + j];
          dv += d_m[bt * 3 * C + 2 * C + h * hd + j];
        }
        e = std::max(e, std::fabs(d_g[bt * W + C + g * hd + j] - dk));
        e = std::max(e, std::fabs(d_g[bt * W + C + KV * hd + g * hd + j] - dv));
      }
  }
  INFO("largest difference of dqkv " << e);
  CHECK(e < 2e-6);
}

TEST_CASE("attention over a KV cache computes the whole sequence's rows, in any number of steps", "[kernels]") {
  auto be = cpu();
  struct Case {
    int64_t B, T, H, KV, hd, S;
    std::vector<int64_t> steps;  // new positions per call: the first is the prefill
  };
  // MHA, GQA and MQA; a cache longer than the sequence (S > T); one position at a time, and a large
  // enough step (2 x 40 x 8 heads x 32) that the heads run on separate threads.
  for (const Case& c : {Case{2, 9, 3, 3, 6, 9, {4, 1, 1, 3}}, Case{2, 9, 4, 2, 6, 12, {1, 1, 1, 1, 1, 1, 1, 1, 1}},
                        Case{1, 7, 4, 1, 6, 7, {7}}, Case{2, 72, 8, 2, 32, 80, {30, 40, 1, 1}}}) {
    const int64_t B = c.B, T = c.T, H = c.H, KV = c.KV, hd = c.hd, S = c.S, W = (H + 2 * KV) * hd, C = H * hd;
    INFO("B=" << B << " T=" << T << " H=" << H << " KV=" << KV << " S=" << S);
    auto qkv = random_vector("cached qkv", B * T * W, -2.f, 2.f);
    const AttentionReference r = attention_reference(qkv, std::vector<float>(B * T * C, 0.f), B, T, H, KV, hd);
    std::vector<float> kc(B * S * KV * hd, std::nanf("")), vc(kc), out(B * T * C, std::nanf(""));
    Tensor tk(kc.data(), DType::f32, {B, S, KV * hd}), tv(vc.data(), DType::f32, {B, S, KV * hd});
    int64_t pos0 = 0;
    for (int64_t n : c.steps) {  // qkv's rows [pos0, pos0 + n) of each sequence, as the model makes them
      std::vector<float> part(B * n * W), part_out(B * n * C);
      for (int64_t b = 0; b < B; ++b)
        std::copy_n(qkv.begin() + (b * T + pos0) * W, n * W, part.begin() + b * n * W);
      Tensor tpart(part.data(), DType::f32, {B, n, W});
      ops::kv_cache_write(*be, tk, tv, tpart, H, KV, pos0);
      ops::attention_cached(*be, Tensor(part_out.data(), DType::f32, {B, n, C}), tpart, tk, tv, H, KV, pos0);
      for (int64_t b = 0; b < B; ++b)
        std::copy_n(part_out.begin() + b * n * C, n * C, out.begin() + (b * T + pos0) * C);
      pos0 += n;
    }
    REQUIRE(pos0 == T);
    CHECK(max_abs_diff(out, r.out) < 1e-5);  // as the whole forward's tolerance; NaN (unwritten) fails
    // The cache holds each position's K/V heads, copied exactly.
    double e = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < KV * hd; ++j) {
          e = std::max(e, std::fabs(double(kc[(b * S + t) * KV * hd + j]) - qkv[(b * T + t) * W + C + j]));
          e = std::max(e, std::fabs(double(vc[(b * S + t) * KV * hd + j]) - qkv[(b * T + t) * W + C + KV * hd + j]));
        }
    CHECK(e == 0);
  }
}

TEST_CASE("the cached attention's shapes are checked, on the meta backend too", "[kernels]") {
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(cpu());
  backends.push_back(make_meta_backend());
  for (auto& be : backends) {
    const int64_t B = 1, T = 2, H = 4, KV = 2, hd = 6, S = 8;
    std::vector<float> qkv(B * T * (H + 2 * KV) * hd), kv(B * S * KV * hd), out(B * T * H * hd);
    const Device d = be->device();
    Tensor tq(qkv.data(), DType::f32, {B, T, (H + 2 * KV) * hd}, d), tk(kv.data(), DType::f32, {B, S, KV * hd}, d),
        to(out.data(), DType::f32, {B, T, H * hd}, d);
    CHECK_NOTHROW(ops::kv_cache_write(*be, tk, tk, tq, H, KV, S - T));
    CHECK_NOTHROW(ops::attention_cached(*be, to, tq, tk, tk, H, KV, S - T));
    CHECK_THROWS_WITH(ops::kv_cache_write(*be, tk, tk, tq, H, KV, S - T + 1), Catch::Contains("pos0=7"));
    CHECK_THROWS_WITH(ops::attention_cached(*be, to, tq, tk, tk, H, KV, S - 1), Catch::Contains("attention_cached"));
    CHECK_THROWS_WITH(ops::attention_cached(*be, to, tq, tk, tk, H, H,
                                            0), Catch::Contains("k_cache"));  // KV heads wrong
    Tensor short_out(out.data(), DType::f32, {B, T - 1, H * hd}, d);
    CHECK_THROWS_WITH(ops::attention_cached(*be, short_out, tq, tk, tk, H, KV, 0), Catch::Contains("out"));
  }
}

TEST_CASE("embedding without learned positions (empty wpe)", "[kernels]") {
  auto be = cpu();
  const int64_t B = 2, T = 3, C = 5, V = 4;
  auto wte = random_vector("wte nopos", V * C), dout = random_vector("demb nopos", B * T * C);
  auto dwte0 = random_vector("dwte0 nopos", V * C);
  std::vector<int32_t> tok = {3, 0, 3, 1, 3, 2};
  std::vector<float> out(B * T * C, 9.f), dwte = dwte0;
  ops::embedding_forward(*be, t1(out), tok.data(), B, T, Tensor(wte.data(), DType::f32, {V, C}), Tensor());
  ops::embedding_backward(*be, Tensor(dwte.data(), DType::f32, {V, C}), Tensor(), t1(dout), tok.data(), B, T);
  std::vector<double> rdwte(dwte0.begin(), dwte0.end());
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t c = 0; c < C; ++c) {
      CHECK(out[bt * C + c] == wte[tok[bt] * C + c]);
      rdwte[tok[bt] * C + c] += dout[bt * C + c];
    }
  CHECK(max_abs_diff(dwte, rdwte) < 1e-6);  // onto the values it held; token 3 three times
}

TEST_CASE("the meta backend checks the Llama operations' shapes and computes nothing", "[kernels]") {
  auto meta = make_meta_backend();
  // Addresses the meta backend hands out: any touch would fault.
  auto fake = [&](std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return Tensor(meta->raw_alloc(static_cast<size_t>(n) * 4), DType::f32, shape, Device::meta);
  };
  const int64_t N = 7, C = 13, F = 11;
  Tensor x = fake({N, C}), w = fake({C}), rstd = fake({N}), gu = fake({N, 2 * F}), h = fake({N, F});
  CHECK_NOTHROW(ops::rmsnorm_forward(*meta, x, rstd, x, w, 1e-5f));
  CHECK_NOTHROW(ops::rmsnorm_backward(*meta, x, w, x, x, w, rstd));
  CHECK_THROWS_WITH(ops::rmsnorm_forward(*meta, x, fake({N + 1}), x, w, 1e-5f), Catch::Contains("rmsnorm_forward"));
  CHECK_THROWS_WITH(ops::rmsnorm_backward(*meta, x, fake({C + 1}), x, x, w, rstd), Catch::Contains("rmsnorm_backward"));
  CHECK_NOTHROW(ops::swiglu_forward(*meta, h, gu));
  CHECK_NOTHROW(ops::swiglu_backward(*meta, gu, gu, h));
  CHECK_THROWS_WITH(ops::swiglu_forward(*meta, h, fake({N, F})), Catch::Contains("swiglu_forward"));
  CHECK_THROWS_WITH(ops::swiglu_backward(*meta, fake({N, F}), gu, h), Catch::Contains("swiglu_backward"));
  Tensor qkv = fake({2, 9, 4 * 6 + 2 * 2 * 6});
  CHECK_NOTHROW(ops::rope(*meta, qkv, 4 + 2, 6, rope_freqs(6, 1e4), 3, false));  // q and k heads of a fused qkv
  CHECK_THROWS_WITH(ops::rope(*meta, qkv, 4, 6, rope_freqs(8, 1e4), 3, true), Catch::Contains("freqs for 4 pairs"));
}
