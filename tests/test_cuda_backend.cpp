// Every CUDA backend op against the CPU backend on the same inputs. Tolerances per op below.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "memory/pool.hpp"
#include "src/model/spec.hpp"
#include "tests/test_util.hpp"
#include "src/backend/ops/activation.hpp"
#include "src/model/blocks/linear.hpp"
#include "src/backend/ops/attention.hpp"
#include "src/backend/ops/cudnn_attention.hpp"
#include "src/backend/ops/flash_attention.hpp"
#include "src/backend/ops/embedding.hpp"
#include "src/backend/ops/kv_cache.hpp"
#include "src/backend/ops/loss.hpp"
#include "src/backend/ops/norm.hpp"
#include "src/backend/ops/optimizer.hpp"
#include "src/backend/ops/rope.hpp"

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
      d.a_type = d.b_type = ab;
      auto A = random_vector("cA", d.stride_a * 2), B = random_vector("cB", d.stride_b * 2);
      // The reference sees the inputs as the GPU does: rounded to the input dtype.
      for (auto& v : A) v = test::round_to(v, ab);
      for (auto& v : B) v = test::round_to(v, ab);
      std::vector<float> ref(d.stride_c * 2);
      GemmDesc dc = d;
      dc.a_type = dc.b_type = DType::f32;
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

TEST_CASE("cuda gemm: an f32 activation meets a bf16 weight, rounded to bf16 first (round_inputs_to)", "[cuda]") {
  Env e;
  REQUIRE(e.gpu->low_precision_gemm());
  for (int t = 0; t < 4; ++t) {
    GemmDesc d;
    d.trans_a = (t & 2) ? Trans::T : Trans::N;
    d.trans_b = (t & 1) ? Trans::T : Trans::N;
    d.m = 67, d.n = 45, d.k = 129;
    d.lda = d.trans_a == Trans::N ? d.k : d.m;
    d.ldb = d.trans_b == Trans::N ? d.n : d.k;
    d.ldc = d.n;
    d.beta = 1.f;  // accumulates, as a weight gradient does
    auto A = random_vector("mA", d.m * d.k), B = random_vector("mB", d.k * d.n), C0 = random_vector("mC", d.m * d.n);
    for (auto& v : B) v = test::round_to(v, DType::bf16);
    std::vector<float> Ar = A, ref = C0;  // the reference sees A rounded, as the GPU rounds it
    for (auto& v : Ar) v = test::round_to(v, DType::bf16);
    GemmDesc dc = d;
    e.cpu->gemm(dc, Ar.data(), B.data(), ref.data());
    Block a = e.upload(A, DType::f32, "A"), b = e.upload(B, DType::bf16, "B"), c = e.upload(C0, DType::f32, "C");
    d.b_type = DType::bf16;
    d.round_inputs_to = DType::bf16;
    e.gpu->gemm(d, a.data(), b.data(), c.data());
    auto got = e.download(c, DType::f32, ref.size());
    double max_err = 0;
    for (size_t i = 0; i < ref.size(); ++i) max_err = std::max(max_err, std::fabs(double(got[i]) - ref[i]));
    INFO("trans " << t << " max abs error " << max_err);
    CHECK(max_err <= 1e-3);  // products of bf16 values are exact in f32; only the summation order differs
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

  e.gpu->add(tx, ty, ty);
  e.cpu->add(host(x), host(y), host(y));
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
  // bf16 read as it is (the gradient norm of bf16 gradients): the same bits as of its f32 widening
  // on the GPU, accumulated onto what out holds.
  {
    CHECK(e.gpu->reduces_bf16());
    Block xb = e.upload(x, DType::bf16, "x bf16");
    const std::vector<float> widened = e.download(xb, DType::bf16, n);
    Block xw = e.upload(widened, DType::f32, "x widened");
    for (auto reduce : {&Backend::sum, &Backend::sum_squares, &Backend::max_abs}) {
      ((*e.gpu).*reduce)(Env::dev(xw, DType::f32, n), to, false);
      ((*e.gpu).*reduce)(Env::dev(xw, DType::f32, n), to, true);
      const float want = e.download(out, DType::f32, 1)[0];
      ((*e.gpu).*reduce)(Env::dev(xb, DType::bf16, n), to, false);
      ((*e.gpu).*reduce)(Env::dev(xb, DType::bf16, n), to, true);
      CHECK(e.download(out, DType::f32, 1)[0] == want);
    }
  }

  // Casts round exactly as the CPU does (round to nearest even).
  for (DType t : {DType::bf16, DType::f16}) {
    Block c = e.upload(x, t, "cast");
    auto back = e.download(c, t, n);
    for (size_t i = 0; i < n; ++i) REQUIRE(back[i] == test::round_to(x[i], t));
  }

  // Column sums in two stages (a chunk of rows per block, then the chunks folded): one row, a chunk
  // shorter than a block's rows, ragged tiles and chunks, a bias gradient's shape; with accumulate.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 7}, {33, 5}, {300, 1000}, {4100, 768}}) {
    INFO("sum_rows " << rows << " x " << cols);
    auto m = random_vector("cm", rows * cols);
    Block gm = e.upload(m, DType::f32, "m");
    for (bool acc : {false, true}) {
      std::vector<float> cs = random_vector("cs", cols);
      Block gs = e.upload(cs, DType::f32, "colsum");
      e.gpu->sum_rows(Tensor(gm.data(), DType::f32, {rows, cols}, Device::cuda), gs.flat(DType::f32), acc);
      e.cpu->sum_rows(Tensor(m.data(), DType::f32, {rows, cols}), host(cs), acc);
      got = e.download(gs, DType::f32, cols);
      for (int64_t c = 0; c < cols; ++c) REQUIRE(got[c] == Approx(cs[c]).epsilon(1e-6).margin(1e-5));
    }
    // The same rows in bf16 (cuDNN's d(q k v)), against the CPU's sums of their bf16 values.
    Block gb = e.upload(m, DType::bf16, "m bf16");
    std::vector<float> rounded(m.size());
    for (size_t i = 0; i < m.size(); ++i) rounded[i] = test::round_to(m[i], DType::bf16);
    std::vector<float> cb(cols, 0.f);
    Block gbs = e.upload(cb, DType::f32, "colsum bf16");
    e.gpu->sum_rows(Tensor(gb.data(), DType::bf16, {rows, cols}, Device::cuda), gbs.flat(DType::f32), false);
    e.cpu->sum_rows(Tensor(rounded.data(), DType::f32, {rows, cols}), host(cb), false);
    got = e.download(gbs, DType::f32, cols);
    for (int64_t c = 0; c < cols; ++c) REQUIRE(got[c] == Approx(cb[c]).epsilon(1e-6).margin(1e-5));
  }

  // fill, in every dtype.
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    Block f = e.upload(x, t, "fill");
    e.gpu->fill(Env::dev(f, t, n), -0.3f);
    auto filled = e.download(f, t, n);
    for (size_t i = 0; i < n; ++i) REQUIRE(filled[i] == test::round_to(-0.3f, t));
  }
}

// ---- the layers' operations and the optimizers against the CPU backend ------------------------
// Tolerances: |gpu - cpu| <= abs + rel * |cpu| per element, stated at each check. TF32 is off, so
// GEMM-based ops differ from the CPU only by summation order.

