// Every CPU backend op against a naive reference. Tolerances are stated per op.
#include <catch2/catch.hpp>
#include <bit>
#include <cmath>

#include "src/backend/backend.hpp"
#include "tests/test_util.hpp"

using namespace shardlab;
using shardlab::test::gemm_reference;
using shardlab::test::random_vector;

namespace {

Tensor t1(std::vector<float>& v) { return Tensor::flat(v.data(), DType::f32, static_cast<int64_t>(v.size())); }

std::unique_ptr<Backend> cpu(int threads = 2) {
  BackendConfig cfg;
  cfg.threads = threads;
  return make_cpu_backend(cfg);
}

}  // namespace

TEST_CASE("cpu gemm: every transpose combination, padded strides, batches", "[backend][gemm]") {
  auto be = cpu();
  const int64_t m = 37, n = 29, k = 53, batch = 3;
  // Tolerance: inputs in [-1, 1), k = 53 products in f32: |error| <= 1e-4 absolute.
  const double tol = 1e-4;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      GemmDesc d;
      d.trans_a = ta ? Trans::T : Trans::N;
      d.trans_b = tb ? Trans::T : Trans::N;
      d.m = m, d.n = n, d.k = k;
      d.alpha = 0.75f;
      d.beta = 0.5f;
      d.lda = (ta ? m : k) + 3;  // leading dimensions wider than the matrix
      d.ldb = (tb ? k : n) + 5;
      d.ldc = n + 2;
      d.batch = batch;
      int64_t a_rows = ta ? k : m, b_rows = tb ? n : k;
      d.stride_a = a_rows * d.lda + 7;
      d.stride_b = b_rows * d.ldb + 1;
      d.stride_c = m * d.ldc + 4;
      auto A = random_vector("A", static_cast<size_t>(d.stride_a * batch));
      auto B = random_vector("B", static_cast<size_t>(d.stride_b * batch));
      auto C = random_vector("C", static_cast<size_t>(d.stride_c * batch));
      auto ref = C;
      be->gemm(d, A.data(), B.data(), C.data());
      for (int64_t b = 0; b < batch; ++b)
        gemm_reference(d, A.data() + b * d.stride_a, B.data() + b * d.stride_b, ref.data() + b * d.stride_c);
      double max_err = 0;
      for (size_t i = 0; i < C.size(); ++i) max_err = std::max(max_err, std::fabs(double(C[i]) - ref[i]));
      INFO("trans_a=" << ta << " trans_b=" << tb << " max abs error " << max_err);
      CHECK(max_err <= tol);
    }
}

TEST_CASE("cpu gemm rejects bad shapes and types", "[backend][gemm]") {
  auto be = cpu();
  std::vector<float> a(16), b(16), c(16);
  GemmDesc d;
  d.m = d.n = d.k = 4;
  d.lda = 3;  // smaller than k
  d.ldb = d.ldc = 4;
  CHECK_THROWS_WITH(be->gemm(d, a.data(), b.data(), c.data()), Catch::Contains("lda=3 < 4 columns of A"));
  d.lda = 4;
  d.a_type = d.b_type = DType::bf16;
  CHECK_THROWS_WITH(be->gemm(d, a.data(), b.data(), c.data()), Catch::Contains("cpu gemm computes f32 only"));
}

TEST_CASE("cpu element-wise ops, on both the serial and the threaded path", "[backend]") {
  auto be = cpu();
  for (size_t n : {size_t(1), size_t(1000), size_t((1 << 16) + 3)}) {
    auto x = random_vector("x", n), y = random_vector("y", n);
    auto y0 = y;
    be->axpy(-0.3f, t1(x), t1(y));
    // Tolerance: one fused or unfused multiply-add per element: 1 ulp of f32.
    for (size_t i = 0; i < n; ++i) REQUIRE(y[i] == Approx(y0[i] - 0.3f * x[i]).epsilon(1e-6).margin(1e-7));
    auto s = x;
    be->scale(t1(s), 2.5f);
    for (size_t i = 0; i < n; ++i) REQUIRE(s[i] == 2.5f * x[i]);  // exact: one rounding either way
    std::vector<float> out(n);
    be->add(t1(x), t1(y0), t1(out));
    for (size_t i = 0; i < n; ++i) REQUIRE(out[i] == x[i] + y0[i]);
    be->mul(t1(x), t1(y0), t1(out));
    for (size_t i = 0; i < n; ++i) REQUIRE(out[i] == x[i] * y0[i]);
    auto prod = out;  // stored products: an expression x*y+z here could be contracted to an FMA
    be->add(t1(x), t1(out), t1(out));  // output aliasing an input
    for (size_t i = 0; i < n; ++i) REQUIRE(out[i] == x[i] + prod[i]);
  }
  std::vector<float> a(3), b(4);
  CHECK_THROWS_WITH(be->add(t1(a), t1(b), t1(a)), Catch::Contains("element counts differ: 3 (3) vs 4 (4)"));
}

