// norm.cu — the LayerNorm and RMSNorm kernels (ops/norm.hpp; host side in norm.cpp).
// Mirrors src/backend/cpu/norm.cpp formula for formula; the parameter gradients fold per-chunk
// partials in an order fixed by the shapes alone (layernorm_chunks, launches.hpp, which also has
// the grids).
#include "src/backend/cuda/kernel_util.cuh"

namespace shardlab::cuda {
namespace {

// One warp per row. Whole warps leave together (row is per warp), so the shuffles see full warps.
// out f32, or bf16 (each value computed in f32, rounded once as it is stored).
// inp_bf16 (optional): the input rounded to bf16 as well (what the backward reads, saved so).
template <class O>
__global__ void layernorm_forward_kernel(O* out, __nv_bfloat16* inp_bf16, float* mean, float* rstd, const float* inp,
                                         const float* w, const float* b, int64_t N, int64_t C, float eps) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const float* x = inp + row * C;
  float s = 0.f;
  for (int64_t c = lane; c < C; c += kWarp) s += x[c];
  const float m = warp_allreduce(s, SumOp{}) / C;
  float v = 0.f;
  for (int64_t c = lane; c < C; c += kWarp) v += (x[c] - m) * (x[c] - m);
  const float r = 1.f / sqrtf(warp_allreduce(v, SumOp{}) / C + eps);
  O* o = out + row * C;
  for (int64_t c = lane; c < C; c += kWarp) store_f32(o + c, (x[c] - m) * r * w[c] + b[c]);
  if (inp_bf16 != nullptr)
    for (int64_t c = lane; c < C; c += kWarp) inp_bf16[row * C + c] = __float2bfloat16_rn(x[c]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dinp (accumulated, or from + the gradient where `from` is given; it may be dinp), one warp per
// row; `rounded` (optional) the result in bf16 too. inp f32 or bf16.
template <class I>
__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* from, __nv_bfloat16* rounded,
                                               const float* dout, const I* inp, const float* w, const float* mean,
                                               const float* rstd, int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const I* x = inp + row * C;
  const float* d = dout + row * C;
  const float m = mean[row], r = rstd[row];
  float dnorm_mean = 0.f, dnorm_norm_mean = 0.f;
  for (int64_t c = lane; c < C; c += kWarp) {
    const float norm = (to_f32(x[c]) - m) * r;
    const float dnorm = w[c] * d[c];
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * norm;
  }
  dnorm_mean = warp_allreduce(dnorm_mean, SumOp{}) / C;
  dnorm_norm_mean = warp_allreduce(dnorm_norm_mean, SumOp{}) / C;
  float* di = dinp + row * C;
  const float* base = from != nullptr ? from + row * C : di;
  for (int64_t c = lane; c < C; c += kWarp) {
    const float norm = (to_f32(x[c]) - m) * r;
    const float dnorm = w[c] * d[c];
    const float v = base[c] + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
    di[c] = v;
    if (rounded != nullptr) rounded[row * C + c] = __float2bfloat16_rn(v);
  }
}

// LayerNorm's dw/db: chunk blockIdx.y of rows_per_chunk rows writes its partial sums (dw then db,
// 2C floats) to `partial`; a second kernel folds the chunks in order. The chunking depends on N
// alone, so the result is the same on every run.
template <class I>
__global__ void layernorm_backward_partial_kernel(float* partial, const float* dout, const I* inp,
                                                  const float* mean, const float* rstd, int64_t N, int64_t C,
                                                  int64_t rows_per_chunk) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * rows_per_chunk, end = min(N, begin + rows_per_chunk);
  float dw = 0.f, db = 0.f;
  for (int64_t r = begin; r < end; ++r) {
    const float d = dout[r * C + c];
    dw += (to_f32(inp[r * C + c]) - mean[r]) * rstd[r] * d;
    db += d;
  }
  partial[chunk * 2 * C + c] = dw;
  partial[chunk * 2 * C + C + c] = db;
}

__global__ void layernorm_backward_fold_kernel(float* dw, float* db, const float* partial, int64_t chunks, int64_t C) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float sw = 0.f, sb = 0.f;
  for (int64_t k = 0; k < chunks; ++k) {
    sw += partial[k * 2 * C + c];
    sb += partial[k * 2 * C + C + c];
  }
  dw[c] += sw;
  db[c] += sb;
}

