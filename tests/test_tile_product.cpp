// The fused attention's tile product (src/backend/cpu/tile_product.hpp) against a product in double:
// every row and column-block tail of the register blocking, A and Aᵀ, k = 0, accumulation, row strides
// wider than the rows, and n off the vector width (the sgemm path). The test `unit_avx2` runs these
// under ONEDNN_MAX_CPU_ISA=AVX2, so an AVX-512 host checks the AVX2 kernel too.
#include <catch2/catch.hpp>
#include <cmath>
#include <sstream>

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
