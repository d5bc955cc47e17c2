// The fused attention's tile product (src/backend/cpu/tile_product.hpp) against a product in double:
// every row and column-block tail of the register blocking, A and Aᵀ, k = 0, accumulation, row strides
// wider than the rows, and n off the vector width (the sgemm path). The test `unit_avx2` runs these
// under ONEDNN_MAX_CPU_ISA=AVX2, so an AVX-512 host checks the AVX2 kernel too.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

#include "src/backend/cpu/tile_product.hpp"
#include "tests/test_util.hpp"

using namespace shardlab;

TEST_CASE("tile products match a product in double, for A and its transpose", "[tile][ops]") {
  INFO("kernel " << cpu::tile_product_isa());
  const float alpha = 0.125f;
  for (const int64_t m : {1, 5, 6, 7, 13, 64})
    for (const int64_t n : {16, 48, 64, 80, 144, 256, 8, 40})
      for (const int64_t k : {0, 1, 3, 64, 129})
        for (const bool transposed : {false, true})
          for (const bool accumulate : {false, true}) {
            std::ostringstream what;
            what << "m " << m << " n " << n << " k " << k << (transposed ? " A transposed" : "")
                 << (accumulate ? " accumulating" : "");
            INFO(what.str());
            // A' (m, k): A row-major (m, k + 3), or Aᵀ of a row-major (k, m + 5); B (k, n + 16); C (m, n + 7).
            const int64_t ai = transposed ? 1 : k + 3, ak = transposed ? m + 5 : 1, ldb = n + 16, ldc = n + 7;
            const auto A = test::random_vector("tile A", static_cast<size_t>(transposed ? k * ak : m * ai));
            const auto B = test::random_vector("tile B", static_cast<size_t>(k * ldb));
            auto C = test::random_vector("tile C", static_cast<size_t>(m * ldc));
            const auto C0 = C;
            cpu::tile_product(m, n, k, alpha, A.data(), ai, ak, B.data(), ldb, accumulate, C.data(), ldc);
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < ldc; ++j) {
                const size_t at = static_cast<size_t>(i * ldc + j);
                if (j >= n) {
                  REQUIRE(C[at] == C0[at]);  // past n: untouched
                  continue;
                }
                double want = 0.0, mag = 0.0;
                for (int64_t p = 0; p < k; ++p) {
                  const double t = static_cast<double>(A[static_cast<size_t>(i * ai + p * ak)]) *
                                   static_cast<double>(B[static_cast<size_t>(p * ldb + j)]);
                  want += t;
                  mag += std::fabs(t);
                }
                want = alpha * want + (accumulate ? static_cast<double>(C0[at]) : 0.0);
                REQUIRE(std::fabs(static_cast<double>(C[at]) - want) <= 1e-6 * (alpha * mag + 1.0));
              }
          }
}

// A causal mask's product skips what the mask leaves nothing of: the elements it keeps must have the
// unmasked product's bits (terms the mask zeroes are zero in A, as attention's are), at every
// diagonal offset across the register blocks and their tails, A and Aᵀ, with accumulation.
TEST_CASE("masked tile products keep the unmasked product's bits where the mask leaves terms", "[tile][ops]") {
  INFO("kernel " << cpu::tile_product_isa());
  using Kind = cpu::TileMask::Kind;
  for (const Kind kind : {Kind::cols_before, Kind::terms_before, Kind::terms_after})
    for (const int64_t m : {1, 7, 13, 40})
      for (const int64_t n : {16, 48, 80, 8})
        for (const int64_t k : {0, 5, 64})
          for (const int64_t d : {-70, -9, 0, 1, 6, 17, 33, 100})
            for (const bool transposed : {false, true}) {
              const bool accumulate = kind != Kind::cols_before;
              std::ostringstream what;
              what << "kind " << int(kind) << " m " << m << " n " << n << " k " << k << " d " << d
                   << (transposed ? " A transposed" : "");
              INFO(what.str());
              const int64_t ai = transposed ? 1 : k + 3, ak = transposed ? m + 5 : 1, ldb = n + 16, ldc = n + 7;
              auto A = test::random_vector("tile A", static_cast<size_t>(transposed ? k * ak : m * ai));
              for (int64_t i = 0; i < m; ++i)
                for (int64_t p = 0; p < k; ++p) {
                  const bool zero = kind == Kind::terms_before ? p >= i + d : kind == Kind::terms_after && p <= i - d;
                  if (zero) A[static_cast<size_t>(i * ai + p * ak)] = 0.f;
                }
              const auto B = test::random_vector("tile B", static_cast<size_t>(k * ldb));
              auto C = test::random_vector("tile C", static_cast<size_t>(m * ldc));
              auto want = C;
              cpu::tile_product(m, n, k, 0.5f, A.data(), ai, ak, B.data(), ldb, accumulate, want.data(), ldc);
              cpu::tile_product(m, n, k, 0.5f, A.data(), ai, ak, B.data(), ldb, accumulate, C.data(), ldc, {kind, d});
              for (int64_t i = 0; i < m; ++i)
                for (int64_t c = 0; c < n; ++c) {
                  if (kind == Kind::cols_before && c >= i + d) continue;  // not wanted
                  const size_t at = static_cast<size_t>(i * ldc + c);
                  INFO("C(" << i << ", " << c << ")");
                  REQUIRE(C[at] == want[at]);
                }
            }
}

TEST_CASE("score tiles are the product, -inf past the diagonal, with their column maxima", "[tile][ops]") {
  INFO("kernel " << cpu::tile_product_isa());
  const float inf = std::numeric_limits<float>::infinity();
  for (const int64_t m : {1, 7, 13, 40})
    for (const int64_t n : {16, 48, 80, 8})
      for (const int64_t k : {5, 64})
        for (const int64_t d : {-100, -9, 0, 1, 6, 17, 33, 1000}) {
          std::ostringstream what;
          what << "m " << m << " n " << n << " k " << k << " d " << d;
          INFO(what.str());
          const int64_t ai = k + 3, ldb = n + 16, ldc = n + 7;
          const auto A = test::random_vector("tile A", static_cast<size_t>(m * ai));
          const auto B = test::random_vector("tile B", static_cast<size_t>(k * ldb));
          auto C = test::random_vector("tile C", static_cast<size_t>(m * ldc));
          auto plain = C;
          cpu::tile_product(m, n, k, 0.25f, A.data(), ai, 1, B.data(), ldb, false, plain.data(), ldc);
          std::vector<float> colmax(static_cast<size_t>(n), -inf);
          colmax[0] = 0.5f;  // a running max from an earlier tile is kept when larger
          const auto before = colmax;
          cpu::tile_product_scores(m, n, k, 0.25f, A.data(), ai, 1, B.data(), ldb, C.data(), ldc, d, colmax.data());
          for (int64_t c = 0; c < n; ++c) {
            float mx = before[static_cast<size_t>(c)];
            for (int64_t i = 0; i < m; ++i) {
              const size_t at = static_cast<size_t>(i * ldc + c);
              INFO("C(" << i << ", " << c << ")");
              REQUIRE(C[at] == (i - c >= d ? -inf : plain[at]));
              mx = std::max(mx, C[at]);
            }
            REQUIRE(colmax[static_cast<size_t>(c)] == mx);
          }
          for (int64_t i = 0; i < m; ++i)  // past n: untouched
            for (int64_t c = n; c < ldc; ++c) {
              const size_t at = static_cast<size_t>(i * ldc + c);
              REQUIRE(C[at] == plain[at]);
            }
        }
}