// RMSNorm, one warp per row as LayerNorm: out = x * r * w with r = 1 / sqrt(mean(x^2) + eps), the
// CPU's formula (1 / sqrtf, not the approximate rsqrtf).
// inp_bf16 (optional): the input rounded to bf16 as well, as LayerNorm's.
template <class O>
__global__ void rmsnorm_forward_kernel(O* out, __nv_bfloat16* inp_bf16, float* rstd, const float* inp, const float* w,
                                       int64_t N, int64_t C, float eps) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const float* x = inp + row * C;
  float ss = 0.f;
  for (int64_t c = lane; c < C; c += kWarp) ss += x[c] * x[c];
  const float r = 1.f / sqrtf(warp_allreduce(ss, SumOp{}) / C + eps);
  O* o = out + row * C;
  for (int64_t c = lane; c < C; c += kWarp) store_f32(o + c, x[c] * r * w[c]);
  if (inp_bf16 != nullptr)
    for (int64_t c = lane; c < C; c += kWarp) inp_bf16[row * C + c] = __float2bfloat16_rn(x[c]);
  if (lane == 0) rstd[row] = r;
}

// d/dx of x * r * w, with g = w * dout: r * (g - x * r^2 * mean(g * x)), since dr/dx_j = -r^3 x_j / C.
// dinp, from, rounded and the input's dtype as LayerNorm's backward takes them.
template <class I>
__global__ void rmsnorm_backward_dinp_kernel(float* dinp, const float* from, __nv_bfloat16* rounded, const float* dout,
                                             const I* inp, const float* w, const float* rstd, int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const I* x = inp + row * C;
  const float* d = dout + row * C;
  const float r = rstd[row];
  float gx = 0.f;
  for (int64_t c = lane; c < C; c += kWarp) gx += w[c] * d[c] * to_f32(x[c]);
  const float k = warp_allreduce(gx, SumOp{}) / C * r * r;
  float* di = dinp + row * C;
  const float* base = from != nullptr ? from + row * C : di;
  for (int64_t c = lane; c < C; c += kWarp) {
    const float v = base[c] + (w[c] * d[c] - to_f32(x[c]) * k) * r;
    di[c] = v;
    if (rounded != nullptr) rounded[row * C + c] = __float2bfloat16_rn(v);
  }
}

// RMSNorm's dw as LayerNorm's: chunk blockIdx.y writes its C partial sums, a second kernel folds
// the chunks in order (rmsnorm_backward_fold_kernel); the chunking depends on N alone.
template <class I>
__global__ void rmsnorm_backward_partial_kernel(float* partial, const float* dout, const I* inp,
                                                const float* rstd, int64_t N, int64_t C, int64_t rows_per_chunk) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * rows_per_chunk, end = min(N, begin + rows_per_chunk);
  float dw = 0.f;
  for (int64_t r = begin; r < end; ++r) dw += to_f32(inp[r * C + c]) * rstd[r] * dout[r * C + c];
  partial[chunk * C + c] = dw;
}

__global__ void rmsnorm_backward_fold_kernel(float* dw, const float* partial, int64_t chunks, int64_t C) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float sw = 0.f;
  for (int64_t k = 0; k < chunks; ++k) sw += partial[k * C + c];
  dw[c] += sw;
}