namespace {

using Ids = std::vector<int32_t>;

Block up(Env& e, const std::vector<float>& v, const char* tag) { return e.upload(v, DType::f32, tag); }
std::vector<float> down(Env& e, const Block& b, size_t n) { return e.download(b, DType::f32, n); }
Tensor host2(std::vector<float>& v, int64_t rows, int64_t cols) { return Tensor(v.data(), DType::f32, {rows, cols}); }

// n token ids in [0, V), with the last one repeating the first so that some row is hit twice.
Ids random_ids(const std::string& name, int64_t n, int64_t V) {
  auto u = random_vector(name, static_cast<size_t>(n), 0.f, static_cast<float>(V));
  Ids ids(u.size());
  for (size_t i = 0; i < u.size(); ++i) ids[i] = std::min(static_cast<int32_t>(V - 1), static_cast<int32_t>(u[i]));
  if (n > 1) ids.back() = ids.front();
  return ids;
}

// Every element within abs + rel * |ref|; reports the count, the max error and the first mismatches.
void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double rel, double abs,
                  const std::string& what) {
  REQUIRE(got.size() == ref.size());
  size_t bad = 0;
  double max_err = 0;
  std::ostringstream first;
  for (size_t i = 0; i < ref.size(); ++i) {
    double err = std::fabs(double(got[i]) - double(ref[i]));
    max_err = std::max(max_err, err);
    if (!(err <= abs + rel * std::fabs(double(ref[i])))) {
      if (bad < 5) first << " [" << i << "] gpu " << got[i] << " cpu " << ref[i] << ";";
      ++bad;
    }
  }
  INFO(what << ": " << bad << " of " << ref.size() << " outside tolerance, max abs error " << max_err << first.str());
  CHECK(bad == 0);
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("cuda embedding forward and backward match the cpu bit for bit", "[cuda]") {
  Env e;
  struct Shape { int64_t B, T, C, V; };
  // C = 130 takes the scalar path of the forward; 64 and 36 the float4 one.
  for (Shape s : {Shape{2, 17, 64, 50}, Shape{3, 1, 36, 1003}, Shape{2, 64, 130, 1003}}) {
    const int64_t B = s.B, T = s.T, C = s.C, V = s.V, maxT = T + 3, BT = B * T;
    INFO("B=" << B << " T=" << T << " C=" << C << " V=" << V);
    Ids tokens = random_ids("etok", BT, V);
    auto wte = random_vector("ewte", V * C), wpe = random_vector("ewpe", maxT * C);
    std::vector<float> out(BT * C);
    ops::embedding_forward(*e.cpu, host2(out, BT, C), tokens.data(), B, T, host2(wte, V, C), host2(wpe, maxT, C));
    Block gwte = up(e, wte, "wte"), gwpe = up(e, wpe, "wpe");
    Block gout = e.pool.alloc(DType::f32, BT * C, Category::workspace, "out");
    ops::embedding_forward(*e.gpu, gout.view(DType::f32, {BT, C}), tokens.data(), B, T, gwte.view(DType::f32, {V, C}),
                           gwpe.view(DType::f32, {maxT, C}));
    CHECK(bit_equal(down(e, gout, out.size()), out));  // tolerance 0: one add per element

    // Backward accumulates into random gradients. Both backends add each position's row in
    // ascending position order, so they agree bit for bit (tolerance 0).
    auto dout = random_vector("edout", BT * C);
    auto dwte = random_vector("edwte", V * C), dwpe = random_vector("edwpe", maxT * C);
    Block gdout = up(e, dout, "dout");
    auto run_gpu = [&] {
      Block gdwte = up(e, dwte, "dwte"), gdwpe = up(e, dwpe, "dwpe");
      ops::embedding_backward(*e.gpu, gdwte.view(DType::f32, {V, C}), gdwpe.view(DType::f32, {maxT, C}),
                              gdout.view(DType::f32, {BT, C}), tokens.data(), B, T);
      return std::pair{down(e, gdwte, dwte.size()), down(e, gdwpe, dwpe.size())};
    };
    auto [got_dwte, got_dwpe] = run_gpu();
    auto [again_dwte, again_dwpe] = run_gpu();
    ops::embedding_backward(*e.cpu, host2(dwte, V, C), host2(dwpe, maxT, C), host2(dout, BT, C), tokens.data(), B, T);
    CHECK(bit_equal(got_dwte, dwte));
    CHECK(bit_equal(got_dwpe, dwpe));
    // Determinism: repeated tokens, no atomics: the second run gives the same bits.
    CHECK(bit_equal(got_dwte, again_dwte));
    CHECK(bit_equal(got_dwpe, again_dwpe));
  }
}

TEST_CASE("cuda kernels reject token ids outside the vocabulary", "[cuda]") {
  Env e;
  const int64_t V = 10, C = 8;
  Block wte = e.pool.alloc(DType::f32, V * C, Category::workspace, "wte");
  Block out = e.pool.alloc(DType::f32, 2 * C, Category::workspace, "out");
  Ids bad{3, 10};
  CHECK_THROWS_AS(ops::embedding_forward(*e.gpu, out.view(DType::f32, {2, C}), bad.data(), 1, 2,
                                         wte.view(DType::f32, {V, C}), wte.view(DType::f32, {V, C})),
                  InternalError);
  Block losses = e.pool.alloc(DType::f32, 2, Category::workspace, "losses");
  Ids negative{-1, 0};
  CHECK_THROWS_AS(ops::cross_entropy(*e.gpu, losses.flat(DType::f32).slice(0, 2), Tensor(),
                                     out.view(DType::f32, {2, C}), negative.data(), 1.f),
                  InternalError);
}

TEST_CASE("cuda layernorm forward and backward match the cpu backend", "[cuda]") {
  Env e;
  struct Shape { int64_t N, C; };
  // C = 31 leaves lanes idle; N = 1000 spreads dw/db over 32 row chunks, N = 9000 over 264 of
  // several rows a warp (the one-launch form, folded by the last block); C = 3200 takes the
  // three-launch form (launches.hpp, norm_fused_warps).
  for (Shape s : {Shape{1, 64}, Shape{34, 768}, Shape{64, 130}, Shape{17, 31}, Shape{1000, 64}, Shape{9000, 96},
                  Shape{40, 3200}}) {
    const int64_t N = s.N, C = s.C;
    INFO("N=" << N << " C=" << C);
    auto inp = random_vector("linp", N * C, -2.f, 3.f), w = random_vector("lw", C, 0.5f, 1.5f);
    auto b = random_vector("lb", C);
    std::vector<float> out(N * C), mean(N), rstd(N);
    ops::layernorm_forward(*e.cpu, host2(out, N, C), host(mean), host(rstd), host2(inp, N, C), host(w), host(b),
                           1e-5f);
    Block ginp = up(e, inp, "inp"), gw = up(e, w, "w"), gb = up(e, b, "b");
    Block gout = e.pool.alloc(DType::f32, N * C, Category::workspace, "out");
    Block gmean = e.pool.alloc(DType::f32, N, Category::workspace, "mean");
    Block grstd = e.pool.alloc(DType::f32, N, Category::workspace, "rstd");
    ops::layernorm_forward(*e.gpu, gout.view(DType::f32, {N, C}), Env::dev(gmean, DType::f32, N),
                           Env::dev(grstd, DType::f32, N), ginp.view(DType::f32, {N, C}),
                           Env::dev(gw, DType::f32, C), Env::dev(gb, DType::f32, C), 1e-5f);
    // f32, only the summation order differs: 1e-5 relative, 1e-5 absolute.
    expect_close(down(e, gout, out.size()), out, 1e-5, 1e-5, "layernorm out");
    expect_close(down(e, gmean, mean.size()), mean, 1e-5, 1e-5, "layernorm mean");
    expect_close(down(e, grstd, rstd.size()), rstd, 1e-5, 1e-5, "layernorm rstd");
    // Written in bf16 (the products' operand): the f32 values rounded once, a bf16 ulp apart at most.
    Block gout16 = e.pool.alloc(DType::bf16, N * C, Category::workspace, "out bf16");
    ops::layernorm_forward(*e.gpu, gout16.view(DType::bf16, {N, C}), Env::dev(gmean, DType::f32, N),
                           Env::dev(grstd, DType::f32, N), ginp.view(DType::f32, {N, C}),
                           Env::dev(gw, DType::f32, C), Env::dev(gb, DType::f32, C), 1e-5f);
    expect_close(e.download(gout16, DType::bf16, out.size()), out, 8e-3, 1e-2, "layernorm out bf16");

    // Backward on the CPU's mean/rstd, into random gradients (all three accumulate).
    auto dout = random_vector("ldout", N * C), dinp = random_vector("ldinp", N * C);
    auto dw = random_vector("ldw", C), db = random_vector("ldb", C);
    Block gdout = up(e, dout, "dout"), gm = up(e, mean, "mean"), gr = up(e, rstd, "rstd");
    auto run_gpu = [&] {
      Block gdinp = up(e, dinp, "dinp"), gdw = up(e, dw, "dw"), gdb = up(e, db, "db");
      ops::layernorm_backward(*e.gpu, gdinp.view(DType::f32, {N, C}), Env::dev(gdw, DType::f32, C),
                              Env::dev(gdb, DType::f32, C), gdout.view(DType::f32, {N, C}),
                              ginp.view(DType::f32, {N, C}), Env::dev(gw, DType::f32, C),
                              Env::dev(gm, DType::f32, N), Env::dev(gr, DType::f32, N));
      return std::tuple{down(e, gdinp, dinp.size()), down(e, gdw, dw.size()), down(e, gdb, db.size())};
    };
    auto [got_dinp, got_dw, got_db] = run_gpu();
    auto [again_dinp, again_dw, again_db] = run_gpu();
    ops::layernorm_backward(*e.cpu, host2(dinp, N, C), host(dw), host(db), host2(dout, N, C), host2(inp, N, C), host(w),
                            host(mean), host(rstd));
    // Sums over C (dinp) and over N rows (dw, db) in another order: 1e-4 relative, 1e-4 absolute.
    expect_close(got_dinp, dinp, 1e-4, 1e-4, "layernorm dinp");
    expect_close(got_dw, dw, 1e-4, 1e-4, "layernorm dweight");
    expect_close(got_db, db, 1e-4, 1e-4, "layernorm dbias");
    CHECK(bit_equal(got_dw, again_dw));  // partials folded in a fixed order: reproducible

    // The bf16 forms (GPT-2's block under --activation-dtype bf16 on a GPU): the forward rounds its
    // input as well (bit for bit: one rounding of the same f32); the backward reads that bf16 input,
    // starts from a residual's gradient instead of accumulating, and rounds its result once more.
    Block gx16 = e.pool.alloc(DType::bf16, N * C, Category::workspace, "inp bf16");
    ops::layernorm_forward(*e.gpu, gout16.view(DType::bf16, {N, C}), Env::dev(gmean, DType::f32, N),
                           Env::dev(grstd, DType::f32, N), ginp.view(DType::f32, {N, C}),
                           Env::dev(gw, DType::f32, C), Env::dev(gb, DType::f32, C), 1e-5f,
                           gx16.view(DType::bf16, {N, C}));
    std::vector<float> x16(inp.size());
    for (size_t i = 0; i < inp.size(); ++i) x16[i] = test::round_to(inp[i], DType::bf16);
    CHECK(bit_equal(e.download(gx16, DType::bf16, x16.size()), x16));
    auto resid = random_vector("lresid", N * C);
    std::vector<float> dinp2(N * C), dw2 = dw, db2 = db;
    ops::layernorm_backward(*e.cpu, host2(dinp2, N, C), host(dw2), host(db2), host2(dout, N, C), host2(x16, N, C),
                            host(w), host(mean), host(rstd), host2(resid, N, C));
    Block gd2 = e.pool.alloc(DType::f32, N * C, Category::workspace, "dinp from"), gw2 = up(e, dw, "dw"),
          gb2 = up(e, db, "db"), gresid = up(e, resid, "resid");
    Block gd16 = e.pool.alloc(DType::bf16, N * C, Category::workspace, "dinp bf16");
    ops::layernorm_backward(*e.gpu, gd2.view(DType::f32, {N, C}), Env::dev(gw2, DType::f32, C),
                            Env::dev(gb2, DType::f32, C), gdout.view(DType::f32, {N, C}),
                            gx16.view(DType::bf16, {N, C}), Env::dev(gw, DType::f32, C), Env::dev(gm, DType::f32, N),
                            Env::dev(gr, DType::f32, N), gresid.view(DType::f32, {N, C}),
                            gd16.view(DType::bf16, {N, C}));
    const auto got_d2 = down(e, gd2, dinp2.size());
    expect_close(got_d2, dinp2, 1e-4, 1e-4, "layernorm dinp from a residual, bf16 input");
    expect_close(down(e, gw2, dw2.size()), dw2, 1e-4, 1e-4, "layernorm dweight, bf16 input");
    expect_close(down(e, gb2, db2.size()), db2, 1e-4, 1e-4, "layernorm dbias, bf16 input");
    std::vector<float> d2_rounded(got_d2.size());
    for (size_t i = 0; i < got_d2.size(); ++i) d2_rounded[i] = test::round_to(got_d2[i], DType::bf16);
    CHECK(bit_equal(e.download(gd16, DType::bf16, d2_rounded.size()), d2_rounded));  // the GPU's own dinp, rounded
    CHECK(bit_equal(got_db, again_db));
    CHECK(bit_equal(got_dinp, again_dinp));
  }
}

TEST_CASE("cuda add_bias and gelu match the cpu backend", "[cuda]") {
  Env e;
  // add_bias: OC = 64 takes the float4 path, OC = 50 the scalar one.
  for (int64_t OC : {int64_t{64}, int64_t{50}}) {
    const int64_t N = 17;
    auto x = random_vector("bx", N * OC), bias = random_vector("bbias", OC);
    Block gx = up(e, x, "x"), gbias = up(e, bias, "bias");
    e.gpu->add_bias(gx.view(DType::f32, {N, OC}), Env::dev(gbias, DType::f32, OC));
    e.cpu->add_bias(host2(x, N, OC), host(bias));
    CHECK(bit_equal(down(e, gx, x.size()), x));  // tolerance 0: one add per element
  }
  // gelu: 4096 elements take the float4 path; 1001 elements one float past an aligned start, the
  // scalar one. The CPU's tanh is a polynomial within about 1e-7 absolute of tanhf's.
  for (int64_t n : {int64_t{4096}, int64_t{1001}}) {
    const int64_t off = n % 4 == 0 ? 0 : 1;
    INFO("n=" << n);
    auto inp = random_vector("ginp", n + off, -4.f, 4.f), dout = random_vector("gdout", n + off);
    std::vector<float> out(n + off), dinp(n + off, 7.f);
    Block ginp = up(e, inp, "inp"), gdout = up(e, dout, "dout");
    Block gout = up(e, out, "out"), gdinp = up(e, dinp, "dinp");
    auto dev = [&](const Block& b) { return Env::dev(b, DType::f32, n + off).slice(off, n); };
    auto hst = [&](std::vector<float>& v) { return host(v).slice(off, n); };
    ops::gelu_forward(*e.gpu, dev(gout), dev(ginp));
    ops::gelu_backward(*e.gpu, dev(gdinp), dev(ginp), dev(gdout));
    ops::gelu_forward(*e.cpu, hst(out), hst(inp));
    ops::gelu_backward(*e.cpu, hst(dinp), hst(inp), hst(dout));
    // 1e-5 relative, 1e-6 absolute (the tanh approximations differ by ~1e-7 absolute).
    expect_close(down(e, gout, out.size()), out, 1e-5, 1e-6, "gelu_forward");
    expect_close(down(e, gdinp, dinp.size()), dinp, 1e-5, 1e-6, "gelu_backward");
  }
}

TEST_CASE("cuda attention forward and backward match the cpu backend", "[cuda]") {
  Env e;
  struct Shape { int64_t B, T, C, H; };
  // Head sizes 8 (C=64, H=8) and 64 (C=128, H=2); T = 1, 17 (not a multiple of 32) and 64.
  for (Shape s : {Shape{2, 1, 64, 8}, Shape{2, 17, 64, 8}, Shape{1, 64, 128, 2}, Shape{2, 17, 128, 2},
                  Shape{1, 64, 64, 8}}) {
    const int64_t B = s.B, T = s.T, C = s.C, H = s.H;
    INFO("B=" << B << " T=" << T << " C=" << C << " H=" << H);
    auto qkv = random_vector("aqkv", B * T * 3 * C);
    std::vector<float> out(B * T * C), att(B * H * T * T);
    Tensor hqkv(qkv.data(), DType::f32, {B, T, 3 * C});
    ops::attention_forward(*e.cpu, Tensor(out.data(), DType::f32, {B, T, C}),
                           Tensor(att.data(), DType::f32, {B, H, T, T}), hqkv, H, H);
    Block gqkv = up(e, qkv, "qkv");
    Block gout = e.pool.alloc(DType::f32, B * T * C, Category::workspace, "out");
    Block gatt = e.pool.alloc(DType::f32, B * H * T * T, Category::workspace, "att");
    ops::attention_forward(*e.gpu, gout.view(DType::f32, {B, T, C}), gatt.view(DType::f32, {B, H, T, T}),
                           gqkv.view(DType::f32, {B, T, 3 * C}), H, H);
    auto got_att = down(e, gatt, att.size());
    // cuBLAS sums in another order (f32, no TF32): 1e-4 relative, 1e-5 absolute.
    expect_close(got_att, att, 1e-4, 1e-5, "attention att");
    expect_close(down(e, gout, out.size()), out, 1e-4, 1e-5, "attention out");
    size_t nonzero_above = 0;  // the causal mask is exact zeros
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t u = t + 1; u < T; ++u) nonzero_above += got_att[(bh * T + t) * T + u] != 0.f;
    CHECK(nonzero_above == 0);

    // Backward from the CPU's att; dqkv starts as garbage on both sides (it is overwritten).
    auto dout = random_vector("adout", B * T * C);
    std::vector<float> dqkv(qkv.size(), 7.f), scratch(attention_scratch_elems(T, H));
    Block gdout = up(e, dout, "dout"), gdqkv = up(e, dqkv, "dqkv"), gatt_ref = up(e, att, "att");
    Block gscratch = e.pool.alloc(DType::f32, attention_scratch_elems(T, H), Category::workspace, "scratch");
    ops::attention_backward(*e.gpu, gdqkv.view(DType::f32, {B, T, 3 * C}), gdout.view(DType::f32, {B, T, C}),
                            gqkv.view(DType::f32, {B, T, 3 * C}), gatt_ref.view(DType::f32, {B, H, T, T}), H, H,
                            gscratch.flat(DType::f32));
    ops::attention_backward(*e.cpu, Tensor(dqkv.data(), DType::f32, {B, T, 3 * C}),
                            Tensor(dout.data(), DType::f32, {B, T, C}), hqkv,
                            Tensor(att.data(), DType::f32, {B, H, T, T}), H, H, host(scratch));
    // Four GEMMs and the softmax backward in another order: 1e-4 relative, 2e-5 absolute.
    expect_close(down(e, gdqkv, dqkv.size()), dqkv, 1e-4, 2e-5, "attention dqkv");
  }
}

