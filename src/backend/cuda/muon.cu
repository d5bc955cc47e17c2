// muon.cu — the Muon passes (ops/muon.hpp; host side in muon.cpp; grids in launches.hpp), in
// torch's arithmetic as the CPU kernels compute it.
#include "src/backend/cuda/kernel_util.cuh"

namespace shardlab::cuda {
namespace {

__device__ inline float lerp_torch(float a, float b, float w) {
  return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.f - w);
}

__global__ void muon_momentum_kernel(const float* g, float* buf, float* update, int64_t n, float mu, bool nesterov,
                                     float gs) {
  GRID_STRIDE_LOOP(i, n) {
    const float grad = g[i] * gs;
    const float b = lerp_torch(buf[i], grad, 1.f - mu);
    buf[i] = b;
    update[i] = nesterov ? lerp_torch(grad, b, mu) : b;
  }
}

// Block sum of doubles (kThreads threads), deterministic: a shared tree in a fixed order.
__device__ double block_sum(double v) {
  __shared__ double s[kThreads];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  const double r = s[0];
  __syncthreads();
  return r;
}

// Each block's sum of squares over its grid-stride share.
__global__ void muon_sumsq_kernel(const void* x, DType t, int64_t n, double* partial) {
  double acc = 0.0;
  GRID_STRIDE_LOOP(i, n) {
    const double v = load_as_f32(x, t, i);
    acc += v * v;
  }
  const double r = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = r;
}

// One block folds the per-block sums in a fixed order into the norm, partial[parts]: bf16 storage
// rounds it and eps to bf16 as torch's bf16 tensors do.
__global__ void muon_norm_kernel(double* partial, int parts, DType t, float eps) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) acc += partial[i];
  const double s = block_sum(acc);
  if (threadIdx.x == 0) {
    float nrm = static_cast<float>(sqrt(s));
    if (t == DType::bf16) {
      nrm = fmaxf(__bfloat162float(__float2bfloat16_rn(nrm)), __bfloat162float(__float2bfloat16_rn(eps)));
      nrm = __bfloat162float(__float2bfloat16_rn(nrm));
    } else {
      nrm = fmaxf(nrm, eps);
    }
    partial[parts] = nrm;
  }
}

// x /= the norm, each quotient stored in x's dtype (rounded to bf16 there).
__global__ void muon_divide_kernel(void* x, DType t, int64_t n, const double* norm) {
  const float nrm = static_cast<float>(*norm);
  GRID_STRIDE_LOOP(i, n) store_from_f32(x, t, i, load_as_f32(x, t, i) / nrm);
}

__global__ void muon_apply_kernel(float* p, const float* update, int64_t n, float keep, float lr) {
  GRID_STRIDE_LOOP(i, n) p[i] = p[i] * keep + (-lr) * update[i];
}

}  // namespace

cudaError_t launch_muon_momentum(const float* g, float* buf, float* update, int64_t n, float momentum, bool nesterov,
                                 float grad_scale, cudaStream_t s) {
  const Launches L = muon_momentum_launches(n);
  if (L.count == 0) return cudaSuccess;
  muon_momentum_kernel<<<L[0].x, kThreads, 0, s>>>(g, buf, update, n, momentum, nesterov, grad_scale);
  return cudaGetLastError();
}

cudaError_t launch_muon_normalize(void* x, DType t, int64_t n, float eps, double* partial, cudaStream_t s) {
  const Launches L = muon_normalize_launches(n);
  if (L.count == 0) return cudaSuccess;
  muon_sumsq_kernel<<<L[0].x, kThreads, 0, s>>>(x, t, n, partial);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  muon_norm_kernel<<<L[1].x, kThreads, 0, s>>>(partial, static_cast<int>(L[0].x), t, eps);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  muon_divide_kernel<<<L[2].x, kThreads, 0, s>>>(x, t, n, partial + L[0].x);
  return cudaGetLastError();
}

cudaError_t launch_muon_apply(float* p, const float* update, int64_t n, float keep, float lr, cudaStream_t s) {
  const Launches L = muon_apply_launches(n);
  if (L.count == 0) return cudaSuccess;
  muon_apply_kernel<<<L[0].x, kThreads, 0, s>>>(p, update, n, keep, lr);
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
