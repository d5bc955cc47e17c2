// quantize.cpp — the quantization family's checks and dispatch (quantize.hpp).
#include "src/backend/ops/quantize.hpp"

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab {

void check_quant_spec(const QuantSpec& s, const char* what) {
  SHARD_REQUIRE(s.bits == 8 || s.bits == 4, "{}: {} bits; int8 and int4 are supported", what, s.bits);
  SHARD_REQUIRE(s.block > 0 && s.block % 8 == 0, "{}: a block of {} elements; it must be a positive multiple of 8",
                what, s.block);
}

namespace ops {
namespace {
void check(const Tensor& q, const Tensor& x, int64_t x_need, int64_t rows, int64_t n, const QuantSpec& s,
           const char* op) {
  SHARD_CHECK((s.bits == 8 || s.bits == 4) && s.block > 0 && s.block % 8 == 0, "{}: {} bits in blocks of {}", op,
              s.bits, s.block);
  SHARD_CHECK(rows >= 0 && n >= 0, "{}: {} rows of {}", op, rows, n);
  SHARD_CHECK(q.dtype() == DType::f32 && q.numel() == rows * s.words(n),
              "{}: q has {} {} words, {} rows of {} values in blocks of {} ({} bits) need {} f32 words", op, q.numel(),
              dtype_name(q.dtype()), rows, n, s.block, s.bits, rows * s.words(n));
  SHARD_CHECK(x.numel() >= x_need, "{}: x has {} values, {} rows of {} need {}", op, x.numel(), rows, n, x_need);
}
}  // namespace

void quantize_blocks(Backend& be, Tensor q, Tensor x, int64_t x_stride, int64_t rows, int64_t n, const QuantSpec& s) {
  SHARD_CHECK(x_stride >= n, "quantize_blocks: row stride {} below the row's {} values", x_stride, n);
  check(q, x, rows > 0 ? (rows - 1) * x_stride + n : 0, rows, n, s, "quantize_blocks");
  if (rows == 0 || n == 0) return;
  switch (be.device()) {
    case Device::cpu: return cpu::quantize_blocks(q.ptr<float>(), x.data(), x.dtype(), x_stride, rows, n, s.bits, s.block);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::quantize_blocks(be, q.ptr<float>(), x.data(), x.dtype(), x_stride, rows, n, s);
      return;
    case Device::meta:
      return charge(be,
                    {.name = "quantize_blocks",
                     .flops = 3.0 * rows * n,
                     .bytes = static_cast<double>(rows * n) * dtype_size(x.dtype()) + 4.0 * rows * s.words(n)},
                    [&] { return cuda::quantize_blocks_launches(x.dtype(), x_stride, rows, n, s.bits, s.block); });
  }
}

void dequantize_blocks(Backend& be, Tensor x, Tensor q, int64_t rows, int64_t n, const QuantSpec& s, bool accumulate,
                       int64_t x_stride) {
  if (x_stride == 0) x_stride = n;
  SHARD_CHECK(x_stride >= n, "dequantize_blocks: row stride {} below the row's {} values", x_stride, n);
  check(q, x, rows > 0 ? (rows - 1) * x_stride + n : 0, rows, n, s, "dequantize_blocks");
  SHARD_CHECK(!accumulate || x.dtype() == DType::f32, "dequantize_blocks: accumulating into {} (f32 only)",
              dtype_name(x.dtype()));
  if (rows == 0 || n == 0) return;
  switch (be.device()) {
    case Device::cpu:
      return cpu::dequantize_blocks(x.data(), x.dtype(), q.ptr<float>(), x_stride, rows, n, s.bits, s.block,
                                    accumulate);
    case Device::cuda:
      if constexpr (kWithCuda)
        cuda::dequantize_blocks(be, x.data(), x.dtype(), q.ptr<float>(), x_stride, rows, n, s, accumulate);
      return;
    case Device::meta:
      return charge(
          be,
          {.name = "dequantize_blocks",
           .flops = 2.0 * rows * n,
           .bytes = static_cast<double>(rows * n) * dtype_size(x.dtype()) * (accumulate ? 2 : 1) +
                    4.0 * rows * s.words(n)},
          [&] { return cuda::dequantize_blocks_launches(x.dtype(), x_stride, rows, n, s.bits, s.block, accumulate); });
  }
}

}  // namespace ops
}  // namespace shardlab