TEST_CASE("cpu fill and cast across f32, bf16 and f16", "[backend]") {
  auto be = cpu();
  const size_t n = (1 << 15) + 77;  // more than one cast chunk, threaded
  auto src = random_vector("cast", n, -300.f, 300.f);
  const DType types[] = {DType::f32, DType::bf16, DType::f16};
  for (DType from : types)
    for (DType to : types) {
      std::vector<uint8_t> a(n * dtype_size(from)), b(n * dtype_size(to));
      Tensor ta = Tensor::flat(a.data(), from, n), tb = Tensor::flat(b.data(), to, n);
      be->cast(ta, t1(src));
      be->cast(tb, ta);
      std::vector<float> got(n);
      be->cast(t1(got), tb);
      // Reference: the scalar conversions, applied element by element in the same order.
      for (size_t i = 0; i < n; ++i)
        REQUIRE(got[i] == test::round_to(test::round_to(src[i], from), to));
    }
  for (DType t : types) {
    std::vector<uint8_t> buf(100 * dtype_size(t));
    Tensor tt = Tensor::flat(buf.data(), t, 100);
    be->fill(tt, 0.1f);
    std::vector<float> back(100);
    be->cast(t1(back), tt);
    for (float v : back) REQUIRE(v == test::round_to(0.1f, t));
  }
}

TEST_CASE("cpu cast_ranges widens only the ranges asked, the rest of the destination untouched", "[backend]") {
  auto be = cpu();
  const int64_t n = 1000;
  auto src = random_vector("cast ranges", n, -3.f, 3.f);
  std::vector<uint16_t> bits(n);
  Tensor t16 = Tensor::flat(bits.data(), DType::bf16, n);
  be->cast(t16, t1(src));
  std::vector<float> out(n, -7.f);
  const std::vector<ElemRange> ranges{{0, 5}, {10, 0}, {100, 300}, {999, 1}};
  be->cast_ranges(t1(out), t16, ranges);
  for (int64_t i = 0; i < n; ++i) {
    const bool in = i < 5 || (i >= 100 && i < 400) || i == 999;
    INFO("element " << i);
    REQUIRE(out[i] == (in ? test::round_to(src[i], DType::bf16) : -7.f));
  }
  const std::vector<ElemRange> outside{{990, 11}};
  CHECK_THROWS(be->cast_ranges(t1(out), t16, outside));
}

TEST_CASE("cpu add_into rounds the f32 sum once to the destination's dtype", "[backend]") {
  auto be = cpu();
  const size_t n = (1 << 13) + 77;  // more than one chunk, threaded
  auto dst0 = random_vector("add_into dst", n, -3.f, 3.f), src0 = random_vector("add_into src", n, -1e-2f, 1e-2f);
  dst0[0] = 0.f, src0[0] = -0.f;  // 0 + -0 = +0, as the widened sum gives
  for (DType dt : {DType::f32, DType::bf16})
    for (DType st : {DType::f32, DType::bf16}) {
      INFO(dtype_name(dt) << " += " << dtype_name(st));
      std::vector<uint8_t> d(n * dtype_size(dt)), s(n * dtype_size(st));
      Tensor td = Tensor::flat(d.data(), dt, n), ts = Tensor::flat(s.data(), st, n);
      be->cast(td, t1(dst0));
      be->cast(ts, t1(src0));
      be->add_into(td, ts);
      std::vector<float> got(n);
      be->cast(t1(got), td);
      // Reference: the scalar conversions around one f32 sum (small addends: bf16 rounding shows).
      for (size_t i = 0; i < n; ++i) {
        const float want = test::round_to(test::round_to(dst0[i], dt) + test::round_to(src0[i], st), dt);
        REQUIRE(std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want));
      }
    }
  std::vector<float> a(4), b(5);
  CHECK_THROWS_AS(be->add_into(t1(a), t1(b)), InternalError);
}

