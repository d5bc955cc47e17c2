// tile_product.hpp — the register-blocked product the fused attention's tiles are made of.
//
// A tile product is small (256 x 256 x 128 at most) and there are millions of them in a long
// sequence: a library call packs its operands on every call and was half the fused kernel's time.
// This one packs nothing: the caller lays B out once per tile, row-major and contiguous, and the
// product reads A through two strides, so one kernel serves A and Aᵀ (Q Kᵀ, P V, Pᵀ dO, dS K,
// dSᵀ Q). Vectorised for AVX-512 (16 floats, 6 x 4 vector registers of C) and AVX2 (8 floats,
// 6 x 2), picked by the ISA oneDNN runs with (ONEDNN_MAX_CPU_ISA caps both), so an AVX-512 host told
// to act as an AVX2 one runs the AVX2 code. Elsewhere, or when n is not a multiple of 16, the
// product goes to sgemm (same result to rounding).
//
// The sums run over k in order for every element whatever the ISA's blocking, so a product's bits
// depend on the ISA alone, never on the thread count.
#pragma once
#include <cstdint>

namespace shardlab::cpu {

// Columns of B and C are processed in whole vectors of this many floats: n % kTileVec == 0 runs the
// vectorised kernel (attention pads its key tiles to it).
inline constexpr int64_t kTileVec = 16;

// What a causal mask leaves of a product, so the kernel skips the rest a register block at a time
// (on the sgemm path the mask is ignored: the skipped terms are zero, the skipped elements
// unwanted). d places the diagonal in the tile's own row, column and term indices.
struct TileMask {
  enum Kind : uint8_t {
    none,
    cols_before,   // only the elements C(i, c) with c < i + d are wanted: the others may stay unwritten
    terms_before,  // only the terms p < i + d of row i are nonzero
    terms_after,   // only the terms p > i - d of row i are nonzero
  } kind = none;
  int64_t d = 0;
};

// C (m, n) = alpha A' B (+ C when accumulate), where A'(i, p) = A[i ai + p ak] (ak = 1: A row-major
// with row stride ai; ai = 1: Aᵀ of a row-major A with row stride ak), B (k, n) row-major with row
// stride ldb, C row-major with row stride ldc. Skipping zero terms leaves every sum's bits as they
// are (the terms that remain are added in the same order).
void tile_product(int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t ai, int64_t ak, const float* B,
                  int64_t ldb, bool accumulate, float* C, int64_t ldc, TileMask mask = {});

// The forward attention's scores: C = alpha A' B where i < c + d and -inf where i >= c + d (the
// masked keys; every element of C written, none of the masked ones computed), and the running
// column maxima colmax[c] = max(colmax[c], C(i, c)) taken as C is stored.
void tile_product_scores(int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t ai, int64_t ak,
                         const float* B, int64_t ldb, float* C, int64_t ldc, int64_t d, float* colmax);

// Which code runs tile_product: "avx512", "avx2" or "sgemm".
const char* tile_product_isa();

}  // namespace shardlab::cpu
