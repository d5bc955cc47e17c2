// moe.cu — the mixture-of-experts kernels (ops/moe.hpp; host side in moe.cpp). Mirrors
// src/backend/cpu/moe.cpp: every output element is one thread's (one warp's for a weight's
// gradient), a token's slots add in j order. Grids in launches.hpp.
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

// d(y): one thread per (slot, column), coalesced over columns; dropped slots write nothing.
__global__ void moe_combine_dy_kernel(float* dy, const float* dout, const int32_t* pos, const float* w, int64_t N,
                                      int64_t k, int64_t C) {
  GRID_STRIDE_LOOP(i, N * k * C) {
    const int64_t s = i / C, c = i % C;
    const int32_t r = pos[s];
    if (r >= 0) dy[static_cast<int64_t>(r) * C + c] = w[s] * dout[(s / k) * C + c];
  }
}

// d(weight): one warp per slot, lanes striding over the columns, folded by the warp's butterfly
// (a fixed order, not the CPU's column order: the two agree within rounding).
__global__ void moe_combine_dw_kernel(float* dw, const float* dout, const float* y, const int32_t* pos, int64_t N,
                                      int64_t k, int64_t C) {
  const int64_t s = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (s >= N * k) return;  // the whole warp leaves together
  const int32_t r = pos[s];
  float acc = 0.f;
  if (r >= 0) {
    const float* d = dout + (s / k) * C;
    const float* yr = y + static_cast<int64_t>(r) * C;
    for (int64_t c = lane; c < C; c += kWarp) acc += d[c] * yr[c];
  }
  acc = warp_allreduce(acc, SumOp{});
  if (lane == 0) dw[s] = acc;
}

}  // namespace

cudaError_t launch_moe_gather(float* dst, const float* src, const int32_t* token_of, int64_t rows, int64_t C,
                              cudaStream_t s) {
  const Launches L = moe_gather_launches(rows, C);
  if (L.count == 0) return cudaSuccess;
  moe_gather_kernel<<<L[0].x, kThreads, 0, s>>>(dst, src, token_of, rows, C);
  return cudaGetLastError();
}

cudaError_t launch_moe_combine(float* out, const float* y, const int32_t* pos, const float* w, int64_t N, int64_t k,
                               int64_t C, bool accumulate, cudaStream_t s) {
  const Launches L = moe_combine_launches(N, k, C, accumulate);
  if (L.count == 0) return cudaSuccess;
  moe_combine_kernel<<<L[0].x, kThreads, 0, s>>>(out, y, pos, w, N, k, C, accumulate);
  return cudaGetLastError();
}

cudaError_t launch_moe_combine_backward(float* dy, float* dw, const float* dout, const float* y, const int32_t* pos,
                                        const float* w, int64_t N, int64_t k, int64_t C, cudaStream_t s) {
  const Launches L = moe_combine_backward_launches(N, k, C);
  if (L.count == 0) return cudaSuccess;
  moe_combine_dy_kernel<<<L[0].x, kThreads, 0, s>>>(dy, dout, pos, w, N, k, C);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  moe_combine_dw_kernel<<<L[1].x, kThreads, 0, s>>>(dw, dout, y, pos, N, k, C);
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
