// The CPU backend's GPT-2 kernels against naive double-precision references. (The whole model is
// also checked against PyTorch in test_model_reference.cpp.)
#include <catch2/catch.hpp>
#include <cmath>

#include "src/backend/backend.hpp"
#include "tests/test_util.hpp"

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
  be->gelu_forward(t1(y), t1(x));
  be->gelu_backward(t1(dx), t1(x), t1(dout));
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
  be->layernorm_forward(t1(y), t1(mean), t1(rstd), t1(x), t1(w), t1(b), 1e-5f);
  be->layernorm_backward(t1(dx), t1(dw), t1(db), t1(dout), t1(x), t1(w), t1(mean), t1(rstd));
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
  be->attention_forward(Tensor(out.data(), DType::f32, {B, T, C}), Tensor(att.data(), DType::f32, {B, H, T, T}),
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
  be->cross_entropy(t1(loss), t1(dl), t1(logits), tgt.data(), 0.5f);
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
  CHECK_THROWS_WITH(be->cross_entropy(t1(loss), t1(dl), t1(logits), bad.data(), 1.f),
                    Catch::Contains("target id 50 at position 1 outside vocabulary of 50"));
}

TEST_CASE("embedding forward and backward", "[kernels]") {
  auto be = cpu();
  const int64_t B = 2, T = 3, C = 4, V = 5;
  auto wte = random_vector("wte", V * C), wpe = random_vector("wpe", T * C), dout = random_vector("demb", B * T * C);
  std::vector<int32_t> tok = {1, 4, 1, 0, 1, 2};
  std::vector<float> out(B * T * C), dwte(V * C, 0.f), dwpe(T * C, 0.f);
  Tensor twte(wte.data(), DType::f32, {V, C}), twpe(wpe.data(), DType::f32, {T, C});
  be->embedding_forward(t1(out), tok.data(), B, T, twte, twpe);
  be->embedding_backward(Tensor(dwte.data(), DType::f32, {V, C}), Tensor(dwpe.data(), DType::f32, {T, C}), t1(dout),
                         tok.data(), B, T);
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
  CHECK_THROWS_WITH(be->embedding_forward(t1(out), bad.data(), B, T, twte, twpe),
                    Catch::Contains("token id 5 at position 2 outside vocabulary of 5"));
}
