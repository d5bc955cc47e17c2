// activation.cu — the GELU and SwiGLU kernels (ops/activation.hpp; host side in
// activation.cpp; grids in launches.hpp), formula for formula as src/backend/cpu/activation.cpp.
#include "src/backend/cuda/kernel_util.cuh"

namespace shardlab::cuda {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

__device__ inline float gelu(float x) {
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.f + tanhf(u));
}

__device__ inline float gelu_grad(float x) {
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  const float th = tanhf(u);
  const float sech2 = 1.f - th * th;
  return 0.5f * (1.f + th) + 0.5f * x * sech2 * kGeluScale * (1.f + 3.f * 0.044715f * x * x);
}

template <int W>
__global__ void gelu_forward_kernel(float* out, const float* inp, int64_t packs) {
  GRID_STRIDE_LOOP(i, packs) {
    Pack<W> v = load_pack<W>(inp + i * W);
    for (int k = 0; k < W; ++k) v.v[k] = gelu(v.v[k]);
    store_pack<W>(out + i * W, v);
  }
}

template <int W>
__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t packs) {
  GRID_STRIDE_LOOP(i, packs) {
    const Pack<W> x = load_pack<W>(inp + i * W);
    Pack<W> d = load_pack<W>(dout + i * W);
    for (int k = 0; k < W; ++k) d.v[k] = gelu_grad(x.v[k]) * d.v[k];
    store_pack<W>(dinp + i * W, d);
  }
}

__device__ inline float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// One thread per output (n, f); F is any width (Llama's are not all multiples of 4), so no packs.
// gate_up (G) and out (O) f32 or bf16: read widened, computed in f32, rounded once as stored.
template <class O, class G>
__global__ void swiglu_forward_kernel(O* out, const G* gate_up, int64_t F, int64_t n) {
  GRID_STRIDE_LOOP(i, n) {
    const G* row = gate_up + (i / F) * 2 * F;
    const int64_t f = i % F;
    const float g = to_f32(row[f]);
    store_f32(out + i, g * sigmoid(g) * to_f32(row[F + f]));
  }
}

// silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g). gate_up (G) and dgate_up (O) f32 or bf16.
template <class O, class G>
__global__ void swiglu_backward_kernel(O* dgate_up, const G* gate_up, const float* dout, int64_t F, int64_t n) {
  GRID_STRIDE_LOOP(i, n) {
    const int64_t r = i / F, f = i % F;
    const float g = to_f32(gate_up[r * 2 * F + f]), u = to_f32(gate_up[r * 2 * F + F + f]), d = dout[i];
    const float s = sigmoid(g);
    store_f32(dgate_up + r * 2 * F + f, d * u * s * (1.f + g * (1.f - s)));
    store_f32(dgate_up + r * 2 * F + F + f, d * g * s);
  }
}

// f(O*, const G*) with each pointer cast to its dtype's element type (f32 or bf16).
template <class F>
void with_dtypes(void* o, DType ot, const void* g, DType gt, F f) {
  using B = __nv_bfloat16;
  if (ot == DType::bf16) {
    if (gt == DType::bf16) return f(static_cast<B*>(o), static_cast<const B*>(g));
    return f(static_cast<B*>(o), static_cast<const float*>(g));
  }
  if (gt == DType::bf16) return f(static_cast<float*>(o), static_cast<const B*>(g));
  f(static_cast<float*>(o), static_cast<const float*>(g));
}

}  // namespace

cudaError_t launch_gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t s) {
  const bool aligned = aligned16(out, inp);
  const Launches L = gelu_forward_launches(n, aligned);
  if (L.count == 0) return cudaSuccess;
  if (packable(n, aligned))
    gelu_forward_kernel<4><<<L[0].x, kThreads, 0, s>>>(out, inp, n / 4);
  else
    gelu_forward_kernel<1><<<L[0].x, kThreads, 0, s>>>(out, inp, n);
  return cudaGetLastError();
}

cudaError_t launch_gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t s) {
  const bool aligned = aligned16(dinp, inp, dout);
  const Launches L = gelu_backward_launches(n, aligned);
  if (L.count == 0) return cudaSuccess;
  if (packable(n, aligned))
    gelu_backward_kernel<4><<<L[0].x, kThreads, 0, s>>>(dinp, inp, dout, n / 4);
  else
    gelu_backward_kernel<1><<<L[0].x, kThreads, 0, s>>>(dinp, inp, dout, n);
  return cudaGetLastError();
}

cudaError_t launch_swiglu_forward(void* out, DType out_type, const void* gate_up, DType gate_up_type, int64_t N,
                                  int64_t F, cudaStream_t s) {
  const Launches L = swiglu_forward_launches(N, F);
  if (L.count == 0) return cudaSuccess;
  with_dtypes(out, out_type, gate_up, gate_up_type, [&](auto* o, const auto* g) {
    swiglu_forward_kernel<<<L[0].x, kThreads, 0, s>>>(o, g, F, N * F);
  });
  return cudaGetLastError();
}

cudaError_t launch_swiglu_backward(void* dgate_up, DType dgate_up_type, const void* gate_up, DType gate_up_type,
                                   const float* dout, int64_t N, int64_t F, cudaStream_t s) {
  const Launches L = swiglu_backward_launches(N, F);
  if (L.count == 0) return cudaSuccess;
  with_dtypes(dgate_up, dgate_up_type, gate_up, gate_up_type, [&](auto* o, const auto* g) {
    swiglu_backward_kernel<<<L[0].x, kThreads, 0, s>>>(o, g, dout, F, N * F);
  });
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
