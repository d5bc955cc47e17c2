// optimizer.cu — the AdamW and SGD kernels (ops/optimizer.hpp; host side in optimizer.cpp; grids in
// launches.hpp).
#include "src/backend/cuda/kernel_util.cuh"

namespace shardlab::cuda {
namespace {

// One element's AdamW step: every AdamW kernel's arithmetic, written once.
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float g, const AdamWStep& a, float wd) {
  const float grad = g * a.grad_scale;
  const float mi = a.beta1 * m + (1.f - a.beta1) * grad;
  const float vi = a.beta2 * v + (1.f - a.beta2) * grad * grad;
  m = mi;
  v = vi;
  p -= a.lr * ((mi * a.inv_bc1) / (sqrtf(vi * a.inv_bc2) + a.eps) + wd * p);
}

template <int W>
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t packs, AdamWStep a) {
  GRID_STRIDE_LOOP(i, packs) {
    const int64_t idx = i * W;
    Pack<W> pp = load_pack<W>(p + idx), mm = load_pack<W>(m + idx), vv = load_pack<W>(v + idx);
    const Pack<W> gg = load_pack<W>(g + idx);
    for (int k = 0; k < W; ++k) adamw_element(pp.v[k], mm.v[k], vv.v[k], gg.v[k], a, a.weight_decay);
    store_pack<W>(p + idx, pp);
    store_pack<W>(m + idx, mm);
    store_pack<W>(v + idx, vv);
  }
}

// One element a thread from bf16 gradients (the same arithmetic as adamw_kernel's).
__global__ void adamw_bf16_grad_kernel(float* p, const __nv_bfloat16* g, float* m, float* v, int64_t n, AdamWStep a) {
  GRID_STRIDE_LOOP(i, n) adamw_element(p[i], m[i], v[i], __bfloat162float(g[i]), a, a.weight_decay);
}

// blockIdx.y: the segment; a grid-stride loop over its elements, one a thread, with its decay.
// rounded (optional): the updated parameter rounded to bf16 as well.
template <class G>
__global__ void adamw_segments_kernel(float* p, const G* g, float* m, float* v, __nv_bfloat16* rounded,
                                      AdamWSegmentTable t, AdamWStep a) {
  const int seg = static_cast<int>(blockIdx.y);
  if (seg >= t.count) return;
  const int64_t at = t.offset[seg];
  const float wd = t.weight_decay[seg];
  GRID_STRIDE_LOOP(i, t.numel[seg]) {
    adamw_element(p[at + i], m[at + i], v[at + i], to_f32(g[at + i]), a, wd);
    if (rounded != nullptr) rounded[at + i] = __float2bfloat16_rn(p[at + i]);
  }
}

template <int W>
__global__ void sgd_kernel(float* p, const float* g, float* buf, int64_t packs, float lr, float mu, float wd,
                           float gs) {
  GRID_STRIDE_LOOP(i, packs) {
    const int64_t idx = i * W;
    Pack<W> pp = load_pack<W>(p + idx), bb = load_pack<W>(buf + idx);
    const Pack<W> gg = load_pack<W>(g + idx);
    for (int k = 0; k < W; ++k) {
      const float b = mu * bb.v[k] + gg.v[k] * gs + wd * pp.v[k];
      bb.v[k] = b;
      pp.v[k] -= lr * b;
    }
    store_pack<W>(p + idx, pp);
    store_pack<W>(buf + idx, bb);
  }
}

}  // namespace

cudaError_t launch_adamw(float* p, const void* g, DType gt, float* m, float* v, int64_t n, const AdamWStep& a,
                         cudaStream_t s) {
  if (gt == DType::bf16) {  // one element a thread
    const Launches L = adamw_bf16_grad_launches(n);
    if (L.count == 0) return cudaSuccess;
    adamw_bf16_grad_kernel<<<L[0].x, kThreads, 0, s>>>(p, static_cast<const __nv_bfloat16*>(g), m, v, n, a);
    return cudaGetLastError();
  }
  const float* gf = static_cast<const float*>(g);
  const bool aligned = aligned16(p, gf, m, v);
  const Launches L = adamw_update_launches(n, aligned);
  if (L.count == 0) return cudaSuccess;
  if (packable(n, aligned))
    adamw_kernel<4><<<L[0].x, kThreads, 0, s>>>(p, gf, m, v, n / 4, a);
  else
    adamw_kernel<1><<<L[0].x, kThreads, 0, s>>>(p, gf, m, v, n, a);
  return cudaGetLastError();
}

cudaError_t launch_adamw_segments(float* p, const void* g, DType gt, float* m, float* v, void* rounded,
                                  const AdamWSegmentTable& t, const AdamWStep& a, cudaStream_t s) {
  const Launches L = adamw_segments_launches(std::span<const int64_t>(t.numel, static_cast<size_t>(t.count)),
                                             gt == DType::bf16);
  if (L.count == 0) return cudaSuccess;
  const dim3 grid(L[0].x, L[0].y);
  if (gt == DType::bf16)
    adamw_segments_kernel<<<grid, kThreads, 0, s>>>(p, static_cast<const __nv_bfloat16*>(g), m, v,
                                                    static_cast<__nv_bfloat16*>(rounded), t, a);
  else
    adamw_segments_kernel<<<grid, kThreads, 0, s>>>(p, static_cast<const float*>(g), m, v,
                                                    static_cast<__nv_bfloat16*>(rounded), t, a);
  return cudaGetLastError();
}

cudaError_t launch_sgd(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float weight_decay,
                       float grad_scale, cudaStream_t s) {
  const bool aligned = aligned16(p, g, buf);
  const Launches L = sgd_update_launches(n, aligned);
  if (L.count == 0) return cudaSuccess;
  if (packable(n, aligned))
    sgd_kernel<4><<<L[0].x, kThreads, 0, s>>>(p, g, buf, n / 4, lr, momentum, weight_decay, grad_scale);
  else
    sgd_kernel<1><<<L[0].x, kThreads, 0, s>>>(p, g, buf, n, lr, momentum, weight_decay, grad_scale);
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
