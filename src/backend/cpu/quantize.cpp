// quantize.cpp — the CPU block-wise quantization of ZeRO++ (ops/quantize.hpp has the format).
// The loops are templated on the value dtype and the code width, so the f32 paths vectorise: the
// division and the rounding (nearest even, as CUDA's rintf) are the IEEE operations the CUDA
// kernels use, so both give the same codes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "src/backend/cpu/kernels.hpp"
#include "src/core/dtype.hpp"

namespace shardlab::cpu {
namespace {

template <DType D>
float load(const void* p, int64_t i) {
  if constexpr (D == DType::f32) return static_cast<const float*>(p)[i];
  else if constexpr (D == DType::bf16) return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
  else return f16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
}
template <DType D>
void store(void* p, int64_t i, float v) {
  if constexpr (D == DType::f32) static_cast<float*>(p)[i] = v;
  else if constexpr (D == DType::bf16) static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(v);
  else static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(v);
}

// One block: its scale (amax / qmax, NaN when it holds a non-finite value), then its codes,
// x / scale rounded to nearest even and clamped (0 for a zero block or a NaN scale).
template <DType D, int Bits>
void quantize_block(float* rec, const void* x, int64_t i0, int64_t len, int64_t block) {
  constexpr float qmax = Bits == 8 ? 127.f : 7.f;
  float amax = 0.f;
  int bad = 0;  // a NaN or an infinity (branch-free, so the loop vectorises)
  for (int64_t i = 0; i < len; ++i) {
    const float a = std::fabs(load<D>(x, i0 + i));
    bad |= !(a <= std::numeric_limits<float>::max());
    amax = a > amax ? a : amax;
  }
  const float scale = bad ? NAN : amax / qmax;
  rec[0] = scale;
  auto* codes = reinterpret_cast<uint8_t*>(rec + 1);
  std::memset(codes, 0, static_cast<size_t>(block * Bits / 8));
  if (!(scale > 0.f)) return;
  int8_t c[1024];  // the block's codes, a chunk at a time, then packed
  for (int64_t at = 0; at < len; at += 1024) {
    const int64_t m = std::min<int64_t>(1024, len - at);
    for (int64_t i = 0; i < m; ++i)
      c[i] = static_cast<int8_t>(std::min(qmax, std::max(-qmax, std::nearbyint(load<D>(x, i0 + at + i) / scale))));
    if constexpr (Bits == 8) {
      std::memcpy(codes + at, c, static_cast<size_t>(m));
    } else {
      for (int64_t i = 0; i + 1 < m; i += 2)
        codes[(at + i) / 2] = static_cast<uint8_t>((c[i] & 0xF) | ((c[i + 1] & 0xF) << 4));
      if (m % 2) codes[(at + m - 1) / 2] = static_cast<uint8_t>(c[m - 1] & 0xF);
    }
  }
}

template <DType D, int Bits, bool Accumulate>
void dequantize_block(void* x, const float* rec, int64_t i0, int64_t len) {
  const float scale = rec[0];
  const auto* codes = reinterpret_cast<const uint8_t*>(rec + 1);
  for (int64_t i = 0; i < len; ++i) {
    int c;
    if constexpr (Bits == 8) {
      c = static_cast<int8_t>(codes[i]);
    } else {
      const int nib = (codes[i / 2] >> (4 * (i % 2))) & 0xF;
      c = nib >= 8 ? nib - 16 : nib;
    }
    // Accumulating: one rounding (a fused multiply-add), as on CUDA, whatever the compiler contracts.
    if constexpr (Accumulate) store<D>(x, i0 + i, std::fma(static_cast<float>(c), scale, load<D>(x, i0 + i)));
    else store<D>(x, i0 + i, static_cast<float>(c) * scale);
  }
}

template <DType D, int Bits>
void quantize_rows(float* q, const void* x, int64_t x_stride, int64_t rows, int64_t n, int64_t block) {
  const int64_t nb = (n + block - 1) / block, rw = 1 + block * Bits / 32;
#pragma omp parallel for schedule(static) if (rows * n >= kParallelMin)
  for (int64_t rb = 0; rb < rows * nb; ++rb) {
    const int64_t r = rb / nb, b = rb % nb;
    quantize_block<D, Bits>(q + rb * rw, x, r * x_stride + b * block, std::min(block, n - b * block), block);
  }
}

template <DType D, int Bits, bool Accumulate>
void dequantize_rows(void* x, const float* q, int64_t x_stride, int64_t rows, int64_t n, int64_t block) {
  const int64_t nb = (n + block - 1) / block, rw = 1 + block * Bits / 32;
#pragma omp parallel for schedule(static) if (rows * n >= kParallelMin)
  for (int64_t rb = 0; rb < rows * nb; ++rb) {
    const int64_t r = rb / nb, b = rb % nb;
    dequantize_block<D, Bits, Accumulate>(x, q + rb * rw, r * x_stride + b * block, std::min(block, n - b * block));
  }
}

template <DType D>
void quantize_any(float* q, const void* x, int64_t x_stride, int64_t rows, int64_t n, int bits, int64_t block) {
  if (bits == 8) quantize_rows<D, 8>(q, x, x_stride, rows, n, block);
  else quantize_rows<D, 4>(q, x, x_stride, rows, n, block);
}

template <DType D>
void dequantize_any(void* x, const float* q, int64_t ld, int64_t rows, int64_t n, int bits, int64_t block, bool acc) {
  if (bits == 8) {
    if (acc) dequantize_rows<D, 8, true>(x, q, ld, rows, n, block);
    else dequantize_rows<D, 8, false>(x, q, ld, rows, n, block);
  } else {
    if (acc) dequantize_rows<D, 4, true>(x, q, ld, rows, n, block);
    else dequantize_rows<D, 4, false>(x, q, ld, rows, n, block);
  }
}

}  // namespace

void quantize_blocks(float* q, const void* x, DType t, int64_t x_stride, int64_t rows, int64_t n, int bits,
                     int64_t block) {
  switch (t) {
    case DType::f32: return quantize_any<DType::f32>(q, x, x_stride, rows, n, bits, block);
    case DType::bf16: return quantize_any<DType::bf16>(q, x, x_stride, rows, n, bits, block);
    case DType::f16: return quantize_any<DType::f16>(q, x, x_stride, rows, n, bits, block);
  }
}

void dequantize_blocks(void* x, DType t, const float* q, int64_t x_stride, int64_t rows, int64_t n, int bits,
                       int64_t block, bool accumulate) {
  switch (t) {
    case DType::f32: return dequantize_any<DType::f32>(x, q, x_stride, rows, n, bits, block, accumulate);
    case DType::bf16: return dequantize_any<DType::bf16>(x, q, x_stride, rows, n, bits, block, accumulate);
    case DType::f16: return dequantize_any<DType::f16>(x, q, x_stride, rows, n, bits, block, accumulate);
  }
}

}  // namespace shardlab::cpu
