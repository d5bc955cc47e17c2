// tile_product.cpp — tile_product (tile_product.hpp): the kernel of tile_product_isa.inl built twice,
// for AVX-512 and AVX2, each in a namespace and a target region of its own (so no inline function
// compiled for AVX-512 can stand in for another file's copy), and the runtime choice between them.
#include "src/backend/cpu/tile_product.hpp"

#include <immintrin.h>

#include <algorithm>
#include <limits>

#include "src/backend/cpu/gemm.hpp"

namespace shardlab::cpu {
namespace {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,fma")
namespace avx512 {
#define TP(op) _mm512_##op##_ps
#define TP_V __m512
// _mm512_max_ps starts from an undefined vector that GCC 12 warns of: the masked form starts from a.
#define TP_MAX(a, b) _mm512_mask_max_ps(a, static_cast<__mmask16>(0xffff), a, b)
constexpr int kBlockVecs = 4;
#include "src/backend/cpu/tile_product_isa.inl"
#undef TP
#undef TP_V
#undef TP_MAX
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
#define TP(op) _mm256_##op##_ps
#define TP_V __m256
#define TP_MAX(a, b) _mm256_max_ps(a, b)
constexpr int kBlockVecs = 2;
#include "src/backend/cpu/tile_product_isa.inl"
#undef TP
#undef TP_V
#undef TP_MAX
}  // namespace avx2
#pragma GCC pop_options

enum class Isa { avx512, avx2, none };

// oneDNN's effective ISA (capped by ONEDNN_MAX_CPU_ISA), so both libraries and this kernel agree.
Isa isa() {
  static const Isa chosen = host_avx512()                                                         ? Isa::avx512
                            : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? Isa::avx2
                                                                                              : Isa::none;
  return chosen;
}

}  // namespace

const char* tile_product_isa() {
  switch (isa()) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::none: break;
  }
  return "sgemm";
}

void tile_product(int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t ai, int64_t ak, const float* B,
                  int64_t ldb, bool accumulate, float* C, int64_t ldc, TileMask mask) {
  if (m <= 0 || n <= 0) return;
  const Isa use = n % kTileVec == 0 ? isa() : Isa::none;
  if (use == Isa::avx512) return avx512::product(m, n, k, alpha, A, ai, ak, B, ldb, accumulate, C, ldc, mask);
  if (use == Isa::avx2) return avx2::product(m, n, k, alpha, A, ai, ak, B, ldb, accumulate, C, ldc, mask);
  if (k == 0) {  // no terms (the libraries refuse k = 0)
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill_n(C + i * ldc, n, 0.f);
    return;
  }
  // A' is A (row stride ai) when ak = 1, else Aᵀ of an A with row stride ak.
  const bool a_rows = ak == 1;
  const GemmLib lib = gemm_policy() == GemmPolicy::openblas ? GemmLib::openblas : GemmLib::onednn;
  sgemm_with(lib, a_rows ? Trans::N : Trans::T, Trans::N, m, n, k, alpha, A, a_rows ? ai : ak, B, ldb,
             accumulate ? 1.f : 0.f, C, ldc);
}

void tile_product_scores(int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t ai, int64_t ak,
                         const float* B, int64_t ldb, float* C, int64_t ldc, int64_t d, float* colmax) {
  if (m <= 0 || n <= 0) return;
  const Isa use = n % kTileVec == 0 ? isa() : Isa::none;
  if (use == Isa::avx512) return avx512::scores(m, n, k, alpha, A, ai, ak, B, ldb, C, ldc, d, colmax);
  if (use == Isa::avx2) return avx2::scores(m, n, k, alpha, A, ai, ak, B, ldb, C, ldc, d, colmax);
  tile_product(m, n, k, alpha, A, ai, ak, B, ldb, false, C, ldc);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < n; ++c) {
      float& x = C[i * ldc + c];
      if (i - c >= d) x = -std::numeric_limits<float>::infinity();
      colmax[c] = std::max(colmax[c], x);
    }
}

}  // namespace shardlab::cpu