// Both norms' backward in one launch (launches.hpp, norm_fused_warps): block b takes rows
// [b rows_per_chunk, ...), warp w of it rows w, w + warps, ... in turn, dinp as the per-row kernels
// compute it, while each lane adds its columns' dw (and, kStats 2, LayerNorm's db) terms into its
// warp's own shared row (so every sum has a fixed order); the block then adds its warps' rows in
// order into its chunk's partial, and the last block to arrive (an arrival counter, zero before
// and after) folds the chunks in order into dw (db). mean is unused by RMSNorm (kStats 1).
template <class I, int kStats>
__global__ void norm_backward_fused_kernel(float* dinp, const float* from, __nv_bfloat16* rounded, float* dw,
                                           float* db, const float* dout, const I* inp, const float* w,
                                           const float* mean, const float* rstd, float* partial, unsigned* arrivals,
                                           int64_t N, int64_t C, int64_t rows_per_chunk) {
  extern __shared__ float rows_acc[];  // [warps][kStats C]
  __shared__ bool last;
  const int warps = blockDim.x / kWarp, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t width = kStats * C;
  float* acc = rows_acc + warp * width;
  for (int64_t c = lane; c < C; c += kWarp) {  // each lane zeroes the columns it adds into
    acc[c] = 0.f;
    if constexpr (kStats == 2) acc[C + c] = 0.f;
  }
  const int64_t begin = blockIdx.x * rows_per_chunk, end = min(N, begin + rows_per_chunk);
  for (int64_t row = begin + warp; row < end; row += warps) {
    const I* x = inp + row * C;
    const float* d = dout + row * C;
    const float m = kStats == 2 ? mean[row] : 0.f, r = rstd[row];
    float s1 = 0.f, s2 = 0.f;  // LayerNorm: mean(w d), mean(w d norm); RMSNorm: mean(w d x), k
    for (int64_t c = lane; c < C; c += kWarp) {
      const float g = w[c] * d[c];
      if constexpr (kStats == 2) {
        const float norm = (to_f32(x[c]) - m) * r;  // grouped as the per-row kernel's
        s1 += g;
        s2 += g * norm;
      } else {
        s1 += g * to_f32(x[c]);
      }
    }
    s1 = warp_allreduce(s1, SumOp{}) / C;
    if constexpr (kStats == 2)
      s2 = warp_allreduce(s2, SumOp{}) / C;
    else
      s2 = s1 * r * r;  // RMSNorm's k
    float* di = dinp + row * C;
    const float* base = from != nullptr ? from + row * C : di;
    for (int64_t c = lane; c < C; c += kWarp) {
      const float xc = to_f32(x[c]), g = w[c] * d[c];
      float v;
      if constexpr (kStats == 2) {
        const float norm = (xc - m) * r;
        v = base[c] + (g - s1 - norm * s2) * r;
        acc[c] += norm * d[c];
        acc[C + c] += d[c];
      } else {
        v = base[c] + (g - xc * s2) * r;
        acc[c] += xc * r * d[c];
      }
      di[c] = v;
      if (rounded != nullptr) rounded[row * C + c] = __float2bfloat16_rn(v);
    }
  }
  __syncthreads();
  float* mine = partial + blockIdx.x * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
    float sum = 0.f;
    for (int k = 0; k < warps; ++k) sum += rows_acc[k * width + c];
    mine[c] = sum;
  }
  __threadfence();  // this block's partial is visible before the block is counted
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // every other block's partial, counted before, is read after
  const volatile float* all = partial;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float sw = 0.f, sb = 0.f;
    for (int64_t k = 0; k < gridDim.x; ++k) {
      sw += all[k * width + c];
      if constexpr (kStats == 2) sb += all[k * width + C + c];
    }
    dw[c] += sw;
    if constexpr (kStats == 2) db[c] += sb;
  }
  if (threadIdx.x == 0) *arrivals = 0;  // ready for the next call
}

