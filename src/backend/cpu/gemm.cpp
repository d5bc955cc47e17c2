// gemm.cpp — oneDNN and OpenBLAS behind one row-major sgemm, and the rule that chooses between them.
#include "src/backend/cpu/gemm.hpp"
#include "src/backend/cpu/kernels.hpp"

#include <cblas.h>
#include <dnnl.h>

#include <algorithm>
#include <atomic>

namespace shardlab::cpu {
namespace {
std::atomic<GemmPolicy> g_policy{GemmPolicy::automatic};
}  // namespace

const char* gemm_lib_name(GemmLib lib) { return lib == GemmLib::onednn ? "onednn" : "openblas"; }

GemmPolicy parse_gemm_policy(const std::string& s) {
  if (s == "auto") return GemmPolicy::automatic;
  if (s == "onednn") return GemmPolicy::onednn;
  if (s == "openblas") return GemmPolicy::openblas;
  throw InputError(fmt::format("--cpu-gemm '{}': expected auto, onednn or openblas", s));
}

bool host_avx512() {
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const unsigned core = static_cast<unsigned>(dnnl_cpu_isa_avx512_core);
  return (isa & core) == core;
}

std::string gemm_isa_describe() {
  return fmt::format("oneDNN {}, OpenBLAS {}", host_avx512() ? "avx512" : "avx2", openblas_get_corename());
}

std::string gemm_library_versions() {
  const dnnl_version_t* v = dnnl_version();
  const std::string hash = v->hash ? v->hash : "N/A";
  return fmt::format("oneDNN {}.{}.{}{}, {}", v->major, v->minor, v->patch,
                     hash == "N/A" ? "" : fmt::format(" (commit {})", hash), openblas_get_config());
}

namespace {
// Rows of B whose byte stride is a multiple of 4096 (or of 2048, for k >= 512) fall into one or two
// sets of a 4-KiB-periodic L1: oneDNN, which reads small products' B in place, slows to 40-67
// GFLOP/s there (attention's v and k rows at C = 1024, and at C = 512 for T >= 512); OpenBLAS
// copies B into a packed buffer first and does not care.
bool aliasing_rows(int64_t ld, int64_t k) {
  const int64_t bytes = ld * static_cast<int64_t>(sizeof(float));
  return bytes % 4096 == 0 || (bytes % 2048 == 0 && k >= 512);
}
}  // namespace

// Measured with `shardlab bench-gemm` and a sweep of attention's products over C = 256-1600 and
// T = 128-1024 (docs/performance.md, "CPU GEMM"), one thread:
// - AVX2 (AMD EPYC), products with both output sides >= 256 (the linear layers): with k <= 256
//   oneDNN is the faster (92-98 GFLOP/s against OpenBLAS's 90-91). With k >= 512 oneDNN falls to
//   40-72 GFLOP/s on A-transposed products (the weight gradients, k = B*T) and to 85-88 where an
//   output side is 256, while OpenBLAS holds 90-94 on all of them.
// - AVX2, attention's per-head products (one output side the head size, 64):
//   q k^T and d(a) (B transposed, k = 64): oneDNN 78-91 against OpenBLAS's 62-72, always.
//   dv and dk (A transposed, k = T): from T = 256 on OpenBLAS 78-82 against oneDNN's 35-84.
//   a v and dq (neither transposed): oneDNN 80-94 against 72-80, unless B's rows alias (above).
// - AVX-512: oneDNN's sgemm led OpenBLAS on every GPT-2 shape measured (101-108 against 58-86
//   GFLOP/s), so it keeps every product there.
GemmLib gemm_rule(const GemmShape& s, bool avx512) {
  if (avx512) return GemmLib::onednn;
  if (std::min(s.m, s.n) >= 256) return s.k <= 256 ? GemmLib::onednn : GemmLib::openblas;
  if (s.tb == Trans::T) return GemmLib::onednn;
  if (s.ta == Trans::T && s.k >= 256) return GemmLib::openblas;
  if (aliasing_rows(s.ldb, s.k)) return GemmLib::openblas;
  return GemmLib::onednn;
}

void set_gemm_policy(GemmPolicy p) { g_policy.store(p, std::memory_order_relaxed); }
GemmPolicy gemm_policy() { return g_policy.load(std::memory_order_relaxed); }

GemmLib gemm_pick(const GemmShape& s) {
  switch (gemm_policy()) {
    case GemmPolicy::onednn: return GemmLib::onednn;
    case GemmPolicy::openblas: return GemmLib::openblas;
    case GemmPolicy::automatic: break;
  }
  static const bool avx512 = host_avx512();
  return gemm_rule(s, avx512);
}

void sgemm_with(GemmLib lib, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (lib == GemmLib::openblas) {
    // OpenBLAS takes int sizes; every GPT-2 product is far below 2^31 per side.
    SHARD_CHECK(std::max({m, n, k, lda, ldb, ldc}) <= INT32_MAX, "openblas sgemm: a side over 2^31 (m={} n={} k={})",
                m, n, k);
    cblas_sgemm(CblasRowMajor, ta == Trans::N ? CblasNoTrans : CblasTrans, tb == Trans::N ? CblasNoTrans : CblasTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, A, static_cast<int>(lda), B,
                static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
    return;
  }
  dnnl_status_t st = dnnl_sgemm(ta == Trans::N ? 'N' : 'T', tb == Trans::N ? 'N' : 'T', m, n, k, alpha, A, lda, B,
                                ldb, beta, C, ldc);
  SHARD_CHECK(st == dnnl_success, "dnnl_sgemm failed with status {} (m={} n={} k={})", static_cast<int>(st), m, n, k);
}

// kernels.hpp's entry for the kernels (attention): the library gemm_pick chooses for the shape.
void sgemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  sgemm_with(gemm_pick(GemmShape{ta, tb, m, n, k, lda, ldb}), ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace shardlab::cpu
