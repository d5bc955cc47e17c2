// kernel_util.cuh — what the CUDA kernel files (*.cu) share: the grid-stride loop, float4 packs,
// and warp and block reductions whose every lane ends with the same bits. Grid sizes and the lists
// of launches each launcher issues are plain C++, in launches.hpp.
//
// Reductions are deterministic: a fixed grid writes per-block partial sums and one block folds
// them in order. No atomics, so two runs of the same step give the same bits. Row reductions use
// one warp per row (or one block for long rows) folded with __shfl_xor_sync butterflies: every
// lane ends with the same bits, so values broadcast that way (a row's max and sum) are consistent
// across the row. Element-wise kernels move float4 packs when every pointer is 16-byte aligned and
// the length divides by 4, else single floats.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "src/backend/cuda/kernels.cuh"
#include "src/backend/cuda/launches.hpp"

namespace shardlab::cuda {

// Element i of a buffer of any stored dtype, as f32; and back, rounded to nearest even.
__device__ inline float load_as_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::f16: return __half2float(static_cast<const __half*>(p)[i]);
  }
  return 0.f;
}
__device__ inline void store_from_f32(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = v; break;
    case DType::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    case DType::f16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
  }
}

// A stored element as f32, for kernels templated on their input's type (f32 or bf16).
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
// An f32 value stored as a kernel templated on its output's type stores it (bf16: rounded to
// nearest even, as every cast here rounds).
__device__ __forceinline__ void store_f32(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_f32(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

#define GRID_STRIDE_LOOP(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

constexpr unsigned kFullMask = 0xffffffffu;

template <int W>
struct Pack {
  float v[W];
};

template <int W>
__device__ inline Pack<W> load_pack(const float* p) {
  Pack<W> r;
  if constexpr (W == 4) {
    float4 q = *reinterpret_cast<const float4*>(p);
    r.v[0] = q.x, r.v[1] = q.y, r.v[2] = q.z, r.v[3] = q.w;
  } else {
    r.v[0] = *p;
  }
  return r;
}

template <int W>
__device__ inline void store_pack(float* p, const Pack<W>& r) {
  if constexpr (W == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
  } else {
    *p = r.v[0];
  }
}

struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Butterfly over the warp: each step combines the same two values on both partner lanes, and the
// ops are commutative, so every lane returns bit-identical results.
template <class T, class Op>
__device__ inline T warp_allreduce(T v, Op op) {
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Every thread of the block returns the block's result (blockDim.x a multiple of 32, at most 1024).
template <class T, class Op>
__device__ T block_allreduce(T v, T identity, Op op) {
  __shared__ T warp_vals[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_allreduce(v, op);
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / kWarp) ? warp_vals[lane] : identity;
  v = warp_allreduce(v, op);
  __syncthreads();  // warp_vals is reused by the next call
  return v;
}

}  // namespace shardlab::cuda