// The fused backward's launch: its blocks, warps and shared rows from the shape (launches.hpp).
template <int kStats, class I>
cudaError_t norm_backward_fused(float* dinp, const float* from, void* rounded, float* dw, float* db, const float* dout,
                                const I* inp, const float* w, const float* mean, const float* rstd, float* workspace,
                                unsigned* arrivals, int64_t N, int64_t C, cudaStream_t s) {
  const int64_t blocks = norm_fused_blocks(N), rows_per_chunk = (N + blocks - 1) / blocks;
  const int warps = norm_fused_warps(C, kStats);
  const size_t smem = static_cast<size_t>(warps) * kStats * C * sizeof(float);
  norm_backward_fused_kernel<I, kStats><<<blocks, warps * kWarp, smem, s>>>(
      dinp, from, static_cast<__nv_bfloat16*>(rounded), dw, db, dout, inp, w, mean, rstd, workspace, arrivals, N, C,
      rows_per_chunk);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_layernorm_forward(void* out, DType out_type, void* inp_bf16, float* mean, float* rstd,
                                     const float* inp, const float* w, const float* b, int64_t N, int64_t C, float eps,
                                     cudaStream_t s) {
  const Launches L = layernorm_forward_launches(N, C);
  if (L.count == 0) return cudaSuccess;
  auto* copy = static_cast<__nv_bfloat16*>(inp_bf16);
  if (out_type == DType::bf16)
    layernorm_forward_kernel<<<L[0].x, kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(out), copy, mean, rstd, inp, w, b,
                                                         N, C, eps);
  else
    layernorm_forward_kernel<<<L[0].x, kThreads, 0, s>>>(static_cast<float*>(out), copy, mean, rstd, inp, w, b, N, C,
                                                         eps);
  return cudaGetLastError();
}

int64_t layernorm_backward_workspace(int64_t N, int64_t C) {
  return 2 * C * std::max(layernorm_chunks(N), norm_fused_blocks(N));
}

namespace {
template <class I>
cudaError_t layernorm_backward_as(float* dinp, const float* from, void* rounded, float* dw, float* db,
                                  const float* dout, const I* inp, const float* w, const float* mean,
                                  const float* rstd, float* workspace, unsigned* arrivals, int64_t N, int64_t C,
                                  cudaStream_t s) {
  const Launches L = layernorm_backward_launches(N, C);
  if (L.count == 0) return cudaSuccess;
  if (L.count == 1)
    return norm_backward_fused<2>(dinp, from, rounded, dw, db, dout, inp, w, mean, rstd, workspace, arrivals, N, C, s);
  layernorm_backward_dinp_kernel<<<L[0].x, kThreads, 0, s>>>(dinp, from, static_cast<__nv_bfloat16*>(rounded), dout,
                                                             inp, w, mean, rstd, N, C);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t chunks = L[1].y, rows_per_chunk = (N + chunks - 1) / chunks;  // layernorm_chunks(N)
  layernorm_backward_partial_kernel<<<dim3(L[1].x, L[1].y), kThreads, 0, s>>>(workspace, dout, inp, mean, rstd, N, C,
                                                                               rows_per_chunk);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  layernorm_backward_fold_kernel<<<L[2].x, kThreads, 0, s>>>(dw, db, workspace, chunks, C);
  return cudaGetLastError();
}
}  // namespace

cudaError_t launch_layernorm_backward(float* dinp, const float* from, void* rounded, float* dw, float* db,
                                      const float* dout, const void* inp, DType inp_type, const float* w,
                                      const float* mean, const float* rstd, float* workspace, unsigned* arrivals,
                                      int64_t N, int64_t C, cudaStream_t s) {
  if (inp_type == DType::bf16)
    return layernorm_backward_as(dinp, from, rounded, dw, db, dout, static_cast<const __nv_bfloat16*>(inp), w, mean,
                                 rstd, workspace, arrivals, N, C, s);
  return layernorm_backward_as(dinp, from, rounded, dw, db, dout, static_cast<const float*>(inp), w, mean, rstd,
                               workspace, arrivals, N, C, s);
}

