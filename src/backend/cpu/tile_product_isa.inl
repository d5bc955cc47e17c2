// tile_product_isa.inl — tile_product's kernel for one vector ISA, included by tile_product.cpp once
// per ISA inside a namespace of its own and a `#pragma GCC target` region, with TP(op) naming the
// ISA's _mm*_<op>_ps intrinsic, TP_V its vector type and kBlockVecs the vectors of C a block holds
// per row (not a header: no include guard, no includes).

constexpr int kW = static_cast<int>(sizeof(TP_V) / sizeof(float));
constexpr int kBlockRows = 6;

using BlockFn = void (*)(int64_t k, float alpha, const float* A, int64_t ai, int64_t ak, const float* B, int64_t ldb,
                         bool accumulate, float* C, int64_t ldc);

// R rows by N vectors of C held in registers while p runs over k: per step N loads of B's row p,
// R broadcasts of A'(i, p) and R x N fused multiply-adds.
template <int R, int N>
void block(int64_t k, float alpha, const float* A, int64_t ai, int64_t ak, const float* B, int64_t ldb,
           bool accumulate, float* C, int64_t ldc) {
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
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) {
      float* dst = C + i * ldc + n * kW;
      TP_V r = TP(mul)(c[i][n], al);
      if (accumulate) r = TP(add)(r, TP(loadu)(dst));
      TP(storeu)(dst, r);
    }
}

template <int R, int N>
BlockFn pick_vecs(int n) {
  if constexpr (N == 1) return &block<R, 1>;
  else return n == N ? &block<R, N> : pick_vecs<R, N - 1>(n);
}

template <int R>
BlockFn pick(int r, int n) {
  if constexpr (R == 1) return pick_vecs<1, kBlockVecs>(n);
  else return r == R ? pick_vecs<R, kBlockVecs>(n) : pick<R - 1>(r, n);
}

// Blocks of kBlockVecs vectors of columns outer (B's panel stays in L1 while the rows go by), rows inner.
void product(int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t ai, int64_t ak, const float* B,
             int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  const int64_t vecs = n / kW;
  for (int64_t v0 = 0; v0 < vecs; v0 += kBlockVecs) {
    const int nv = static_cast<int>(vecs - v0 < kBlockVecs ? vecs - v0 : kBlockVecs);
    for (int64_t i0 = 0; i0 < m; i0 += kBlockRows) {
      const int r = static_cast<int>(m - i0 < kBlockRows ? m - i0 : kBlockRows);
      pick<kBlockRows>(r, nv)(k, alpha, A + i0 * ai, ai, ak, B + v0 * kW, ldb, accumulate, C + i0 * ldc + v0 * kW, ldc);
    }
  }
}