TEST_CASE("cuda cross_entropy matches the cpu backend, in place and without gradients", "[cuda]") {
  Env e;
  struct Shape { int64_t N, V; };
  // V not a multiple of 32 (50, 1003) and GPT-2's 50257 (many elements per thread).
  for (Shape s : {Shape{34, 50}, Shape{34, 1003}, Shape{3, 50257}, Shape{1, 1}}) {
    const int64_t N = s.N, V = s.V;
    INFO("N=" << N << " V=" << V);
    auto logits = random_vector("xlogits", N * V, -4.f, 4.f);
    Ids targets = random_ids("xtargets", N, V);
    const float scale = 1.f / static_cast<float>(N);
    std::vector<float> losses(N), dlogits(N * V);
    ops::cross_entropy(*e.cpu, host(losses), host2(dlogits, N, V), host2(logits, N, V), targets.data(), scale);
    enum class Mode { separate, aliased, no_grad };
    for (Mode mode : {Mode::separate, Mode::aliased, Mode::no_grad}) {
      INFO("mode " << static_cast<int>(mode));
      Block glogits = up(e, logits, "logits");
      Block gd = e.pool.alloc(DType::f32, N * V, Category::workspace, "dlogits");
      Block glosses = e.pool.alloc(DType::f32, N, Category::workspace, "losses");
      Tensor tl = glogits.view(DType::f32, {N, V});
      Tensor td = mode == Mode::separate ? gd.view(DType::f32, {N, V}) : mode == Mode::aliased ? tl : Tensor();
      ops::cross_entropy(*e.gpu, Env::dev(glosses, DType::f32, N), td, tl, targets.data(), scale);
      // Double-precision sums on both sides; float exps differ by an ulp or two: 1e-5 relative.
      expect_close(down(e, glosses, losses.size()), losses, 1e-5, 1e-6, "cross_entropy losses");
      if (mode == Mode::separate) expect_close(down(e, gd, dlogits.size()), dlogits, 1e-5, 1e-8, "dlogits");
      if (mode == Mode::aliased)
        expect_close(down(e, glogits, dlogits.size()), dlogits, 1e-5, 1e-8, "dlogits in place");
      if (mode == Mode::no_grad) CHECK(bit_equal(down(e, glogits, logits.size()), logits));  // untouched
    }
  }
}

// adamw_update_segments: 40 segments (two launches of up to 32), of sizes from 0 to a few
// thousand, some left out between them (their elements untouched), every other one decayed, with
// f32 and bf16 gradients, against the CPU's adamw_update on each segment in turn.
TEST_CASE("cuda adamw over many segments in one launch matches the cpu backend", "[cuda]") {
  Env e;
  std::vector<AdamWSegment> segs;
  int64_t at = 0;
  for (int k = 0; k < 40; ++k) {
    const int64_t len = k == 7 ? 0 : (k * 977) % 3001 + 1;
    segs.push_back({at, len, k % 2 ? 0.1f : 0.f});
    at += len + (k % 3 == 0 ? 5 : 0);  // a gap after every third
  }
  const int64_t n = at;
  for (DType gt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(gt) << " gradients");
    auto p = random_vector("seg p", n), m = random_vector("seg m", n, -0.1f, 0.1f);
    auto v = random_vector("seg v", n, 0.f, 0.01f);
    Block gp = up(e, p, "p"), gm = up(e, m, "m"), gv = up(e, v, "v");
    for (int64_t step = 1; step <= 2; ++step) {
      auto g = random_vector("seg g" + std::to_string(step), n);
      if (gt == DType::bf16)
        for (auto& x : g) x = test::round_to(x, DType::bf16);
      Block gg = e.upload(g, gt, "g");
      AdamWArgs a;
      a.lr = 1e-3f, a.step = step, a.grad_scale = 0.5f;
      ops::adamw_update_segments(*e.gpu, Env::dev(gp, DType::f32, n), Env::dev(gg, gt, n), Env::dev(gm, DType::f32, n),
                                 Env::dev(gv, DType::f32, n), segs, a);
      for (const AdamWSegment& sg : segs) {
        AdamWArgs b = a;
        b.weight_decay = sg.weight_decay;
        ops::adamw_update(*e.cpu, host(p).slice(sg.offset, sg.numel), host(g).slice(sg.offset, sg.numel),
                          host(m).slice(sg.offset, sg.numel), host(v).slice(sg.offset, sg.numel), b);
      }
    }
    expect_close(down(e, gp, n), p, 1e-5, 1e-7, "adamw segments param");  // gaps: both untouched
    expect_close(down(e, gm, n), m, 1e-5, 1e-7, "adamw segments m");
    expect_close(down(e, gv, n), v, 1e-5, 1e-7, "adamw segments v");
    // With the rounded copy (mixed precision's bf16 parameters): each updated element rounded
    // into it, the gaps' left as they were (-7).
    Block gr = e.upload(std::vector<float>(n, -7.f), DType::bf16, "rounded");
    AdamWArgs a;
    a.lr = 1e-3f, a.step = 3, a.grad_scale = 0.5f;
    auto g = random_vector("seg g3", n);
    for (auto& x : g) x = test::round_to(x, gt);
    Block gg = e.upload(g, gt, "g3");  // the bf16 gradients' kernel too (mixed precision's)
    ops::adamw_update_segments(*e.gpu, Env::dev(gp, DType::f32, n), Env::dev(gg, gt, n),
                               Env::dev(gm, DType::f32, n), Env::dev(gv, DType::f32, n), segs, a,
                               Env::dev(gr, DType::bf16, n));
    const std::vector<float> updated = down(e, gp, n), rounded = e.download(gr, DType::bf16, n);
    std::vector<bool> in(n, false);
    for (const AdamWSegment& sg : segs)
      for (int64_t i = sg.offset; i < sg.offset + sg.numel; ++i) in[i] = true;
    for (int64_t i = 0; i < n; ++i) {
      INFO("element " << i);
      REQUIRE(rounded[i] == (in[i] ? test::round_to(updated[i], DType::bf16) : -7.f));
    }
  }
}

