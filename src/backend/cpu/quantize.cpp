// quantize.cpp — the CPU block-wise quantization of ZeRO++ (ops/quantize.hpp has the format).
#include <cmath>
#include <cstring>

#include "src/backend/cpu/kernels.hpp"
#include "src/core/dtype.hpp"

namespace shardlab::cpu {
namespace {
float load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return f16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.f;
}
void store(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = v; break;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(v); break;
    case DType::f16: static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(v); break;
  }
}
// The code of one value: x / scale rounded to nearest even, clamped (a NaN scale gives 0 codes).
int code_of(float x, float scale, int qmax) {
  if (!(scale > 0.f)) return 0;  // a zero block, or a NaN scale
  const float r = std::nearbyint(x / scale);
  return static_cast<int>(std::fmax(-static_cast<float>(qmax), std::fmin(static_cast<float>(qmax), r)));
}
}  // namespace

void quantize_blocks(float* q, const void* x, DType t, int64_t x_stride, int64_t rows, int64_t n, int bits,
                     int64_t block) {
  const int qmax = bits == 8 ? 127 : 7;
  const int64_t nb = (n + block - 1) / block, rw = 1 + block * bits / 32;
#pragma omp parallel for schedule(static) if (rows * n >= kParallelMin)
  for (int64_t rb = 0; rb < rows * nb; ++rb) {
    const int64_t r = rb / nb, b = rb % nb, i0 = r * x_stride + b * block, len = std::min(block, n - b * block);
    float amax = 0.f;
    bool finite = true;
    for (int64_t i = 0; i < len; ++i) {
      const float v = load(x, t, i0 + i);
      finite = finite && std::isfinite(v);
      amax = std::fmax(amax, std::fabs(v));
    }
    const float scale = finite ? amax / static_cast<float>(qmax) : NAN;
    float* rec = q + rb * rw;
    rec[0] = scale;
    auto* codes = reinterpret_cast<uint8_t*>(rec + 1);
    std::memset(codes, 0, static_cast<size_t>(block * bits / 8));
    for (int64_t i = 0; i < len; ++i) {
      const int c = code_of(load(x, t, i0 + i), scale, qmax);
      if (bits == 8) codes[i] = static_cast<uint8_t>(static_cast<int8_t>(c));
      else codes[i / 2] |= static_cast<uint8_t>((c & 0xF) << (4 * (i % 2)));
    }
  }
}

void dequantize_blocks(void* x, DType t, const float* q, int64_t rows, int64_t n, int bits, int64_t block,
                       bool accumulate) {
  const int64_t nb = (n + block - 1) / block, rw = 1 + block * bits / 32;
#pragma omp parallel for schedule(static) if (rows * n >= kParallelMin)
  for (int64_t rb = 0; rb < rows * nb; ++rb) {
    const int64_t r = rb / nb, b = rb % nb, i0 = r * n + b * block, len = std::min(block, n - b * block);
    const float* rec = q + rb * rw;
    const float scale = rec[0];
    const auto* codes = reinterpret_cast<const uint8_t*>(rec + 1);
    for (int64_t i = 0; i < len; ++i) {
      int c;
      if (bits == 8) {
        c = static_cast<int8_t>(codes[i]);
      } else {
        const int nib = (codes[i / 2] >> (4 * (i % 2))) & 0xF;
        c = nib >= 8 ? nib - 16 : nib;
      }
      const float v = static_cast<float>(c) * scale;
      store(x, t, i0 + i, accumulate ? load(x, t, i0 + i) + v : v);
    }
  }
}

}  // namespace shardlab::cpu