cudaError_t launch_rmsnorm_forward(void* out, DType out_type, void* inp_bf16, float* rstd, const float* inp,
                                   const float* w, int64_t N, int64_t C, float eps, cudaStream_t s) {
  const Launches L = rmsnorm_forward_launches(N, C);
  if (L.count == 0) return cudaSuccess;
  auto* copy = static_cast<__nv_bfloat16*>(inp_bf16);
  if (out_type == DType::bf16)
    rmsnorm_forward_kernel<<<L[0].x, kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(out), copy, rstd, inp, w, N, C,
                                                       eps);
  else
    rmsnorm_forward_kernel<<<L[0].x, kThreads, 0, s>>>(static_cast<float*>(out), copy, rstd, inp, w, N, C, eps);
  return cudaGetLastError();
}

int64_t rmsnorm_backward_workspace(int64_t N, int64_t C) {
  return C * std::max(layernorm_chunks(N), norm_fused_blocks(N));
}

namespace {
template <class I>
cudaError_t rmsnorm_backward_as(float* dinp, const float* from, void* rounded, float* dw, const float* dout,
                                const I* inp, const float* w, const float* rstd, float* workspace, unsigned* arrivals,
                                int64_t N, int64_t C, cudaStream_t s) {
  const Launches L = rmsnorm_backward_launches(N, C);  // LayerNorm's chunking, for the same reproducibility
  if (L.count == 0) return cudaSuccess;
  if (L.count == 1)
    return norm_backward_fused<1>(dinp, from, rounded, dw, nullptr, dout, inp, w, nullptr, rstd, workspace, arrivals, N,
                                  C, s);
  rmsnorm_backward_dinp_kernel<<<L[0].x, kThreads, 0, s>>>(dinp, from, static_cast<__nv_bfloat16*>(rounded), dout,
                                                           inp, w, rstd, N, C);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t chunks = L[1].y, rows_per_chunk = (N + chunks - 1) / chunks;  // layernorm_chunks(N)
  rmsnorm_backward_partial_kernel<<<dim3(L[1].x, L[1].y), kThreads, 0, s>>>(workspace, dout, inp, rstd, N, C,
                                                                             rows_per_chunk);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  rmsnorm_backward_fold_kernel<<<L[2].x, kThreads, 0, s>>>(dw, workspace, chunks, C);
  return cudaGetLastError();
}
}  // namespace

cudaError_t launch_rmsnorm_backward(float* dinp, const float* from, void* rounded, float* dw, const float* dout,
                                    const void* inp, DType inp_type, const float* w, const float* rstd,
                                    float* workspace, unsigned* arrivals, int64_t N, int64_t C, cudaStream_t s) {
  if (inp_type == DType::bf16)
    return rmsnorm_backward_as(dinp, from, rounded, dw, dout, static_cast<const __nv_bfloat16*>(inp), w, rstd,
                               workspace, arrivals, N, C, s);
  return rmsnorm_backward_as(dinp, from, rounded, dw, dout, static_cast<const float*>(inp), w, rstd, workspace,
                             arrivals, N, C, s);
}

namespace {

// One thread per (row, head): hd is a head's size (at most a few hundred), serial as the CPU's.
__global__ void head_rmsnorm_forward_kernel(float* x, float* pre, float* rstd, const float* w, int64_t N, int64_t W,
                                            int64_t col0, int64_t heads, int64_t hd, float eps) {
  GRID_STRIDE_LOOP(i, N * heads) {
    const int64_t n = i / heads, h = i % heads;
    float* v = x + n * W + col0 + h * hd;
    float* p = pre + i * hd;
    float ss = 0.f;
    for (int64_t c = 0; c < hd; ++c) {
      p[c] = v[c];
      ss += v[c] * v[c];
    }
    const float r = 1.f / sqrtf(ss / hd + eps);
    for (int64_t c = 0; c < hd; ++c) v[c] = (p[c] * r) * w[c];
    rstd[i] = r;
  }
}

// dw in two stages with a fixed order (as rmsnorm's): blockIdx.y takes a chunk of the N heads
// (row, head) pairs, each thread a weight element, into the workspace; then the chunks are folded
// in order onto dw. Read before the dx kernel overwrites d(normalised).
__global__ void head_rmsnorm_dw_partial_kernel(float* partial, const float* dx, const float* pre, const float* rstd,
                                               int64_t pairs, int64_t W, int64_t col0, int64_t heads, int64_t hd,
                                               int64_t per_chunk) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= hd) return;
  const int64_t begin = blockIdx.y * per_chunk, end = begin + per_chunk < pairs ? begin + per_chunk : pairs;
  float acc = 0.f;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t n = i / heads, h = i % heads;
    acc += dx[n * W + col0 + h * hd + c] * (pre[i * hd + c] * rstd[i]);
  }
  partial[blockIdx.y * hd + c] = acc;
}