TEST_CASE("cuda adamw and sgd match the cpu backend over several steps", "[cuda]") {
  Env e;
  // 4096 elements take the float4 path, 4099 the scalar one.
  for (int64_t n : {int64_t{4096}, int64_t{4099}}) {
    INFO("n=" << n);
    auto p = random_vector("op", n), m = random_vector("om", n, -0.1f, 0.1f), v = random_vector("ov", n, 0.f, 0.01f);
    std::vector<float> sp = p, sbuf(n, 0.f);
    Block gp = up(e, p, "p"), gm = up(e, m, "m"), gv = up(e, v, "v");
    Block gsp = up(e, sp, "sp"), gsbuf = up(e, sbuf, "sbuf");
    auto t = [&](const Block& b) { return Env::dev(b, DType::f32, n); };
    for (int64_t step = 1; step <= 3; ++step) {
      auto g = random_vector("og" + std::to_string(step), n);
      Block gg = up(e, g, "g");
      AdamWArgs a;
      a.lr = 1e-3f, a.weight_decay = 0.1f, a.step = step, a.grad_scale = 0.5f;
      ops::adamw_update(*e.gpu, t(gp), t(gg), t(gm), t(gv), a);
      ops::adamw_update(*e.cpu, host(p), host(g), host(m), host(v), a);
      SgdArgs sa;
      sa.lr = 0.01f, sa.momentum = 0.9f, sa.weight_decay = 0.01f, sa.grad_scale = 0.5f;
      ops::sgd_update(*e.gpu, t(gsp), t(gg), t(gsbuf), sa);
      ops::sgd_update(*e.cpu, host(sp), host(g), host(sbuf), sa);
    }
    // The same f32 formula (contractions into FMAs may differ): 1e-5 relative, 1e-7 absolute.
    expect_close(down(e, gp, n), p, 1e-5, 1e-7, "adamw param");
    expect_close(down(e, gm, n), m, 1e-5, 1e-7, "adamw m");
    expect_close(down(e, gv, n), v, 1e-5, 1e-7, "adamw v");
    expect_close(down(e, gsp, n), sp, 1e-5, 1e-7, "sgd param");
    expect_close(down(e, gsbuf, n), sbuf, 1e-5, 1e-7, "sgd momentum");
  }
}

// ---- the Llama family's operations against the CPU backend ---------------------------------------
// Odd shapes throughout (rows of 13, 11 or 6 channels; T = 9), so no float4 path or full warp hides
// an indexing error.

TEST_CASE("cuda embedding without learned positions (empty wpe) matches the cpu bit for bit", "[cuda]") {
  Env e;
  const int64_t B = 2, T = 9, C = 13, V = 50, BT = B * T;
  Ids tokens = random_ids("etok_nopos", BT, V);
  auto wte = random_vector("ewte_nopos", V * C);
  Block gwte = up(e, wte, "wte");
  Block gout = e.pool.alloc(DType::f32, BT * C, Category::workspace, "out");
  ops::embedding_forward(*e.gpu, gout.view(DType::f32, {BT, C}), tokens.data(), B, T, gwte.view(DType::f32, {V, C}),
                         Tensor());
  std::vector<float> out(BT * C), gathered(BT * C);
  ops::embedding_forward(*e.cpu, host2(out, BT, C), tokens.data(), B, T, host2(wte, V, C), Tensor());
  for (int64_t bt = 0; bt < BT; ++bt)
    std::copy_n(wte.begin() + tokens[bt] * C, C, gathered.begin() + bt * C);
  auto got = down(e, gout, out.size());
  CHECK(bit_equal(got, gathered));  // tolerance 0: a copy of the token's row, nothing added
  CHECK(bit_equal(got, out));

  // Backward with no dwpe: dwte as with positions (ascending position order on both sides, so
  // tolerance 0), and nothing written through the empty dwpe (a write would fault the download).
  auto dout = random_vector("edout_nopos", BT * C), dwte = random_vector("edwte_nopos", V * C);
  Block gdout = up(e, dout, "dout"), gdwte = up(e, dwte, "dwte");
  ops::embedding_backward(*e.gpu, gdwte.view(DType::f32, {V, C}), Tensor(), gdout.view(DType::f32, {BT, C}),
                          tokens.data(), B, T);
  ops::embedding_backward(*e.cpu, host2(dwte, V, C), Tensor(), host2(dout, BT, C), tokens.data(), B, T);
  CHECK(bit_equal(down(e, gdwte, dwte.size()), dwte));
}

TEST_CASE("cuda rmsnorm forward and backward match the cpu backend", "[cuda]") {
  Env e;
  struct Shape { int64_t N, C; };
  // C = 13 leaves most lanes idle and N = 7 makes one row chunk for dweight; N = 1000 makes 32 and
  // N = 9000 264; C = 6200 takes the three-launch form (as LayerNorm's test).
  for (Shape s : {Shape{7, 13}, Shape{1000, 64}, Shape{9000, 96}, Shape{33, 6200}}) {
    const int64_t N = s.N, C = s.C;
    INFO("N=" << N << " C=" << C);
    auto inp = random_vector("rinp", N * C, -2.f, 3.f), w = random_vector("rw", C, 0.5f, 1.5f);
    std::vector<float> out(N * C), rstd(N);
    const float eps = 1e-6f;  // Llama's
    ops::rmsnorm_forward(*e.cpu, host2(out, N, C), host(rstd), host2(inp, N, C), host(w), eps);
    Block ginp = up(e, inp, "inp"), gw = up(e, w, "w");
    Block gout = e.pool.alloc(DType::f32, N * C, Category::workspace, "out");
    Block grstd = e.pool.alloc(DType::f32, N, Category::workspace, "rstd");
    ops::rmsnorm_forward(*e.gpu, gout.view(DType::f32, {N, C}), Env::dev(grstd, DType::f32, N),
                         ginp.view(DType::f32, {N, C}), Env::dev(gw, DType::f32, C), eps);
    // f32; only the order of the sum of squares differs (a few ulps of rstd): 1e-5 relative and
    // absolute, as LayerNorm's.
    expect_close(down(e, gout, out.size()), out, 1e-5, 1e-5, "rmsnorm out");
    expect_close(down(e, grstd, rstd.size()), rstd, 1e-5, 1e-5, "rmsnorm rstd");
    Block gout16 = e.pool.alloc(DType::bf16, N * C, Category::workspace, "out bf16");
    ops::rmsnorm_forward(*e.gpu, gout16.view(DType::bf16, {N, C}), Env::dev(grstd, DType::f32, N),
                         ginp.view(DType::f32, {N, C}), Env::dev(gw, DType::f32, C), eps);
    expect_close(e.download(gout16, DType::bf16, out.size()), out, 8e-3, 1e-2, "rmsnorm out bf16");

    // Backward on the CPU's rstd, into random gradients (dinp and dweight accumulate).
    auto dout = random_vector("rdout", N * C), dinp = random_vector("rdinp", N * C), dw = random_vector("rdw", C);
    Block gdout = up(e, dout, "dout"), gr = up(e, rstd, "rstd");
    auto run_gpu = [&] {
      Block gdinp = up(e, dinp, "dinp"), gdw = up(e, dw, "dw");
      ops::rmsnorm_backward(*e.gpu, gdinp.view(DType::f32, {N, C}), Env::dev(gdw, DType::f32, C),
                            gdout.view(DType::f32, {N, C}), ginp.view(DType::f32, {N, C}),
                            Env::dev(gw, DType::f32, C), Env::dev(gr, DType::f32, N));
      return std::pair{down(e, gdinp, dinp.size()), down(e, gdw, dw.size())};
    };
    auto [got_dinp, got_dw] = run_gpu();
    auto [again_dinp, again_dw] = run_gpu();
    ops::rmsnorm_backward(*e.cpu, host2(dinp, N, C), host(dw), host2(dout, N, C), host2(inp, N, C), host(w),
                          host(rstd));
    // A sum over C (dinp) and over N rows (dweight, 1000 terms of |x r dout| <= ~3) in another
    // order: 1e-4 relative and absolute, as LayerNorm's.
    expect_close(got_dinp, dinp, 1e-4, 1e-4, "rmsnorm dinp");
    expect_close(got_dw, dw, 1e-4, 1e-4, "rmsnorm dweight");
    CHECK(bit_equal(got_dw, again_dw));  // chunk partials folded in a fixed order: reproducible
    CHECK(bit_equal(got_dinp, again_dinp));

    // The bf16 forms (Llama's layer under --activation-dtype bf16 on a GPU), as LayerNorm's.
    Block gx16 = e.pool.alloc(DType::bf16, N * C, Category::workspace, "inp bf16");
    ops::rmsnorm_forward(*e.gpu, gout16.view(DType::bf16, {N, C}), Env::dev(grstd, DType::f32, N),
                         ginp.view(DType::f32, {N, C}), Env::dev(gw, DType::f32, C), eps,
                         gx16.view(DType::bf16, {N, C}));
    std::vector<float> x16(inp.size());
    for (size_t i = 0; i < inp.size(); ++i) x16[i] = test::round_to(inp[i], DType::bf16);
    CHECK(bit_equal(e.download(gx16, DType::bf16, x16.size()), x16));
    auto resid = random_vector("rresid", N * C);
    std::vector<float> dinp2(N * C), dw2 = dw;
    ops::rmsnorm_backward(*e.cpu, host2(dinp2, N, C), host(dw2), host2(dout, N, C), host2(x16, N, C), host(w),
                          host(rstd), host2(resid, N, C));
    Block gd2 = e.pool.alloc(DType::f32, N * C, Category::workspace, "dinp from"), gw2 = up(e, dw, "dw"),
          gresid = up(e, resid, "resid");
    Block gd16 = e.pool.alloc(DType::bf16, N * C, Category::workspace, "dinp bf16");
    ops::rmsnorm_backward(*e.gpu, gd2.view(DType::f32, {N, C}), Env::dev(gw2, DType::f32, C),
                          gdout.view(DType::f32, {N, C}), gx16.view(DType::bf16, {N, C}), Env::dev(gw, DType::f32, C),
                          Env::dev(gr, DType::f32, N), gresid.view(DType::f32, {N, C}), gd16.view(DType::bf16, {N, C}));
    const auto got_d2 = down(e, gd2, dinp2.size());
    expect_close(got_d2, dinp2, 1e-4, 1e-4, "rmsnorm dinp from a residual, bf16 input");
    expect_close(down(e, gw2, dw2.size()), dw2, 1e-4, 1e-4, "rmsnorm dweight, bf16 input");
    std::vector<float> d2_rounded(got_d2.size());
    for (size_t i = 0; i < got_d2.size(); ++i) d2_rounded[i] = test::round_to(got_d2[i], DType::bf16);
    CHECK(bit_equal(e.download(gd16, DType::bf16, d2_rounded.size()), d2_rounded));
  }
}

