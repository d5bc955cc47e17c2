// quantize.cpp — the CUDA block-wise quantization of ZeRO++ (ops/quantize.hpp): kernels in
// quantize.cu.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::cuda {

void quantize_blocks(Backend& be, float* q, const void* x, DType t, int64_t x_stride, int64_t rows, int64_t n,
                     const QuantSpec& s) {
  CUDA_CHECK(launch_quantize_blocks(q, x, t, x_stride, rows, n, s.bits, s.block, CudaBackend::of(be).compute_stream()));
}

void dequantize_blocks(Backend& be, void* x, DType t, const float* q, int64_t x_stride, int64_t rows, int64_t n,
                       const QuantSpec& s, bool accumulate) {
  CUDA_CHECK(launch_dequantize_blocks(x, t, q, x_stride, rows, n, s.bits, s.block, accumulate,
                                      CudaBackend::of(be).compute_stream()));
}

}  // namespace shardlab::cuda
