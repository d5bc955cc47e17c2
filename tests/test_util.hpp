// test_util.hpp — small helpers shared by the tests: deterministic inputs and tolerances.
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "src/backend/backend.hpp"
#include "src/core/dtype.hpp"
#include "src/core/rng.hpp"

namespace shardlab::test {

// n uniform values in [lo, hi), a function of (name, index) only.
inline std::vector<float> random_vector(const std::string& name, size_t n, float lo = -1.f, float hi = 1.f,
                                        uint64_t seed = 1234) {
  std::vector<float> v(n);
  Rng(seed, name).fill_uniform(v, 0, lo, hi);
  return v;
}

// The value x takes once stored in dtype t.
inline float round_to(float x, DType t) {
  switch (t) {
    case DType::f32: return x;
    case DType::bf16: return bf16_bits_to_f32(f32_to_bf16_bits(x));
    case DType::f16: return f16_bits_to_f32(f32_to_f16_bits(x));
  }
  return x;
}

// Distance between adjacent values of dtype t around |x| (the unit in the last place).
inline double ulp(double x, DType t) {
  int mant_bits = t == DType::f32 ? 23 : t == DType::bf16 ? 7 : 10;
  int min_exp = t == DType::f16 ? -14 : -126;
  int e = x == 0.0 ? min_exp : std::max(min_exp, static_cast<int>(std::floor(std::log2(std::fabs(x)))));
  return std::ldexp(1.0, e - mant_bits);
}

// C = alpha op(A) op(B) + beta C in double, row-major, for one batch entry.
inline void gemm_reference(const GemmDesc& d, const float* A, const float* B, float* C) {
  for (int64_t i = 0; i < d.m; ++i)
    for (int64_t j = 0; j < d.n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < d.k; ++p) {
        double a = d.trans_a == Trans::N ? A[i * d.lda + p] : A[p * d.lda + i];
        double b = d.trans_b == Trans::N ? B[p * d.ldb + j] : B[j * d.ldb + p];
        acc += a * b;
      }
      C[i * d.ldc + j] = static_cast<float>(d.alpha * acc + d.beta * C[i * d.ldc + j]);
    }
}

}  // namespace shardlab::test