TEST_CASE("cuda rope matches the cpu backend, at an offset and inverted, and leaves other heads alone", "[cuda]") {
  Env e;
  const int64_t B = 2, T = 9, hd = 6;
  RopeFreqs freqs;  // HF's default: inv_freq = 1 / 10000^(2i / hd), in f32
  freqs.half = hd / 2;
  for (int64_t i = 0; i < freqs.half; ++i)
    freqs.inv_freq[static_cast<size_t>(i)] = 1.f / std::pow(10000.f, static_cast<float>(2 * i) / hd);
  struct Case { int64_t heads, W, pos0; bool inverse; };
  // W = 48: the 4 query heads of a GQA row (H = 4, KV = 2), whose other 24 channels stay as they
  // are; W = 36: every channel rotates. pos0 = 4093 reaches angles in the thousands.
  for (Case c : {Case{4, 48, 0, false}, Case{4, 48, 5, false}, Case{4, 48, 5, true}, Case{6, 36, 0, true},
                 Case{6, 36, 4093, false}}) {
    INFO("heads=" << c.heads << " W=" << c.W << " pos0=" << c.pos0 << " inverse=" << c.inverse);
    const auto x0 = random_vector("rope_x", B * T * c.W);
    std::vector<float> x = x0;
    Block gx = up(e, x0, "x");
    ops::rope(*e.gpu, gx.view(DType::f32, {B, T, c.W}), c.heads, hd, freqs, c.pos0, c.inverse);
    ops::rope(*e.cpu, Tensor(x.data(), DType::f32, {B, T, c.W}), c.heads, hd, freqs, c.pos0, c.inverse);
    auto got = down(e, gx, x.size());
    // The same f32 angle on both sides; CUDA's cosf/sinf are within 2 ulp and glibc's within 1,
    // so with |x| <= 1 each output differs by a few 1e-7: 1e-5 relative, 1e-6 absolute.
    expect_close(got, x, 1e-5, 1e-6, "rope");
    size_t changed_outside = 0;  // channels past the rotated heads: bit for bit the input
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t ch = c.heads * hd; ch < c.W; ++ch) changed_outside += got[r * c.W + ch] != x0[r * c.W + ch];
    CHECK(changed_outside == 0);
    // The inverse undoes the rotation: back to the input, to a rounding of c^2 + s^2 = 1.
    ops::rope(*e.gpu, gx.view(DType::f32, {B, T, c.W}), c.heads, hd, freqs, c.pos0, !c.inverse);
    expect_close(down(e, gx, x.size()), x0, 1e-5, 1e-6, "rope then its inverse");
  }
}

TEST_CASE("cuda swiglu forward and backward match the cpu backend", "[cuda]") {
  Env e;
  struct Shape { int64_t N, F; };
  for (Shape s : {Shape{7, 11}, Shape{33, 64}}) {
    const int64_t N = s.N, F = s.F;
    INFO("N=" << N << " F=" << F);
    auto gate_up = random_vector("sgu", N * 2 * F, -4.f, 4.f), dout = random_vector("sdout", N * F);
    std::vector<float> out(N * F), dgate_up(N * 2 * F, 7.f);  // garbage: backward overwrites it
    Block ggu = up(e, gate_up, "gate_up"), gdout = up(e, dout, "dout");
    Block gout = e.pool.alloc(DType::f32, N * F, Category::workspace, "out"), gdgu = up(e, dgate_up, "dgate_up");
    ops::swiglu_forward(*e.gpu, gout.view(DType::f32, {N, F}), ggu.view(DType::f32, {N, 2 * F}));
    ops::swiglu_backward(*e.gpu, gdgu.view(DType::f32, {N, 2 * F}), ggu.view(DType::f32, {N, 2 * F}),
                         gdout.view(DType::f32, {N, F}));
    ops::swiglu_forward(*e.cpu, host2(out, N, F), host2(gate_up, N, 2 * F));
    ops::swiglu_backward(*e.cpu, host2(dgate_up, N, 2 * F), host2(gate_up, N, 2 * F), host2(dout, N, F));
    // exp within 2 ulp on each side (CUDA's expf; the CPU's may be a vectorized one), and silu's
    // derivative 1 + g (1 - s) cancels near g = -1.28, where its absolute error stays ~1e-7 times
    // |dout up| <= 4: 1e-5 relative, 1e-6 absolute forward, 2e-6 absolute backward.
    expect_close(down(e, gout, out.size()), out, 1e-5, 1e-6, "swiglu out");
    Block gout16 = e.pool.alloc(DType::bf16, N * F, Category::workspace, "out bf16");  // rounded once
    ops::swiglu_forward(*e.gpu, gout16.view(DType::bf16, {N, F}), ggu.view(DType::f32, {N, 2 * F}));
    expect_close(e.download(gout16, DType::bf16, out.size()), out, 8e-3, 1e-2, "swiglu out bf16");
    expect_close(down(e, gdgu, dgate_up.size()), dgate_up, 1e-5, 2e-6, "swiglu dgate_up");
    // Llama's MLP under --activation-dtype bf16 on a GPU: gate_up stored in bf16 (its product's
    // output), d(gate_up) written in bf16: against the CPU's f32 on the same bf16 values, rounded.
    std::vector<float> gu16 = gate_up, out16(N * F), dgu16(N * 2 * F);
    for (auto& v : gu16) v = test::round_to(v, DType::bf16);
    ops::swiglu_forward(*e.cpu, host2(out16, N, F), host2(gu16, N, 2 * F));
    ops::swiglu_backward(*e.cpu, host2(dgu16, N, 2 * F), host2(gu16, N, 2 * F), host2(dout, N, F));
    Block ggu16 = e.upload(gu16, DType::bf16, "gate_up bf16");
    Block gdgu16 = e.pool.alloc(DType::bf16, N * 2 * F, Category::workspace, "dgate_up bf16");
    ops::swiglu_forward(*e.gpu, gout16.view(DType::bf16, {N, F}), ggu16.view(DType::bf16, {N, 2 * F}));
    ops::swiglu_backward(*e.gpu, gdgu16.view(DType::bf16, {N, 2 * F}), ggu16.view(DType::bf16, {N, 2 * F}),
                         gdout.view(DType::f32, {N, F}));
    expect_close(e.download(gout16, DType::bf16, out16.size()), out16, 8e-3, 1e-2, "swiglu out from bf16");
    expect_close(e.download(gdgu16, DType::bf16, dgu16.size()), dgu16, 8e-3, 1e-2, "swiglu dgate_up bf16");
  }
}

TEST_CASE("cuda grouped-query attention forward and backward match the cpu backend", "[cuda]") {
  Env e;
  struct Heads { int64_t H, KV, vd; };
  const int64_t B = 2, T = 9, hd = 6;
  // Groups of 2 (H=4 KV=2), of 2 with an odd KV (6, 3), one K/V head for all (4, 1), and MHA on
  // the same odd shape (3, 3); values of a head dimension of their own, narrower and wider
  // (DeepSeek's latent attention).
  for (Heads h : {Heads{4, 2, 6}, Heads{6, 3, 6}, Heads{4, 1, 6}, Heads{3, 3, 6}, Heads{4, 4, 4}, Heads{4, 2, 10}}) {
    const int64_t H = h.H, KV = h.KV, vd = h.vd, C = H * vd, R = (H + KV) * hd + KV * vd;
    INFO("B=" << B << " T=" << T << " hd=" << hd << " vd=" << vd << " H=" << H << " KV=" << KV);
    auto qkv = random_vector("gqkv", B * T * R);
    std::vector<float> out(B * T * C), att(B * H * T * T);
    Tensor hqkv(qkv.data(), DType::f32, {B, T, R});
    ops::attention_forward(*e.cpu, Tensor(out.data(), DType::f32, {B, T, C}),
                           Tensor(att.data(), DType::f32, {B, H, T, T}), hqkv, H, KV, vd);
    Block gqkv = up(e, qkv, "qkv");
    Block gout = e.pool.alloc(DType::f32, B * T * C, Category::workspace, "out");
    Block gatt = e.pool.alloc(DType::f32, B * H * T * T, Category::workspace, "att");
    ops::attention_forward(*e.gpu, gout.view(DType::f32, {B, T, C}), gatt.view(DType::f32, {B, H, T, T}),
                           gqkv.view(DType::f32, {B, T, R}), H, KV, vd);
    // cuBLAS sums in another order (f32, no TF32): 1e-4 relative, 1e-5 absolute, as for MHA.
    expect_close(down(e, gatt, att.size()), att, 1e-4, 1e-5, "gqa att");
    expect_close(down(e, gout, out.size()), out, 1e-4, 1e-5, "gqa out");

    // Backward from the CPU's att; dqkv starts as garbage (it is overwritten, dK and dV included,
    // though they sum over the group's query heads).
    auto dout = random_vector("gdout", B * T * C);
    std::vector<float> dqkv(qkv.size(), 7.f), scratch(attention_scratch_elems(T, H));
    Block gdout = up(e, dout, "dout"), gatt_ref = up(e, att, "att");
    Block gscratch = e.pool.alloc(DType::f32, attention_scratch_elems(T, H), Category::workspace, "scratch");
    auto run_gpu = [&] {
      Block gdqkv = up(e, dqkv, "dqkv");
      ops::attention_backward(*e.gpu, gdqkv.view(DType::f32, {B, T, R}), gdout.view(DType::f32, {B, T, C}),
                              gqkv.view(DType::f32, {B, T, R}), gatt_ref.view(DType::f32, {B, H, T, T}), H, KV,
                              gscratch.flat(DType::f32), vd);
      return down(e, gdqkv, dqkv.size());
    };
    auto got = run_gpu();
    auto again = run_gpu();
    ops::attention_backward(*e.cpu, Tensor(dqkv.data(), DType::f32, {B, T, R}),
                            Tensor(dout.data(), DType::f32, {B, T, C}),
                            hqkv, Tensor(att.data(), DType::f32, {B, H, T, T}), H, KV, host(scratch), vd);
    // As for MHA (1e-4 relative, 2e-5 absolute): dK and dV add at most 4 group members' products
    // of |values| < 1 over T = 9, each rounding ~1e-7 in either order.
    expect_close(got, dqkv, 1e-4, 2e-5, "gqa dqkv");
    CHECK(bit_equal(got, again));  // the group sums run in a fixed order: reproducible
  }
}

// ---- the vocabulary-parallel embedding and loss (--tp) against the CPU backend -------------------
// Each rank's shard of a vocabulary that the degree does not divide, so the last shards carry
// padding (9 over 4: the last shard is all padding). Padding logits are larger than any real one
// and padding embedding rows are NaN: read, either would show.

namespace {

// n targets in [0, V), random but for the first ones, set to this shard's first and last columns.
Ids shard_targets(const std::string& name, int64_t n, int64_t V, const VocabShard& v) {
  Ids t = random_ids(name, n, V);
  if (v.valid > 0 && n >= 2) t[0] = static_cast<int32_t>(v.begin), t[1] = static_cast<int32_t>(v.begin + v.valid - 1);
  return t;
}

}  // namespace

