// The CPU backend's two sgemm libraries against a double-precision reference, the rule that picks
// between them, and --cpu-gemm.
#include <catch2/catch.hpp>
#include <cmath>

#include "src/backend/backend.hpp"
#include "src/backend/cpu/gemm.hpp"
#include "tests/test_util.hpp"

using shardlab::BackendConfig;
using shardlab::GemmDesc;
using shardlab::InputError;
using shardlab::Trans;
using shardlab::make_cpu_backend;
using shardlab::test::gemm_reference;
using shardlab::test::random_vector;
namespace cpu = shardlab::cpu;

TEST_CASE("oneDNN and OpenBLAS each match the reference: every transpose, padded strides, beta", "[backend][gemm]") {
  // Sizes past the rule's thresholds (k > 512, both output sides >= 256) as well as small ones, so
  // each library runs the code paths the rule gives it.
  struct Size {
    int64_t m, n, k;
  };
  const Size sizes[] = {{257, 256, 520}, {37, 64, 130}};
  for (const Size& z : sizes)
    for (cpu::GemmLib lib : {cpu::GemmLib::onednn, cpu::GemmLib::openblas})
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
          GemmDesc d;
          d.trans_a = ta ? Trans::T : Trans::N;
          d.trans_b = tb ? Trans::T : Trans::N;
          d.m = z.m, d.n = z.n, d.k = z.k;
          d.alpha = 0.75f;
          d.beta = 1.f;  // the weight gradients accumulate
          d.lda = (ta ? z.m : z.k) + 3;
          d.ldb = (tb ? z.k : z.n) + 5;
          d.ldc = z.n + 2;
          auto A = random_vector("A", static_cast<size_t>((ta ? z.k : z.m) * d.lda));
          auto B = random_vector("B", static_cast<size_t>((tb ? z.n : z.k) * d.ldb));
          auto C = random_vector("C", static_cast<size_t>(z.m * d.ldc));
          auto ref = C;
          cpu::sgemm_with(lib, d.trans_a, d.trans_b, d.m, d.n, d.k, d.alpha, A.data(), d.lda, B.data(), d.ldb, d.beta,
                          C.data(), d.ldc);
          gemm_reference(d, A.data(), B.data(), ref.data());
          double max_err = 0;
          for (size_t i = 0; i < C.size(); ++i) max_err = std::max(max_err, std::fabs(double(C[i]) - ref[i]));
          // Tolerance: inputs in [-1, 1), f32 sums of k products: 2e-6 x k absolute.
          INFO(cpu::gemm_lib_name(lib) << " m=" << z.m << " n=" << z.n << " k=" << z.k << " trans_a=" << ta
                                       << " trans_b=" << tb << " max abs error " << max_err);
          CHECK(max_err <= 2e-6 * double(z.k));
        }
}

TEST_CASE("the sgemm rule on AVX2: linear layers by k, attention's products by transposes and B's stride",
          "[backend][gemm]") {
  using cpu::GemmLib;
  using cpu::GemmShape;
  const auto avx2 = [](GemmShape s) { return cpu::gemm_rule(s, false); };
  const Trans N = Trans::N, T = Trans::T;
  // The linear layers at C = 256, B*T = 1024 (the benchmark shape).
  CHECK(avx2({N, N, 1024, 768, 256, 256, 768}) == GemmLib::onednn);      // qkv forward
  CHECK(avx2({N, N, 1024, 256, 1024, 1024, 256}) == GemmLib::openblas);  // mlp projection forward
  CHECK(avx2({T, N, 256, 1024, 1024, 256, 1024}) == GemmLib::openblas);  // fc weight gradient
  CHECK(avx2({T, N, 1024, 256, 1024, 1024, 256}) == GemmLib::openblas);  // projection weight gradient
  // Attention's per-head products (head size 64; leading dimensions 3C, C or T as in kernels.cpp).
  for (int64_t C : {256, 512, 768, 1024})
    for (int64_t Tn : {128, 256, 512, 1024}) {
      INFO("C=" << C << " T=" << Tn);
      CHECK(avx2({N, T, Tn, Tn, 64, 3 * C, 3 * C}) == GemmLib::onednn);  // q k^T
      CHECK(avx2({N, T, Tn, Tn, 64, C, 3 * C}) == GemmLib::onednn);      // d(a)
      const bool aliased = C == 1024 || (C == 512 && Tn >= 512);        // B's rows 4 KiB apart (or 2 KiB, long)
      CHECK(avx2({N, N, Tn, 64, Tn, Tn, 3 * C}) == (aliased ? GemmLib::openblas : GemmLib::onednn));  // a v, dq
      const bool dv_open = Tn >= 256 || C == 1024;
      CHECK(avx2({T, N, Tn, 64, Tn, Tn, C}) == (dv_open ? GemmLib::openblas : GemmLib::onednn));       // dv
      CHECK(avx2({T, N, Tn, 64, Tn, Tn, 3 * C}) == (dv_open ? GemmLib::openblas : GemmLib::onednn));   // dk
    }
  // AVX-512: oneDNN throughout.
  CHECK(cpu::gemm_rule({T, N, 256, 1024, 1024, 256, 1024}, true) == GemmLib::onednn);
  CHECK(cpu::gemm_rule({N, N, 1024, 64, 1024, 1024, 3072}, true) == GemmLib::onednn);
}

TEST_CASE("--cpu-gemm: a policy per backend, bad values named", "[backend][gemm]") {
  BackendConfig c{1};
  c.cpu_gemm = "openblas";
  auto be = make_cpu_backend(c);
  CHECK_THAT(be->describe(), Catch::Contains("OpenBLAS sgemm"));
  CHECK(cpu::gemm_pick({Trans::N, Trans::N, 8, 8, 8, 8, 8}) == cpu::GemmLib::openblas);
  c.cpu_gemm = "onednn";
  be = make_cpu_backend(c);
  CHECK(cpu::gemm_pick({Trans::T, Trans::N, 4096, 4096, 4096, 4096, 4096}) == cpu::GemmLib::onednn);
  c.cpu_gemm = "auto";
  be = make_cpu_backend(c);
  CHECK_THAT(be->describe(), Catch::Contains("by shape"));
  c.cpu_gemm = "mkl";
  CHECK_THROWS_AS(make_cpu_backend(c), InputError);
  CHECK_THROWS_WITH(make_cpu_backend(c), Catch::Contains("--cpu-gemm 'mkl': expected auto, onednn or openblas"));
}
