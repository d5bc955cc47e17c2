// attention.cu — the causal softmax kernels around attention's cuBLAS products
// (ops/attention.hpp; host side in attention.cpp; grids in launches.hpp).
#include "src/backend/cuda/kernel_util.cuh"

namespace shardlab::cuda {
namespace {

// One warp per row of scaled scores, in place, stored as S (f32, or bf16 where the products round:
// read as f32, computed in f32, the probabilities rounded once). Each lane reads and rewrites only
// its own elements, after the warp-wide max and sum are known.
template <class S>
__global__ void causal_softmax_kernel(S* att, int64_t rows, int64_t T) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int64_t t = row % T;
  S* a = att + row * T;
  float mx = -INFINITY;
  for (int64_t s = lane; s <= t; s += kWarp) mx = fmaxf(mx, to_f32(a[s]));
  mx = warp_allreduce(mx, MaxOp{});
  float sum = 0.f;
  for (int64_t s = lane; s <= t; s += kWarp) sum += expf(to_f32(a[s]) - mx);
  const float inv = 1.f / warp_allreduce(sum, SumOp{});
  for (int64_t s = lane; s < T; s += kWarp) store_f32(a + s, s <= t ? expf(to_f32(a[s]) - mx) * inv : 0.f);
}

template <class S>
__global__ void causal_softmax_backward_kernel(S* datt, const S* att, int64_t rows, int64_t T, float scale) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int64_t t = row % T;
  const S* a = att + row * T;
  S* d = datt + row * T;
  float dot = 0.f;
  for (int64_t s = lane; s <= t; s += kWarp) dot += to_f32(a[s]) * to_f32(d[s]);
  dot = warp_allreduce(dot, SumOp{});
  for (int64_t s = lane; s < T; s += kWarp) store_f32(d + s, s <= t ? to_f32(a[s]) * (to_f32(d[s]) - dot) * scale : 0.f);
}

}  // namespace

cudaError_t launch_causal_softmax(void* att, DType t, int64_t H, int64_t KV, int64_t B, int64_t T, int64_t C,
                                  cudaStream_t s) {
  const Launches L = attention_forward_launches(H, KV, B, T, C);
  if (L.count == 0) return cudaSuccess;
  if (t == DType::bf16)
    causal_softmax_kernel<<<L[0].x, kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(att), B * H * T, T);
  else
    causal_softmax_kernel<<<L[0].x, kThreads, 0, s>>>(static_cast<float*>(att), B * H * T, T);
  return cudaGetLastError();
}

cudaError_t launch_causal_softmax_backward(void* datt, const void* att, DType t, int64_t H, int64_t KV, int64_t B,
                                           int64_t T, int64_t C, float scale, cudaStream_t s) {
  const Launches L = attention_backward_launches(H, KV, B, T, C);  // one batch entry's
  if (L.count == 0) return cudaSuccess;
  if (t == DType::bf16)
    causal_softmax_backward_kernel<<<L[0].x, kThreads, 0, s>>>(
        static_cast<__nv_bfloat16*>(datt), static_cast<const __nv_bfloat16*>(att), H * T, T, scale);
  else
    causal_softmax_backward_kernel<<<L[0].x, kThreads, 0, s>>>(static_cast<float*>(datt),
                                                               static_cast<const float*>(att), H * T, T, scale);
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