TEST_CASE("cuda vocabulary-parallel cross-entropy steps match the cpu backend, padding gradients zero", "[cuda]") {
  Env e;
  struct Case { int64_t N, V; int T; };
  for (Case c : {Case{34, 50, 3}, Case{5, 9, 4}, Case{3, 50257, 4}}) {
    for (int r = 0; r < c.T; ++r) {
      const VocabShard v = vocab_shard(c.V, c.T, r);
      const int64_t N = c.N, Vl = v.rows;
      INFO("N=" << N << " V=" << c.V << " rank " << r << " of " << c.T << ": columns [" << v.begin << ", "
                << v.begin + Vl << "), " << v.valid << " valid");
      auto logits = random_vector("vlogits", N * Vl, -6.f, 6.f);
      for (int64_t i = 0; i < N; ++i) std::fill_n(logits.begin() + i * Vl + v.valid, Vl - v.valid, 30.f);
      const Ids targets = shard_targets("vtargets", N, c.V, v);
      Block glogits = up(e, logits, "logits");
      auto dev = [&](const Block& b, int64_t n) { return Env::dev(b, DType::f32, static_cast<size_t>(n)); };

      // max: exact on both sides.
      std::vector<float> mx(N);
      ops::vocab_ce_max(*e.cpu, host(mx), host2(logits, N, Vl), v.valid);
      Block gmx = e.pool.alloc(DType::f32, N, Category::workspace, "mx");
      ops::vocab_ce_max(*e.gpu, dev(gmx, N), glogits.view(DType::f32, {N, Vl}), v.valid);
      CHECK(bit_equal(down(e, gmx, mx.size()), mx));

      // sums, from a group maximum at least this shard's (finite where the shard is all padding).
      auto other = random_vector("vother_max", N, -6.f, 7.f);
      std::vector<float> red_mx(N);
      for (int64_t i = 0; i < N; ++i) red_mx[i] = std::max(mx[i], other[i]);
      std::vector<float> sumexp(N), tlogit(N);
      ops::vocab_ce_sums(*e.cpu, host(sumexp), host(tlogit), host2(logits, N, Vl), targets.data(), v.begin, v.valid,
                         host(red_mx));
      Block gred_mx = up(e, red_mx, "reduced mx");
      Block gsumexp = e.pool.alloc(DType::f32, N, Category::workspace, "sumexp");
      Block gtlogit = e.pool.alloc(DType::f32, N, Category::workspace, "tlogit");
      ops::vocab_ce_sums(*e.gpu, dev(gsumexp, N), dev(gtlogit, N), glogits.view(DType::f32, {N, Vl}), targets.data(),
                         v.begin, v.valid, dev(gred_mx, N));
      // Double sums on both sides of exps within 2 ulp (the CPU's fast_exp) or exact (CUDA's double exp).
      expect_close(down(e, gsumexp, sumexp.size()), sumexp, 1e-6, 0, "sumexp");
      CHECK(bit_equal(down(e, gtlogit, tlogit.size()), tlogit));  // a copy of the target's logit, or 0

      // finish, from group sums that include other ranks' parts.
      auto extra = random_vector("vother_sum", N, 0.5f, 40.f), other_t = random_vector("vother_t", N, -6.f, 6.f);
      std::vector<float> red_sum(N), red_t(N);
      for (int64_t i = 0; i < N; ++i) {
        red_sum[i] = sumexp[i] + extra[i];
        red_t[i] = tlogit[i] != 0.f ? tlogit[i] : other_t[i];
      }
      const float scale = 1.f / static_cast<float>(N);
      std::vector<float> losses(N), dlogits(N * Vl, -3.f);
      ops::vocab_ce_finish(*e.cpu, host(losses), host2(dlogits, N, Vl), host2(logits, N, Vl), targets.data(), v.begin,
                           v.valid, host(red_mx), host(red_sum), host(red_t), scale);
      Block gred_sum = up(e, red_sum, "reduced sumexp"), gred_t = up(e, red_t, "reduced tlogit");
      enum class Mode { separate, aliased, no_grad };
      for (Mode mode : {Mode::separate, Mode::aliased, Mode::no_grad}) {
        INFO("mode " << static_cast<int>(mode));
        Block gl = up(e, logits, "logits");
        Block gd = up(e, std::vector<float>(N * Vl, -3.f), "dlogits");
        Block glosses = e.pool.alloc(DType::f32, N, Category::workspace, "losses");
        Tensor tl = gl.view(DType::f32, {N, Vl});
        Tensor td = mode == Mode::separate ? gd.view(DType::f32, {N, Vl}) : mode == Mode::aliased ? tl : Tensor();
        ops::vocab_ce_finish(*e.gpu, dev(glosses, N), td, tl, targets.data(), v.begin, v.valid, dev(gred_mx, N),
                             dev(gred_sum, N), dev(gred_t, N), scale);
        // As cross_entropy: 1e-5 relative (a float log, float exps an ulp or two apart).
        expect_close(down(e, glosses, losses.size()), losses, 1e-5, 1e-6, "losses");
        if (mode == Mode::no_grad) {
          CHECK(bit_equal(down(e, gl, logits.size()), logits));  // untouched
          continue;
        }
        const auto got = down(e, mode == Mode::separate ? gd : gl, dlogits.size());
        expect_close(got, dlogits, 1e-5, 1e-8, "dlogits");
        int64_t nonzero_padding = 0;
        for (int64_t i = 0; i < N; ++i)
          for (int64_t j = v.valid; j < Vl; ++j) nonzero_padding += got[i * Vl + j] != 0.f;
        CHECK(nonzero_padding == 0);
      }
    }
  }
}

TEST_CASE("cuda vocabulary-parallel embedding matches the cpu bit for bit, padding rows untouched", "[cuda]") {
  Env e;
  struct Case { int64_t B, T, C, V; int TP; };
  // C = 64 takes the float4 path of the forward, 13 the scalar one.
  for (Case c : {Case{2, 17, 64, 50, 3}, Case{3, 5, 13, 9, 4}, Case{2, 33, 64, 1003, 2}}) {
    for (bool positions : {true, false}) {
      const int64_t B = c.B, T = c.T, C = c.C, V = c.V, maxT = T + 3, BT = B * T;
      Ids tokens = random_ids("vetok", BT, V);
      tokens[0] = 0, tokens[1] = static_cast<int32_t>(V - 1);
      auto wte = random_vector("vewte", V * C), wpe = random_vector("vewpe", maxT * C);
      auto dout = random_vector("vedout", BT * C), dwpe0 = random_vector("vedwpe", maxT * C);
      Block gwpe = up(e, wpe, "wpe"), gdout = up(e, dout, "dout");
      for (int r = 0; r < c.TP; ++r) {
        const VocabShard v = vocab_shard(V, c.TP, r);
        INFO("B=" << B << " T=" << T << " C=" << C << " V=" << V << (positions ? " with" : " without")
                  << " wpe, rank " << r << " of " << c.TP << ": rows [" << v.begin << ", " << v.begin + v.rows
                  << "), " << v.valid << " valid");
        std::vector<float> part(v.rows * C, std::numeric_limits<float>::quiet_NaN());
        std::copy_n(wte.begin() + v.begin * C, v.valid * C, part.begin());
        Block gpart = up(e, part, "wte shard"), gout = up(e, std::vector<float>(BT * C, -1.f), "out");
        Tensor no_wpe;
        ops::embedding_forward_shard(*e.gpu, gout.view(DType::f32, {BT, C}), tokens.data(), B, T,
                                     gpart.view(DType::f32, {v.rows, C}),
                                     positions ? gwpe.view(DType::f32, {maxT, C}) : no_wpe, v.begin);
        std::vector<float> out(BT * C);
        ops::embedding_forward_shard(*e.cpu, host2(out, BT, C), tokens.data(), B, T, host2(part, v.rows, C),
                                     positions ? host2(wpe, maxT, C) : no_wpe, v.begin);
        CHECK(bit_equal(down(e, gout, out.size()), out));  // one add at most per element

        // Backward into random gradients, padding rows holding 7: the same ascending order of
        // additions per row on both sides (tolerance 0), and the same bits when run again.
        auto dpart = random_vector("vedwte", v.rows * C);
        std::fill(dpart.begin() + v.valid * C, dpart.end(), 7.f);
        auto run_gpu = [&] {
          Block gdpart = up(e, dpart, "dwte shard"), gdwpe = up(e, dwpe0, "dwpe");
          ops::embedding_backward_shard(*e.gpu, gdpart.view(DType::f32, {v.rows, C}),
                                        positions ? gdwpe.view(DType::f32, {maxT, C}) : no_wpe,
                                        gdout.view(DType::f32, {BT, C}), tokens.data(), B, T, v.begin);
          return std::pair{down(e, gdpart, dpart.size()), down(e, gdwpe, dwpe0.size())};
        };
        auto [got_dwte, got_dwpe] = run_gpu();
        auto [again_dwte, again_dwpe] = run_gpu();
        std::vector<float> dwpe = dwpe0;
        ops::embedding_backward_shard(*e.cpu, host2(dpart, v.rows, C), positions ? host2(dwpe, maxT, C) : no_wpe,
                                      host2(dout, BT, C), tokens.data(), B, T, v.begin);
        CHECK(bit_equal(got_dwte, dpart));
        CHECK(bit_equal(got_dwpe, dwpe));
        CHECK(bit_equal(got_dwte, again_dwte));
        CHECK(std::all_of(got_dwte.begin() + v.valid * C, got_dwte.end(), [](float x) { return x == 7.f; }));
      }
    }
  }
}

TEST_CASE("cuda vocabulary-parallel operations reject negative ids", "[cuda]") {
  Env e;
  const int64_t N = 2, Vl = 4, C = 8;
  Block logits = e.pool.alloc(DType::f32, N * Vl, Category::workspace, "logits");
  Block rows = e.pool.alloc(DType::f32, 3 * N, Category::workspace, "rows");
  Block wte = e.pool.alloc(DType::f32, Vl * C, Category::workspace, "wte");
  Block out = e.pool.alloc(DType::f32, N * C, Category::workspace, "out");
  Tensor r = rows.flat(DType::f32);
  const Ids bad{3, -1};
  CHECK_THROWS_AS(ops::vocab_ce_sums(*e.gpu, r.slice(0, N), r.slice(N, N), logits.view(DType::f32, {N, Vl}),
                                     bad.data(), 4, Vl, r.slice(2 * N, N)),
                  InternalError);
  CHECK_THROWS_AS(ops::embedding_forward_shard(*e.gpu, out.view(DType::f32, {N, C}), bad.data(), 1, N,
                                               wte.view(DType::f32, {Vl, C}), Tensor(), 4),
                  InternalError);
  CHECK_THROWS_AS(ops::embedding_backward_shard(*e.gpu, wte.view(DType::f32, {Vl, C}), Tensor(),
                                                out.view(DType::f32, {N, C}), bad.data(), 1, N, 4),
                  InternalError);
}

