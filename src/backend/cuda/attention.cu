// attention.cu — the causal softmax kernels around attention's cuBLAS products
// (ops/attention.hpp; host side in attention.cpp; grids in launches.hpp).
#include "src/backend/cuda/kernel_util.cuh"

namespace shardlab::cuda {
namespace {

// One warp per row of scaled scores, in place. Each lane reads and rewrites only its own elements,
// after the warp-wide max and sum are known.
__global__ void causal_softmax_kernel(float* att, int64_t rows, int64_t T) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int64_t t = row % T;
  float* a = att + row * T;
  float mx = -INFINITY;
  for (int64_t s = lane; s <= t; s += kWarp) mx = fmaxf(mx, a[s]);
  mx = warp_allreduce(mx, MaxOp{});
  float sum = 0.f;
  for (int64_t s = lane; s <= t; s += kWarp) sum += expf(a[s] - mx);
  const float inv = 1.f / warp_allreduce(sum, SumOp{});
  for (int64_t s = lane; s < T; s += kWarp) a[s] = s <= t ? expf(a[s] - mx) * inv : 0.f;
}

__global__ void causal_softmax_backward_kernel(float* datt, const float* att, int64_t rows, int64_t T, float scale) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int64_t t = row % T;
  const float* a = att + row * T;
  float* d = datt + row * T;
  float dot = 0.f;
  for (int64_t s = lane; s <= t; s += kWarp) dot += a[s] * d[s];
  dot = warp_allreduce(dot, SumOp{});
  for (int64_t s = lane; s < T; s += kWarp) d[s] = s <= t ? a[s] * (d[s] - dot) * scale : 0.f;
}

}  // namespace

cudaError_t launch_causal_softmax(float* att, int64_t H, int64_t KV, int64_t B, int64_t T, int64_t C,
                                  cudaStream_t s) {
  const Launches L = attention_forward_launches(H, KV, B, T, C);
  if (L.count == 0) return cudaSuccess;
  causal_softmax_kernel<<<L[0].x, kThreads, 0, s>>>(att, B * H * T, T);
  return cudaGetLastError();
}

cudaError_t launch_causal_softmax_backward(float* datt, const float* att, int64_t H, int64_t KV, int64_t B,
                                           int64_t T, int64_t C, float scale, cudaStream_t s) {
  const Launches L = attention_backward_launches(H, KV, B, T, C);  // one batch entry's
  if (L.count == 0) return cudaSuccess;
  causal_softmax_backward_kernel<<<L[0].x, kThreads, 0, s>>>(datt, att, H * T, T, scale);
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
