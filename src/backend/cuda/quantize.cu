// quantize.cu — ZeRO++'s block-wise quantization kernels (ops/quantize.hpp has the format; host
// side in quantize.cpp; grids in launches.hpp). One block of threads per record: the block's max
// |x| by a block reduction (a max: the same bits in any order), then each thread writes whole
// bytes of codes. x / scale is an IEEE division rounded to nearest even, as on the CPU, so both
// give the same codes.
#include "src/backend/cuda/kernel_util.cuh"

namespace shardlab::cuda {
namespace {

__device__ inline int code_of(float x, float scale, int qmax) {
  if (!(scale > 0.f)) return 0;  // a zero block, or a NaN scale
  const float r = rintf(__fdiv_rn(x, scale));
  return static_cast<int>(fmaxf(-static_cast<float>(qmax), fminf(static_cast<float>(qmax), r)));
}

__global__ void quantize_kernel(float* q, const void* x, DType t, int64_t x_stride, int64_t n, int64_t nb, int bits,
                                int64_t block) {
  const int64_t rb = blockIdx.x, r = rb / nb, b = rb % nb, i0 = r * x_stride + b * block;
  const int64_t len = min(block, n - b * block);
  const int qmax = bits == 8 ? 127 : 7;
  float amax = 0.f, bad = 0.f;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
    const float v = load_as_f32(x, t, i0 + i);
    amax = fmaxf(amax, fabsf(v));
    if (!isfinite(v)) bad = 1.f;
  }
  amax = block_allreduce(amax, 0.f, MaxOp{});
  bad = block_allreduce(bad, 0.f, MaxOp{});
  const float scale = bad > 0.f ? __int_as_float(0x7fc00000) : __fdiv_rn(amax, static_cast<float>(qmax));
  float* rec = q + rb * (1 + block * bits / 32);
  if (threadIdx.x == 0) rec[0] = scale;
  auto* codes = reinterpret_cast<uint8_t*>(rec + 1);
  const int64_t bytes = block * bits / 8;
  for (int64_t j = threadIdx.x; j < bytes; j += blockDim.x) {
    if (bits == 8) {
      const int c = j < len ? code_of(load_as_f32(x, t, i0 + j), scale, qmax) : 0;
      codes[j] = static_cast<uint8_t>(static_cast<int8_t>(c));
    } else {
      const int lo = 2 * j < len ? code_of(load_as_f32(x, t, i0 + 2 * j), scale, qmax) : 0;
      const int hi = 2 * j + 1 < len ? code_of(load_as_f32(x, t, i0 + 2 * j + 1), scale, qmax) : 0;
      codes[j] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
    }
  }
}

__global__ void dequantize_kernel(void* x, DType t, const float* q, int64_t x_stride, int64_t n, int64_t nb, int bits,
                                  int64_t block, bool accumulate) {
  const int64_t rb = blockIdx.x, r = rb / nb, b = rb % nb, i0 = r * x_stride + b * block;
  const int64_t len = min(block, n - b * block);
  const float* rec = q + rb * (1 + block * bits / 32);
  const float scale = rec[0];
  const auto* codes = reinterpret_cast<const uint8_t*>(rec + 1);
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
    int c;
    if (bits == 8) {
      c = static_cast<int8_t>(codes[i]);
    } else {
      const int nib = (codes[i / 2] >> (4 * (i % 2))) & 0xF;
      c = nib >= 8 ? nib - 16 : nib;
    }
    // Accumulating: one rounding (a fused multiply-add), as on the CPU.
    store_from_f32(x, t, i0 + i, accumulate ? fmaf(static_cast<float>(c), scale, load_as_f32(x, t, i0 + i))
                                       : __fmul_rn(static_cast<float>(c), scale));
  }
}

// Records in one launch: the grid's x dimension reaches 2^31 - 1.
constexpr int64_t kMaxRecords = 0x7fffffff;

}  // namespace

cudaError_t launch_quantize_blocks(float* q, const void* x, DType t, int64_t x_stride, int64_t rows, int64_t n,
                                   int bits, int64_t block, cudaStream_t s) {
  const Launches L = quantize_blocks_launches(t, x_stride, rows, n, bits, block);
  if (L.count == 0) return cudaSuccess;
  const int64_t nb = (n + block - 1) / block;
  if (rows * nb > kMaxRecords) return cudaErrorInvalidValue;
  quantize_kernel<<<L[0].x, kThreads, 0, s>>>(q, x, t, x_stride, n, nb, bits, block);
  return cudaGetLastError();
}

cudaError_t launch_dequantize_blocks(void* x, DType t, const float* q, int64_t x_stride, int64_t rows, int64_t n,
                                     int bits, int64_t block, bool accumulate, cudaStream_t s) {
  const Launches L = dequantize_blocks_launches(t, x_stride, rows, n, bits, block, accumulate);
  if (L.count == 0) return cudaSuccess;
  const int64_t nb = (n + block - 1) / block;
  if (rows * nb > kMaxRecords) return cudaErrorInvalidValue;
  dequantize_kernel<<<L[0].x, kThreads, 0, s>>>(x, t, q, x_stride, n, nb, bits, block, accumulate);
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