TEST_CASE("cuda attention over a KV cache matches the cpu backend, step by step", "[cuda]") {
  Env e;
  struct Case {
    int64_t B, T, H, KV, hd, S;
    std::vector<int64_t> steps;  // new positions per call: the first is the prefill
  };
  // MHA, GQA and MQA; a cache longer than the sequence; one position at a time; head sizes below and
  // above a warp, and more keys than a block has threads (300 > 256).
  for (const Case& c : {Case{2, 9, 3, 3, 6, 9, {4, 1, 1, 3}}, Case{2, 9, 4, 2, 6, 12, {1, 1, 1, 1, 1, 1, 1, 1, 1}},
                        Case{1, 7, 4, 1, 6, 7, {7}}, Case{1, 300, 4, 2, 64, 320, {290, 1, 9}}}) {
    const int64_t B = c.B, T = c.T, H = c.H, KV = c.KV, hd = c.hd, S = c.S, W = (H + 2 * KV) * hd, C = H * hd,
                  KVd = KV * hd;
    INFO("B=" << B << " T=" << T << " H=" << H << " KV=" << KV << " hd=" << hd << " S=" << S);
    auto qkv = random_vector("cached qkv", B * T * W, -2.f, 2.f);
    std::vector<float> kc(B * S * KVd, 0.f), vc(kc);
    Block gk = up(e, kc, "k cache"), gv = up(e, vc, "v cache");
    Tensor tk(kc.data(), DType::f32, {B, S, KVd}), tv(vc.data(), DType::f32, {B, S, KVd});
    int64_t pos0 = 0;
    for (int64_t n : c.steps) {
      INFO("positions " << pos0 << " to " << pos0 + n);
      std::vector<float> part(B * n * W), out(B * n * C);
      for (int64_t b = 0; b < B; ++b) std::copy_n(qkv.begin() + (b * T + pos0) * W, n * W, part.begin() + b * n * W);
      Tensor hpart(part.data(), DType::f32, {B, n, W});
      ops::kv_cache_write(*e.cpu, tk, tv, hpart, H, KV, pos0);
      ops::attention_cached(*e.cpu, Tensor(out.data(), DType::f32, {B, n, C}), hpart, tk, tv, H, KV, pos0);
      Block gpart = up(e, part, "qkv"), gout = e.pool.alloc(DType::f32, B * n * C, Category::workspace, "out");
      ops::kv_cache_write(*e.gpu, gk.view(DType::f32, {B, S, KVd}), gv.view(DType::f32, {B, S, KVd}),
                          gpart.view(DType::f32, {B, n, W}), H, KV, pos0);
      ops::attention_cached(*e.gpu, gout.view(DType::f32, {B, n, C}), gpart.view(DType::f32, {B, n, W}),
                            gk.view(DType::f32, {B, S, KVd}), gv.view(DType::f32, {B, S, KVd}), H, KV, pos0);
      // As attention_forward's tolerance: the scores' and the outputs' sums run in another order.
      expect_close(down(e, gout, out.size()), out, 1e-4, 1e-5, "cached attention out");
      pos0 += n;
    }
    CHECK(bit_equal(down(e, gk, kc.size()), kc));  // copies: exact
    CHECK(bit_equal(down(e, gv, vc.size()), vc));
  }
}

TEST_CASE("cuda cuDNN attention matches the cpu's fused attention on bf16-rounded operands", "[cuda]") {
  if (!cudnn_attention_built()) {
    WARN("this build has no cuDNN attention (no cuDNN or cudnn-frontend headers at configure time): not checked");
    return;
  }
  Env e;
  struct Case {
    int64_t B, T, H, KV, hd;
  };
  // Multi-head and grouped-query heads, GPT-2's and Llama's head sizes, a sequence that is no
  // multiple of cuDNN's tiles.
  for (Case k : {Case{2, 128, 4, 4, 64}, Case{2, 100, 4, 2, 64}, Case{1, 64, 2, 1, 128}}) {
    const int64_t B = k.B, T = k.T, H = k.H, KV = k.KV, hd = k.hd, R = (H + 2 * KV) * hd, C = H * hd;
    INFO("B=" << B << " T=" << T << " H=" << H << " KV=" << KV << " hd=" << hd);
    // Operands bf16 already, so cuDNN's own rounding of them changes nothing: what differs is
    // cuDNN's bf16 probabilities before the value product and its bf16 outputs.
    auto qkv = random_vector("cudnn qkv", B * T * R), dout = random_vector("cudnn dout", B * T * C);
    for (auto& v : qkv) v = test::round_to(v, DType::bf16);
    for (auto& v : dout) v = test::round_to(v, DType::bf16);
    std::vector<float> out(B * T * C), lse(B * H * T), dqkv(qkv.size());
    std::vector<float> fwd(flash_attention_workspace_elems(B, T, H, KV, hd, false));
    std::vector<float> bwd(flash_attention_workspace_elems(B, T, H, KV, hd, true));
    Tensor hqkv(qkv.data(), DType::f32, {B, T, R}), hout(out.data(), DType::f32, {B, T, C});
    Tensor hlse(lse.data(), DType::f32, {B, H, T});
    ops::flash_attention_forward(*e.cpu, hout, hlse, hqkv, H, KV, true, host(fwd));
    ops::flash_attention_backward(*e.cpu, Tensor(dqkv.data(), DType::f32, {B, T, R}),
                                  Tensor(dout.data(), DType::f32, {B, T, C}), hqkv, hout, hlse, H, KV, true, host(bwd));

    Block gqkv = up(e, qkv, "qkv"), gdout = up(e, dout, "dout");
    Block gout = e.pool.alloc(DType::f32, B * T * C, Category::workspace, "out");
    Block glse = e.pool.alloc(DType::f32, B * H * T, Category::workspace, "lse");
    Block gdqkv = up(e, std::vector<float>(qkv.size(), 7.f), "dqkv");  // overwritten
    Block gfwd = e.pool.alloc(DType::f32, cudnn_attention_workspace_elems(B, T, H, KV, hd, false), Category::workspace,
                              "cudnn forward");
    Block gbwd = e.pool.alloc(DType::f32, cudnn_attention_workspace_elems(B, T, H, KV, hd, true), Category::workspace,
                              "cudnn backward");
    ops::cudnn_attention_forward(*e.gpu, gout.view(DType::f32, {B, T, C}), glse.view(DType::f32, {B, H, T}),
                                 gqkv.view(DType::f32, {B, T, R}), H, KV, gfwd.flat(DType::f32));
    ops::cudnn_attention_backward(*e.gpu, gdqkv.view(DType::f32, {B, T, R}), gdout.view(DType::f32, {B, T, C}),
                                  gqkv.view(DType::f32, {B, T, R}), gout.view(DType::f32, {B, T, C}),
                                  glse.view(DType::f32, {B, H, T}), H, KV, gbwd.flat(DType::f32));
    // lse in f32 from bf16 scores' products (f32 accumulation): close; out and the gradients rounded
    // to bf16 once (2^-8 relative) after f32 sums over bf16 probabilities (a few times that).
    expect_close(down(e, glse, lse.size()), lse, 1e-3, 1e-3, "cudnn lse");
    expect_close(down(e, gout, out.size()), out, 2e-2, 1e-2, "cudnn out");
    expect_close(down(e, gdqkv, dqkv.size()), dqkv, 3e-2, 2e-2, "cudnn dqkv");
  }
}

TEST_CASE("cuda GEMMs with epilogues (cuBLASLt) match the cpu's product then element-wise passes", "[cuda]") {
  Env e;
  GemmDesc f32_product;
  f32_product.m = f32_product.n = f32_product.k = 8;
  f32_product.lda = f32_product.ldb = f32_product.ldc = 8;
  CHECK_FALSE(e.gpu->fuses_gemm_epilogue(f32_product));  // an f32 run keeps its kernels
  // nn.Linear's forward (bf16 weight (OC, IC) read transposed, f32 input rounded to bf16) and its
  // input gradient (dout @ W), GPT-2's shapes in small: rows that are no multiple of a tile; and 36
  // output columns, whose auxiliary rows cuBLASLt does not take (blocks::gemm_epilogue composes).
  const int64_t N = 37, IC = 64;
  struct Case {
    GemmEpilogue ep;
    int64_t OC;
  };
  for (Case k : {Case{GemmEpilogue::bias, 96}, Case{GemmEpilogue::bias_gelu, 96}, Case{GemmEpilogue::dgelu, 96},
                 Case{GemmEpilogue::bias, 36}, Case{GemmEpilogue::bias_gelu, 36}}) {
    const GemmEpilogue ep = k.ep;
    const int64_t OC = k.OC;
    INFO(gemm_epilogue_name(ep) << " OC=" << OC);
    const bool backward = ep == GemmEpilogue::dgelu;
    GemmDesc d;
    d.a_type = DType::f32, d.b_type = DType::bf16, d.round_inputs_to = DType::bf16;
    d.m = N, d.n = backward ? IC : OC, d.k = backward ? OC : IC;
    REQUIRE(e.gpu->fuses_gemm_epilogue(d));
    d.trans_b = backward ? Trans::N : Trans::T;  // W (OC, IC): forward x W^T, backward dout W
    d.lda = d.k, d.ldb = IC, d.ldc = d.n;
    auto A = random_vector("ep A", N * d.k), W = random_vector("ep W", OC * IC);
    auto bias = random_vector("ep bias", d.n), aux = random_vector("ep aux", N * d.n, -3.f, 3.f);
    for (auto& v : A) v = test::round_to(v, DType::bf16);  // as the GPU rounds them
    for (auto& v : W) v = test::round_to(v, DType::bf16);
    // The reference: the CPU's composition (blocks::gemm_epilogue) on the same values in f32.
    std::vector<float> ref(N * d.n), ref_aux = aux;
    GemmDesc dc = d;
    dc.b_type = DType::f32, dc.round_inputs_to = DType::f32;
    REQUIRE_FALSE(e.cpu->fuses_gemm_epilogue(dc));
    blocks::gemm_epilogue(*e.cpu, dc, A.data(), W.data(), Tensor(ref.data(), DType::f32, {N, d.n}), ep,
                          ep == GemmEpilogue::dgelu ? Tensor() : host(bias),
                          ep == GemmEpilogue::bias ? Tensor() : Tensor(ref_aux.data(), DType::f32, {N, d.n}));
    Block ga = up(e, A, "A"), gw = e.upload(W, DType::bf16, "W"), gb = up(e, bias, "bias"), gx = up(e, aux, "aux");
    Block gc = e.pool.alloc(DType::f32, N * d.n, Category::workspace, "C");
    const Tensor gbias = ep == GemmEpilogue::dgelu ? Tensor() : gb.flat(DType::f32);
    const Tensor gaux = ep == GemmEpilogue::bias ? Tensor() : gx.view(DType::f32, {N, d.n});
    // cuBLASLt takes GPT-2's shapes; 36 columns of auxiliary rows it does not (the caller composes).
    const bool fused = e.gpu->gemm_epilogue(d, ga.data(), gw.data(), gc.data(), ep,
                                            gbias.data() ? gbias.ptr<float>() : nullptr,
                                            gaux.data() ? gaux.ptr<float>() : nullptr);
    if (OC == 96) CHECK(fused);
    if (ep == GemmEpilogue::bias_gelu && OC == 36) CHECK_FALSE(fused);
    if (!fused) blocks::gemm_epilogue(*e.gpu, d, ga.data(), gw.data(), gc.view(DType::f32, {N, d.n}), ep, gbias, gaux);
    // The product in f32 from bf16 operands either way: 1e-4. cuBLASLt's GELU may take the
    // hardware's tanh (about 5e-4 relative), at sums of about 3: 2e-3 with GELU.
    const double tol = ep == GemmEpilogue::bias ? 1e-4 : 2e-3;
    expect_close(down(e, gc, ref.size()), ref, tol, tol, "C");
    if (ep == GemmEpilogue::bias_gelu) expect_close(down(e, gx, ref_aux.size()), ref_aux, 1e-4, 1e-4, "aux (the sum)");
    if (OC != 96) continue;
    if (ep == GemmEpilogue::bias) {
      // Summed onto what C holds (beta 1: GPT-2's residual under --activation-dtype bf16 on a GPU).
      GemmDesc d1 = d, dc1 = dc;
      d1.beta = dc1.beta = 1.f;
      std::vector<float> ref1 = aux;  // the residual C starts from
      dc1.ldc = d1.ldc = d.n;
      blocks::gemm_epilogue(*e.cpu, dc1, A.data(), W.data(), Tensor(ref1.data(), DType::f32, {N, d.n}), ep,
                            host(bias), Tensor());
      Block gc1 = up(e, aux, "C onto");
      if (e.gpu->gemm_epilogue(d1, ga.data(), gw.data(), gc1.data(), ep, gbias.ptr<float>(), nullptr))
        expect_close(down(e, gc1, ref1.size()), ref1, 1e-4, 1e-4, "C += product + bias");
      else
        WARN("cuBLASLt did not take the bias epilogue summed onto C");
    }
    // C and aux in bf16, as GPT-2's MLP and q, k, v keep them under --activation-dtype bf16: the
    // same f32 sums, each rounded once (a bf16 ulp, 2^-8 relative, beside the f32 tolerance).
    GemmDesc d16 = d;
    d16.c_type = DType::bf16;
    std::vector<float> aux16 = aux;
    for (auto& v : aux16) v = test::round_to(v, DType::bf16);
    std::vector<float> ref16(N * d.n), ref16_aux = aux16;  // dgelu reads the rounded aux
    blocks::gemm_epilogue(*e.cpu, dc, A.data(), W.data(), Tensor(ref16.data(), DType::f32, {N, d.n}), ep,
                          ep == GemmEpilogue::dgelu ? Tensor() : host(bias),
                          ep == GemmEpilogue::bias ? Tensor() : Tensor(ref16_aux.data(), DType::f32, {N, d.n}));
    Block gc16 = e.pool.alloc(DType::bf16, N * d.n, Category::workspace, "C bf16");
    Block gx16 = e.upload(aux16, DType::bf16, "aux bf16");
    const bool fused16 = e.gpu->gemm_epilogue(d16, ga.data(), gw.data(), gc16.data(), ep,
                                              gbias.data() ? gbias.ptr<float>() : nullptr,
                                              ep == GemmEpilogue::bias ? nullptr : gx16.data());
    if (!fused16) {  // blocks::gemm_epilogue composes in f32 then (its UnitContext form)
      WARN("cuBLASLt did not take the bf16 C with a " << gemm_epilogue_name(ep) << " epilogue");
      continue;
    }
    expect_close(e.download(gc16, DType::bf16, ref16.size()), ref16, tol + 8e-3, 1e-2, "C bf16");
    if (ep == GemmEpilogue::bias_gelu)
      expect_close(e.download(gx16, DType::bf16, ref16_aux.size()), ref16_aux, 8e-3, 1e-2, "aux bf16");
  }
}

