// moe.cu — the mixture-of-experts kernels (ops/moe.hpp; host side in moe.cpp). Mirrors
// src/backend/cpu/moe.cpp: every output element is one thread's, a token's slots add in j order.
#include "src/backend/cuda/kernel_util.cuh"

namespace shardlab::cuda {
namespace {

__global__ void moe_gather_kernel(float* dst, const float* src, const int32_t* token_of, int64_t rows, int64_t C) {
  GRID_STRIDE_LOOP(i, rows * C) {
    const int64_t r = i / C, c = i % C;
    dst[i] = src[static_cast<int64_t>(token_of[r]) * C + c];
  }
}

__global__ void moe_combine_kernel(float* out, const float* y, const int32_t* pos, const float* w, int64_t N,
                                   int64_t k, int64_t C, bool accumulate) {
  GRID_STRIDE_LOOP(i, N * C) {
    const int64_t n = i / C, c = i % C;
    float acc = accumulate ? out[i] : 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = pos[n * k + j];
      if (r < 0) continue;
      const float a = w != nullptr ? w[n * k + j] : 1.f;
      acc += a * y[static_cast<int64_t>(r) * C + c];  // rounded as the CPU's o[c] += a * y
    }
    out[i] = acc;
  }
}

// One thread per slot: its dot product over C in column order, as the CPU.
__global__ void moe_combine_backward_kernel(float* dy, float* dw, const float* dout, const float* y,
                                            const int32_t* pos, const float* w, int64_t N, int64_t k, int64_t C) {
  GRID_STRIDE_LOOP(s, N * k) {
    const int32_t r = pos[s];
    if (r < 0) {
      dw[s] = 0.f;
      continue;
    }
    const float* d = dout + (s / k) * C;
    const float* yr = y + static_cast<int64_t>(r) * C;
    float* dyr = dy + static_cast<int64_t>(r) * C;
    float dot = 0.f;
    for (int64_t c = 0; c < C; ++c) {
      dot += d[c] * yr[c];
      dyr[c] = w[s] * d[c];
    }
    dw[s] = dot;
  }
}

}  // namespace

cudaError_t launch_moe_gather(float* dst, const float* src, const int32_t* token_of, int64_t rows, int64_t C,
                              cudaStream_t s) {
  if (rows * C == 0) return cudaSuccess;
  moe_gather_kernel<<<grid_for(rows * C), kThreads, 0, s>>>(dst, src, token_of, rows, C);
  return cudaGetLastError();
}

cudaError_t launch_moe_combine(float* out, const float* y, const int32_t* pos, const float* w, int64_t N, int64_t k,
                               int64_t C, bool accumulate, cudaStream_t s) {
  if (N * C == 0) return cudaSuccess;
  moe_combine_kernel<<<grid_for(N * C), kThreads, 0, s>>>(out, y, pos, w, N, k, C, accumulate);
  return cudaGetLastError();
}

cudaError_t launch_moe_combine_backward(float* dy, float* dw, const float* dout, const float* y, const int32_t* pos,
                                        const float* w, int64_t N, int64_t k, int64_t C, cudaStream_t s) {
  if (N * k == 0) return cudaSuccess;
  moe_combine_backward_kernel<<<grid_for(N * k), kThreads, 0, s>>>(dy, dw, dout, y, pos, w, N, k, C);
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
