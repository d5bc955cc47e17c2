// tile_product_isa.inl — tile_product's kernel for one vector ISA, included by tile_product.cpp once
// per ISA inside a namespace of its own and a `#pragma GCC target` region, with TP(op) naming the
// ISA's _mm*_<op>_ps intrinsic, TP_V its vector type, TP_MAX(a, b) its maximum and kBlockVecs the
// vectors of C a block holds per row (not a header: no include guard, no includes).

constexpr int kW = static_cast<int>(sizeof(TP_V) / sizeof(float));
constexpr int kBlockRows = 6;

// A block: rows and vectors of C held in registers. colmax and e serve the scores' blocks alone.
using BlockFn = void (*)(int64_t k, float alpha, const float* A, int64_t ai, int64_t ak, const float* B, int64_t ldb,
                         bool accumulate, float* C, int64_t ldc, float* colmax, int64_t e);

// R rows by N vectors of C held in registers while p runs over k: per step N loads of B's row p,
// R broadcasts of A'(i, p) and R x N fused multiply-adds. Scores (S): no accumulation; the block's
// element (i, c) is masked (-inf) when i - c >= e, a block wholly masked is stored without a term
// computed, and colmax (the block's N vectors) takes the maximum of what is stored.
template <int R, int N, bool S>
void block(int64_t k, float alpha, const float* A, int64_t ai, int64_t ak, const float* B, int64_t ldb,
           bool accumulate, float* C, int64_t ldc, [[maybe_unused]] float* colmax, [[maybe_unused]] int64_t e) {
  constexpr float kMasked = -__builtin_inff();
  if constexpr (S) {
    if (e <= -(N * kW - 1)) {  // every element masked
      for (int i = 0; i < R; ++i)
        for (int n = 0; n < N; ++n) TP(storeu)(C + i * ldc + n * kW, TP(set1)(kMasked));
      return;
    }
  }
  TP_V c[R][N];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) c[i][n] = TP(setzero)();
  for (int64_t p = 0; p < k; ++p) {
    const float* a = A + p * ak;
    const float* b = B + p * ldb;
    TP_V bv[N];
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) bv[n] = TP(loadu)(b + n * kW);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const TP_V av = TP(set1)(a[i * ai]);
#pragma GCC unroll 8
      for (int n = 0; n < N; ++n) c[i][n] = TP(fmadd)(av, bv[n], c[i][n]);
    }
  }
  const TP_V al = TP(set1)(alpha);
  [[maybe_unused]] TP_V mx[N];
  if constexpr (S)
    for (int n = 0; n < N; ++n) mx[n] = TP(set1)(kMasked);
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) {
      float* dst = C + i * ldc + n * kW;
      TP_V r = TP(mul)(c[i][n], al);
      if (accumulate) r = TP(add)(r, TP(loadu)(dst));
      TP(storeu)(dst, r);
      if constexpr (S) mx[n] = TP_MAX(mx[n], r);
    }
  if constexpr (S) {
    if (e <= R - 1) {  // the diagonal crosses the block: mask what it leaves, then the maxima again
      for (int i = 0; i < R; ++i)
        for (int64_t j = 0; j < N * kW && j <= i - e; ++j) C[i * ldc + j] = kMasked;
      for (int n = 0; n < N; ++n) {
        mx[n] = TP(set1)(kMasked);
        for (int i = 0; i < R; ++i) mx[n] = TP_MAX(mx[n], TP(loadu)(C + i * ldc + n * kW));
      }
    }
    for (int n = 0; n < N; ++n) TP(storeu)(colmax + n * kW, TP_MAX(TP(loadu)(colmax + n * kW), mx[n]));
  }
}

template <int R, int N, bool S>
BlockFn pick_vecs(int n) {
  if constexpr (N == 1) return &block<R, 1, S>;
  else return n == N ? &block<R, N, S> : pick_vecs<R, N - 1, S>(n);
}

template <int R, bool S>
BlockFn pick(int r, int n) {
  if constexpr (R == 1) return pick_vecs<1, kBlockVecs, S>(n);
  else return r == R ? pick_vecs<R, kBlockVecs, S>(n) : pick<R - 1, S>(r, n);
}

inline int64_t clamp_to(int64_t x, int64_t hi) { return x < 0 ? 0 : x > hi ? hi : x; }

// Blocks of kBlockVecs vectors of columns outer (B's panel stays in L1 while the rows go by), rows
// inner. A product (S false): a mask narrows each block's terms or vectors to what it leaves. The
// scores (S true): every block run whole, masked past d (mask.d) and its maxima into colmax.
template <bool S>
void blocks(int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t ai, int64_t ak, const float* B,
            int64_t ldb, bool accumulate, float* C, int64_t ldc, TileMask mask, float* colmax) {
  const int64_t vecs = n / kW;
  for (int64_t v0 = 0; v0 < vecs; v0 += kBlockVecs) {
    const int nv = static_cast<int>(vecs - v0 < kBlockVecs ? vecs - v0 : kBlockVecs);
    for (int64_t i0 = 0; i0 < m; i0 += kBlockRows) {
      const int r = static_cast<int>(m - i0 < kBlockRows ? m - i0 : kBlockRows);
      const int64_t last = i0 + r - 1;  // the block's last row
      int nb = nv;
      int64_t lo = 0, hi = k;
      if constexpr (!S) {
        switch (mask.kind) {
          case TileMask::none: break;
          case TileMask::cols_before:  // the vectors holding the columns c < last + d
            nb = static_cast<int>(clamp_to(last + mask.d - v0 * kW + kW - 1, nv * kW) / kW);
            break;
          case TileMask::terms_before: hi = clamp_to(last + mask.d, k); break;
          case TileMask::terms_after: lo = clamp_to(i0 - mask.d + 1, k); break;
        }
        if (nb == 0) continue;
      }
      pick<kBlockRows, S>(r, nb)(hi - lo, alpha, A + i0 * ai + lo * ak, ai, ak, B + lo * ldb + v0 * kW, ldb,
                                 accumulate, C + i0 * ldc + v0 * kW, ldc, S ? colmax + v0 * kW : nullptr,
                                 S ? mask.d - i0 + v0 * kW : 0);
    }
  }
}

void product(int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t ai, int64_t ak, const float* B,
             int64_t ldb, bool accumulate, float* C, int64_t ldc, TileMask mask) {
  blocks<false>(m, n, k, alpha, A, ai, ak, B, ldb, accumulate, C, ldc, mask, nullptr);
}

void scores(int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t ai, int64_t ak, const float* B,
            int64_t ldb, float* C, int64_t ldc, int64_t d, float* colmax) {
  blocks<true>(m, n, k, alpha, A, ai, ak, B, ldb, false, C, ldc, TileMask{TileMask::none, d}, colmax);
}