TEST_CASE("cuda weight gradient with its bias gradient (cuBLASLt BGRADA) matches the cpu's product and column sums",
          "[cuda]") {
  Env e;
  // GPT-2's c_fc in small: dW (IC, OC) += inp^T dout over N rows, dbias = dout's column sums; bf16
  // operands, dW an f32 workspace with a gradient in it already (beta 1), dbias overwritten.
  const int64_t N = 96, IC = 64, OC = 128;
  GemmDesc d;
  d.a_type = d.b_type = d.round_inputs_to = DType::bf16;
  d.trans_a = Trans::T;
  d.m = IC, d.n = OC, d.k = N;
  d.lda = IC, d.ldb = OC, d.ldc = OC;
  d.beta = 1.f;
  REQUIRE(e.gpu->fuses_gemm_epilogue(d));
  auto inp = random_vector("bgrad inp", N * IC), dout = random_vector("bgrad dout", N * OC);
  auto dw = random_vector("bgrad dw", IC * OC);
  for (auto& v : inp) v = test::round_to(v, DType::bf16);
  for (auto& v : dout) v = test::round_to(v, DType::bf16);
  std::vector<float> want_dw = dw, want_db(OC, 0.f);
  GemmDesc dc = d;
  dc.a_type = dc.b_type = dc.round_inputs_to = DType::f32;
  e.cpu->gemm(dc, inp.data(), dout.data(), want_dw.data());
  e.cpu->sum_rows(host2(dout, N, OC), host(want_db), false);
  Block ga = e.upload(inp, DType::bf16, "inp"), gb = e.upload(dout, DType::bf16, "dout"), gw = up(e, dw, "dW");
  Block gdb = up(e, std::vector<float>(OC, 7.f), "dbias");  // overwritten
  if (!e.gpu->gemm_bias_grad(d, ga.data(), gb.data(), gw.data(), gdb.flat(DType::f32).ptr<float>())) {
    WARN("cuBLASLt did not take the weight gradient with a BGRADA epilogue: the model sums with sum_rows");
    return;
  }
  // f32 sums over bf16 operands either way: 1e-4.
  expect_close(down(e, gw, want_dw.size()), want_dw, 1e-4, 1e-4, "dW += inp^T dout");
  expect_close(down(e, gdb, want_db.size()), want_db, 1e-4, 1e-4, "dbias = column sums of dout");
}

TEST_CASE("cuda cast_ranges widens the ranges asked as the cpu does, more than one kernel's worth", "[cuda]") {
  Env e;
  const int64_t n = 5000;
  auto src = random_vector("cuda cast ranges", n, -3.f, 3.f);
  std::vector<ElemRange> ranges;  // 20 ranges (two kernels), empty ones among them, one at the end
  for (int64_t k = 0; k < 20; ++k) ranges.push_back({k * 240, k % 4 == 1 ? 0 : 7 + 11 * k});
  ranges.push_back({n - 3, 3});
  std::vector<float> want(n, -7.f);
  std::vector<uint16_t> bits(n);
  Tensor t16 = Tensor::flat(bits.data(), DType::bf16, n);
  e.cpu->cast(t16, host(src));
  e.cpu->cast_ranges(host(want), t16, ranges);
  Block gsrc = e.upload(src, DType::bf16, "src"), gout = up(e, std::vector<float>(n, -7.f), "out");
  e.gpu->cast_ranges(gout.flat(DType::f32), gsrc.flat(DType::bf16), ranges);
  const std::vector<float> got = down(e, gout, n);
  for (int64_t i = 0; i < n; ++i) {
    INFO("element " << i);
    REQUIRE(got[i] == want[i]);
  }
}

TEST_CASE("cuda sum_rows (one launch, the last block of a tile folds) matches the cpu, call after call", "[cuda]") {
  Env e;
  struct Shape { int64_t rows, cols; };
  // One chunk and one tile; GPT-2's bias gradients in small (many chunks, a partial last tile); a
  // tall thin one (the most chunks a tile gets).
  for (Shape sh : {Shape{5, 3}, Shape{1000, 770}, Shape{8192, 33}})
    for (DType t : {DType::f32, DType::bf16}) {
      INFO(sh.rows << " x " << sh.cols << " " << dtype_name(t));
      auto x = random_vector("sum_rows x", sh.rows * sh.cols);
      for (auto& v : x) v = test::round_to(v, t);
      auto base = random_vector("sum_rows out", sh.cols);
      std::vector<float> want = base;
      e.cpu->sum_rows(host2(x, sh.rows, sh.cols), host(want), true);
      Block gx = e.upload(x, t, "x"), gout = up(e, base, "out");
      const Tensor tx = gx.view(t, {sh.rows, sh.cols}), tout = Env::dev(gout, DType::f32, base.size());
      e.gpu->sum_rows(tx, tout, true);
      const auto first = down(e, gout, base.size());
      // Sums in doubles in another order, rounded to f32 once: 1e-6.
      expect_close(first, want, 1e-6, 1e-6, "sum_rows accumulated");
      e.gpu->sum_rows(tx, tout, false);  // the counters were reset: the same sums again, bit for bit
      std::vector<float> again = down(e, gout, base.size()), alone(base.size(), 0.f);
      e.cpu->sum_rows(host2(x, sh.rows, sh.cols), host(alone), false);
      expect_close(again, alone, 1e-6, 1e-6, "sum_rows");
      e.gpu->sum_rows(tx, tout, false);
      CHECK(bit_equal(down(e, gout, base.size()), again));
    }
}

TEST_CASE("cuda add_into and AdamW from bf16 gradients match the cpu bit for bit", "[cuda]") {
  Env e;
  const int64_t n = 10007;
  auto dst = random_vector("cuda add_into dst", n, -3.f, 3.f);
  auto src = random_vector("cuda add_into src", n, -1e-2f, 1e-2f);
  for (DType dt : {DType::f32, DType::bf16})
    for (DType st : {DType::f32, DType::bf16}) {
      INFO(dtype_name(dt) << " += " << dtype_name(st));
      std::vector<uint8_t> hd(n * dtype_size(dt)), hs(n * dtype_size(st));
      Tensor td = Tensor::flat(hd.data(), dt, n), ts = Tensor::flat(hs.data(), st, n);
      e.cpu->cast(td, host(dst));
      e.cpu->cast(ts, host(src));
      e.cpu->add_into(td, ts);
      std::vector<float> want(n);
      e.cpu->cast(host(want), td);
      Block gd = e.upload(dst, dt, "dst"), gs = e.upload(src, st, "src");
      e.gpu->add_into(Env::dev(gd, dt, n), Env::dev(gs, st, n));
      CHECK(bit_equal(e.download(gd, dt, n), want));  // one f32 sum, the cast's rounding
    }
  // AdamW: the gradients as bf16 on the GPU, their f32 copy on the CPU (the same values).
  auto p = random_vector("cuda adamw p", n), g = random_vector("cuda adamw g", n);
  for (auto& v : g) v = test::round_to(v, DType::bf16);
  std::vector<float> m(n, 0.f), v(n, 0.f), cp = p;
  Block gp = up(e, p, "p"), gg = e.upload(g, DType::bf16, "g"), gm = up(e, m, "m"), gv = up(e, v, "v");
  for (int step = 1; step <= 3; ++step) {
    const AdamWArgs a{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.7f};
    ops::adamw_update(*e.cpu, host(cp), host(g), host(m), host(v), a);
    ops::adamw_update(*e.gpu, gp.flat(DType::f32), Env::dev(gg, DType::bf16, n), gm.flat(DType::f32),
                      gv.flat(DType::f32), a);
  }
  // The same arithmetic on the same values; sqrt and division correctly rounded on both.
  expect_close(down(e, gp, n), cp, 1e-6, 1e-7, "adamw p (bf16 gradients)");
}
