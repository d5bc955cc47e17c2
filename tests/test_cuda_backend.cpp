// Every CUDA backend op against the CPU backend on the same inputs. Tolerances per op below.
#include <catch2/catch.hpp>
#include <cmath>

#include "memory/pool.hpp"
#include "tests/test_util.hpp"

using namespace shardlab;
using shardlab::test::random_vector;

namespace {

struct Env {
  std::unique_ptr<Backend> gpu = make_cuda_backend(BackendConfig{});
  std::unique_ptr<Backend> cpu = make_cpu_backend(BackendConfig{});
  Pool pool{*gpu};

  // A device copy of host data in any dtype.
  Block upload(const std::vector<float>& host, DType t, const char* tag) {
    Block b = pool.alloc(t, static_cast<int64_t>(host.size()), Category::workspace, tag);
    Block staging = pool.alloc(DType::f32, static_cast<int64_t>(host.size()), Category::workspace, "staging");
    Tensor hs = Tensor::flat(const_cast<float*>(host.data()), DType::f32, static_cast<int64_t>(host.size()));
    gpu->copy(staging.flat(DType::f32), hs);
    gpu->cast(dev(b, t, host.size()), staging.flat(DType::f32));
    return b;
  }
  std::vector<float> download(const Block& b, DType t, size_t n) {
    Block staging = pool.alloc(DType::f32, static_cast<int64_t>(n), Category::workspace, "staging");
    gpu->cast(staging.flat(DType::f32), dev(b, t, n));
    std::vector<float> host(n);
    gpu->copy(Tensor::flat(host.data(), DType::f32, static_cast<int64_t>(n)), staging.flat(DType::f32));
    return host;
  }
  static Tensor dev(const Block& b, DType t, size_t n) { return b.flat(t).slice(0, static_cast<int64_t>(n)); }
};

Tensor host(std::vector<float>& v) { return Tensor::flat(v.data(), DType::f32, static_cast<int64_t>(v.size())); }

}  // namespace

TEST_CASE("cuda gemm matches the cpu backend (f32 and bf16 inputs)", "[cuda]") {
  Env e;
  for (DType ab : {DType::f32, DType::bf16})
    for (int t = 0; t < 4; ++t) {
      GemmDesc d;
      d.trans_a = (t & 2) ? Trans::T : Trans::N;
      d.trans_b = (t & 1) ? Trans::T : Trans::N;
      d.m = 67, d.n = 45, d.k = 129, d.batch = 2;
      d.lda = d.trans_a == Trans::N ? d.k : d.m;
      d.ldb = d.trans_b == Trans::N ? d.n : d.k;
      d.ldc = d.n;
      d.stride_a = d.m * d.k, d.stride_b = d.k * d.n, d.stride_c = d.m * d.n;
      d.ab_type = ab;
      auto A = random_vector("cA", d.stride_a * 2), B = random_vector("cB", d.stride_b * 2);
      // The reference sees the inputs as the GPU does: rounded to the input dtype.
      for (auto& v : A) v = test::round_to(v, ab);
      for (auto& v : B) v = test::round_to(v, ab);
      std::vector<float> ref(d.stride_c * 2);
      GemmDesc dc = d;
      dc.ab_type = DType::f32;
      e.cpu->gemm(dc, A.data(), B.data(), ref.data());
      Block a = e.upload(A, ab, "A"), b = e.upload(B, ab, "B");
      Block c = e.pool.alloc(DType::f32, d.stride_c * 2, Category::workspace, "C");
      e.gpu->gemm(d, a.data(), b.data(), c.data());
      auto got = e.download(c, DType::f32, ref.size());
      double max_err = 0;
      for (size_t i = 0; i < ref.size(); ++i) max_err = std::max(max_err, std::fabs(double(got[i]) - ref[i]));
      INFO(dtype_name(ab) << " trans " << t << " max abs error " << max_err);
      CHECK(max_err <= 1e-3);  // f32 accumulation of 129 products; TF32 is not enabled
    }
}

TEST_CASE("cuda element-wise ops, casts and reductions match the cpu backend", "[cuda]") {
  Env e;
  const size_t n = (1 << 20) + 5;
  auto x = random_vector("cx", n), y = random_vector("cy", n);
  Block gx = e.upload(x, DType::f32, "x"), gy = e.upload(y, DType::f32, "y");
  Tensor tx = Env::dev(gx, DType::f32, n), ty = Env::dev(gy, DType::f32, n);

  e.gpu->axpy(0.25f, tx, ty);
  e.cpu->axpy(0.25f, host(x), host(y));
  auto got = e.download(gy, DType::f32, n);
  for (size_t i = 0; i < n; ++i) REQUIRE(got[i] == Approx(y[i]).epsilon(1e-6).margin(1e-7));

  e.gpu->scale(tx, -3.f);
  e.cpu->scale(host(x), -3.f);
  got = e.download(gx, DType::f32, n);
  for (size_t i = 0; i < n; ++i) REQUIRE(got[i] == x[i]);

  e.gpu->mul(tx, ty, ty);
  e.cpu->mul(host(x), host(y), host(y));
  got = e.download(gy, DType::f32, n);
  for (size_t i = 0; i < n; ++i) REQUIRE(got[i] == y[i]);

  Block out = e.pool.alloc(DType::f32, 1, Category::workspace, "out");
  Tensor to = out.flat(DType::f32);
  std::vector<float> ref(1);
  e.gpu->sum_squares(tx, to, false);
  e.cpu->sum_squares(host(x), host(ref), false);
  CHECK(e.download(out, DType::f32, 1)[0] == Approx(ref[0]).epsilon(1e-6));
  e.gpu->sum(tx, to, false);
  e.cpu->sum(host(x), host(ref), false);
  CHECK(e.download(out, DType::f32, 1)[0] == Approx(ref[0]).epsilon(1e-5));
  e.gpu->max_abs(tx, to, false);
  e.cpu->max_abs(host(x), host(ref), false);
  CHECK(e.download(out, DType::f32, 1)[0] == ref[0]);

  // Casts round exactly as the CPU does (round to nearest even).
  for (DType t : {DType::bf16, DType::f16}) {
    Block c = e.upload(x, t, "cast");
    auto back = e.download(c, t, n);
    for (size_t i = 0; i < n; ++i) REQUIRE(back[i] == test::round_to(x[i], t));
  }

  const int64_t rows = 300, cols = 1000;
  auto m = random_vector("cm", rows * cols);
  Block gm = e.upload(m, DType::f32, "m");
  Block gs = e.pool.alloc(DType::f32, cols, Category::workspace, "colsum");
  std::vector<float> cs(cols);
  e.gpu->sum_rows(Tensor(gm.data(), DType::f32, {rows, cols}, Device::cuda), gs.flat(DType::f32), false);
  e.cpu->sum_rows(Tensor(m.data(), DType::f32, {rows, cols}), host(cs), false);
  got = e.download(gs, DType::f32, cols);
  for (int64_t c = 0; c < cols; ++c) REQUIRE(got[c] == Approx(cs[c]).epsilon(1e-6).margin(1e-6));
}