__global__ void head_rmsnorm_dw_fold_kernel(float* dw, const float* partial, int64_t chunks, int64_t hd) {
  GRID_STRIDE_LOOP(c, hd) {
    float acc = dw[c];
    for (int64_t k = 0; k < chunks; ++k) acc += partial[k * hd + c];
    dw[c] = acc;
  }
}

__global__ void head_rmsnorm_dx_kernel(float* dx, const float* pre, const float* w, const float* rstd, int64_t N,
                                       int64_t W, int64_t col0, int64_t heads, int64_t hd) {
  GRID_STRIDE_LOOP(i, N * heads) {
    const int64_t n = i / heads, h = i % heads;
    float* d = dx + n * W + col0 + h * hd;
    const float* p = pre + i * hd;
    const float r = rstd[i];
    float dot = 0.f;
    for (int64_t c = 0; c < hd; ++c) dot += w[c] * d[c] * (p[c] * r);
    dot /= static_cast<float>(hd);
    for (int64_t c = 0; c < hd; ++c) d[c] = (w[c] * d[c] - (p[c] * r) * dot) * r;
  }
}

}  // namespace

cudaError_t launch_head_rmsnorm_forward(float* x, float* pre, float* rstd, const float* w, int64_t N, int64_t W,
                                        int64_t col0, int64_t heads, int64_t hd, float eps, cudaStream_t s) {
  const Launches L = head_rmsnorm_forward_launches(N, W, col0, heads, hd);
  if (L.count == 0) return cudaSuccess;
  head_rmsnorm_forward_kernel<<<L[0].x, kThreads, 0, s>>>(x, pre, rstd, w, N, W, col0, heads, hd, eps);
  return cudaGetLastError();
}

int64_t head_rmsnorm_backward_workspace(int64_t N, int64_t heads, int64_t hd) {
  return hd * layernorm_chunks(N * heads);
}

cudaError_t launch_head_rmsnorm_backward(float* dx, float* dw, const float* pre, const float* w, const float* rstd,
                                         float* workspace, int64_t N, int64_t W, int64_t col0, int64_t heads,
                                         int64_t hd, cudaStream_t s) {
  const Launches L = head_rmsnorm_backward_launches(N, W, col0, heads, hd);
  if (L.count == 0) return cudaSuccess;
  // dw first: it reads d(normalised), which the dx kernel then overwrites.
  const int64_t pairs = N * heads, chunks = L[0].y, per_chunk = (pairs + chunks - 1) / chunks;
  head_rmsnorm_dw_partial_kernel<<<dim3(L[0].x, L[0].y), kThreads, 0, s>>>(workspace, dx, pre, rstd, pairs, W, col0,
                                                                            heads, hd, per_chunk);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  head_rmsnorm_dw_fold_kernel<<<L[1].x, kThreads, 0, s>>>(dw, workspace, chunks, hd);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  head_rmsnorm_dx_kernel<<<L[2].x, kThreads, 0, s>>>(dx, pre, w, rstd, N, W, col0, heads, hd);
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
