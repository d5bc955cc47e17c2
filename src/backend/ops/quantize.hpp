// quantize.hpp — block-wise symmetric quantization, ZeRO++'s qwZ (int8 weights before the
// all-gather) and qgZ (int4/int8 gradients in the reduction's all-to-all). Conventions:
// ops/dispatch.hpp.
//
// A row of n values is cut into blocks of `block` elements (the last may be shorter); each block
// becomes one record: its f32 scale, amax / qmax (qmax 127 for int8, 7 for int4), then its codes,
// round(x / scale) clamped to [-qmax, qmax] (ties to even), one byte each for int8 or two to a byte
// for int4 (element 2i in the low nibble, 2i + 1 in the high, two's complement), zero past the
// row's end. Records are whole 32-bit words (block % 8 == 0), so a quantized buffer is an f32
// tensor of words that collectives carry like any other (bit patterns, never arithmetic). A block
// of zeros has scale 0 and dequantizes to zeros; a block holding a NaN or an infinity gets a NaN
// scale, so it dequantizes to NaN and a non-finite gradient stays visible.
#pragma once
#include "src/backend/ops/dispatch.hpp"

namespace shardlab {

struct QuantSpec {
  int bits = 8;         // 8 or 4
  int64_t block = 256;  // elements per scale, a positive multiple of 8
  int qmax() const { return bits == 8 ? 127 : 7; }
  int64_t record_words() const { return 1 + block * bits / 32; }
  int64_t blocks(int64_t n) const { return (n + block - 1) / block; }
  int64_t words(int64_t n) const { return blocks(n) * record_words(); }  // one row of n values
};
// InputError unless bits is 4 or 8 and block a positive multiple of 8 (`what` names the option).
void check_quant_spec(const QuantSpec& s, const char* what);

namespace ops {

// q (rows * s.words(n) f32 words) <- rows of n values of x (any float dtype), row r starting at
// element r * x_stride (x_stride >= n).
void quantize_blocks(Backend& be, Tensor q, Tensor x, int64_t x_stride, int64_t rows, int64_t n, const QuantSpec& s);
// x (rows of n values, any float dtype, row r at element r * x_stride; 0: n, contiguous) <- the
// dequantized rows of q, code x scale; accumulate adds them to x instead (f32 x only), with one
// rounding: fma(code, scale, x).
void dequantize_blocks(Backend& be, Tensor x, Tensor q, int64_t rows, int64_t n, const QuantSpec& s, bool accumulate,
                       int64_t x_stride = 0);

}  // namespace ops
}  // namespace shardlab