TEST_CASE("cpu reductions accumulate in double", "[backend]") {
  auto be = cpu();
  for (size_t n : {size_t(5), size_t((1 << 20) + 11)}) {
    auto x = random_vector("red", n, -2.f, 1.f);
    double s = 0, ss = 0, m = 0;
    for (float v : x) {
      s += v;
      ss += double(v) * v;
      m = std::max(m, double(std::fabs(v)));
    }
    std::vector<float> out(1, 0.f);
    // Tolerance: the double sum rounded once to f32 (the order of summation differs): 1e-6 relative.
    be->sum(t1(x), t1(out), false);
    CHECK(out[0] == Approx(s).epsilon(1e-6));
    be->sum_squares(t1(x), t1(out), false);
    CHECK(out[0] == Approx(ss).epsilon(1e-6));
    be->sum_squares(t1(x), t1(out), true);
    CHECK(out[0] == Approx(2 * ss).epsilon(1e-6));
    be->max_abs(t1(x), t1(out), false);
    CHECK(out[0] == static_cast<float>(m));
    out[0] = 1e9f;
    be->max_abs(t1(x), t1(out), true);
    CHECK(out[0] == 1e9f);
  }
}

TEST_CASE("cpu sum_rows gives column sums (bias gradients)", "[backend]") {
  auto be = cpu();
  const int64_t rows = 513, cols = 300;  // crosses the 256-column blocks
  auto x = random_vector("rows", rows * cols);
  std::vector<float> out(cols, 0.f), init = random_vector("init", cols);
  Tensor tx(x.data(), DType::f32, {rows, cols});
  for (bool acc : {false, true}) {
    out = init;
    be->sum_rows(tx, t1(out), acc);
    for (int64_t c = 0; c < cols; ++c) {
      double s = acc ? init[c] : 0.0;
      for (int64_t r = 0; r < rows; ++r) s += x[r * cols + c];
      REQUIRE(out[c] == Approx(s).epsilon(1e-6).margin(1e-6));
    }
  }
}

// bf16 rows (cuDNN's d(q k v) on a GPU): each element widened exactly, the same double sums as
// over its f32 values.
TEST_CASE("cpu sum_rows of bf16 rows sums their exact values", "[backend]") {
  auto be = cpu();
  const int64_t rows = 77, cols = 300;
  auto x = random_vector("bf16 rows", rows * cols);
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) bits[i] = f32_to_bf16_bits(x[i]), x[i] = bf16_bits_to_f32(bits[i]);
  std::vector<float> got(cols, 0.f), want(cols, 0.f);
  be->sum_rows(Tensor(bits.data(), DType::bf16, {rows, cols}), t1(got), false);
  be->sum_rows(Tensor(x.data(), DType::f32, {rows, cols}), t1(want), false);
  CHECK(got == want);
  CHECK_THROWS(be->sum_rows(Tensor(bits.data(), DType::f16, {rows, cols}), t1(got), false));
}

TEST_CASE("cpu backend threads and copies", "[backend]") {
  CHECK(cpu(3)->threads() == 3);
  CHECK(default_cpu_threads(1) >= 1);
  CHECK(default_cpu_threads(1000) == 1);
  auto be = cpu();
  std::vector<float> a = {1, 2, 3}, b(3);
  be->copy(t1(b), t1(a));
  CHECK(b == a);
  CHECK(be->record(StreamKind::comm)->done());  // CPU work is synchronous
  CHECK_THROWS_WITH(parse_device("tpu"), Catch::Contains("unknown device 'tpu'"));
}
