// kernels.cu — the CUDA backend's kernels and their launchers.
//
// Reductions are deterministic: a fixed grid writes per-block partial sums and one block folds
// them in order. No atomics, so two runs of the same step give the same bits.
//
// Layer kernels mirror src/backend/cpu/kernels.cpp formula for formula (same constants, same
// accumulate/overwrite rules). Row reductions use one warp per row (or one block for the long rows
// of cross-entropy) folded with __shfl_xor_sync butterflies: every lane ends with the same bits, so
// values broadcast that way (a row's max and sum) are consistent across the row. Cross-row sums
// (embedding and LayerNorm parameter gradients) run in an order fixed by the shapes alone.
// Element-wise kernels move float4 packs when every pointer is 16-byte aligned and the length
// divides by 4, else single floats.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "src/backend/cuda/kernels.cuh"

namespace shardlab::cuda {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65535 * 8));
}

#define GRID_STRIDE_LOOP(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

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

__global__ void fill_kernel(void* x, DType t, int64_t n, float v) {
  GRID_STRIDE_LOOP(i, n) store_from_f32(x, t, i, v);
}

__global__ void cast_kernel(const void* src, DType st, void* dst, DType dt, int64_t n) {
  GRID_STRIDE_LOOP(i, n) store_from_f32(dst, dt, i, load_as_f32(src, st, i));
}

__global__ void axpy_kernel(float alpha, const float* x, float* y, int64_t n) {
  GRID_STRIDE_LOOP(i, n) y[i] += alpha * x[i];
}

__global__ void scale_kernel(float* x, float alpha, int64_t n) {
  GRID_STRIDE_LOOP(i, n) x[i] *= alpha;
}

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
  GRID_STRIDE_LOOP(i, n) out[i] = a[i] + b[i];
}

__global__ void mul_kernel(const float* a, const float* b, float* out, int64_t n) {
  GRID_STRIDE_LOOP(i, n) out[i] = a[i] * b[i];
}

__device__ inline double reduce_map(ReduceKind k, float v) {
  switch (k) {
    case ReduceKind::sum: return v;
    case ReduceKind::sum_squares: return static_cast<double>(v) * v;
    case ReduceKind::max_abs: return fabs(static_cast<double>(v));
  }
  return 0.0;
}

__device__ inline double reduce_combine(ReduceKind k, double a, double b) {
  return k == ReduceKind::max_abs ? fmax(a, b) : a + b;
}

// Block-wide fold of one value per thread; every thread returns the block's result.
__device__ double block_reduce(ReduceKind k, double v) {
  __shared__ double shared[kThreads];
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] = reduce_combine(k, shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  return shared[0];
}

__global__ void reduce_partial_kernel(const float* x, int64_t n, ReduceKind k, double* partial) {
  double acc = 0.0;
  GRID_STRIDE_LOOP(i, n) acc = reduce_combine(k, acc, reduce_map(k, x[i]));
  double r = block_reduce(k, acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = r;
}

__global__ void reduce_final_kernel(const double* partial, int count, ReduceKind k, float* out, bool accumulate) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc = reduce_combine(k, acc, partial[i]);
  double r = block_reduce(k, acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(accumulate ? reduce_combine(k, out[0], r) : r);
}

__global__ void sum_rows_kernel(const float* x, int64_t rows, int64_t cols, float* out, bool accumulate) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (c >= cols) return;
  double acc = 0.0;
  for (int64_t r = 0; r < rows; ++r) acc += x[r * cols + c];
  out[c] = static_cast<float>((accumulate ? out[c] : 0.0) + acc);
}

// ---- layer and optimizer kernels --------------------------------------------------------------------

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kThreads / kWarp;  // warp-per-row kernels
constexpr int kCrossEntropyThreads = 512;        // one block per row of V logits
constexpr int64_t kMaxRowBlocks = 2147483647;    // gridDim.x's limit, for one block per row
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// float4 packs need n % 4 == 0 and every pointer 16-byte aligned; otherwise the scalar kernel runs.
template <class... P>
bool packable(int64_t n, const P*... ptrs) {
  return n % 4 == 0 && (aligned16(ptrs) && ...);
}

// Blocks for `rows` rows at one warp each.
int row_blocks(int64_t rows) { return static_cast<int>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

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

// rows[bt] < 0 is a token of another rank's vocabulary shard: wpe alone (a copy, as the CPU), or zeros.
template <int W>
__global__ void embedding_forward_kernel(float* out, const int32_t* rows, const float* wte, const float* wpe,
                                         int64_t T, int64_t C, int64_t packs) {
  GRID_STRIDE_LOOP(i, packs) {
    const int64_t idx = i * W, bt = idx / C, c = idx % C;
    const int32_t row = rows[bt];
    Pack<W> e;
    if (row >= 0) {
      e = load_pack<W>(wte + static_cast<int64_t>(row) * C + c);
      if (wpe != nullptr) {  // null: a family without learned positions
        const Pack<W> p = load_pack<W>(wpe + (bt % T) * C + c);
        for (int k = 0; k < W; ++k) e.v[k] += p.v[k];
      }
    } else if (wpe != nullptr) {
      e = load_pack<W>(wpe + (bt % T) * C + c);
    } else {
      for (int k = 0; k < W; ++k) e.v[k] = 0.f;
    }
    store_pack<W>(out + idx, e);
  }
}

// One thread per (t, c); b ascending, one add at a time from the value dwpe holds: the CPU's order.
__global__ void embedding_backward_dwpe_kernel(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C) {
  GRID_STRIDE_LOOP(i, T * C) {
    float acc = dwpe[i];
    for (int64_t b = 0; b < B; ++b) acc += dout[b * T * C + i];
    dwpe[i] = acc;
  }
}

// One block per distinct token: it alone writes that dwte row, so no atomics are needed.
__global__ void embedding_backward_dwte_kernel(float* dwte, const float* dout, const int32_t* bucket_token,
                                               const int32_t* offsets, const int32_t* positions, int64_t C) {
  const int64_t u = blockIdx.x;
  float* row = dwte + static_cast<int64_t>(bucket_token[u]) * C;
  const int32_t begin = offsets[u], end = offsets[u + 1];
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = row[c];
    for (int32_t j = begin; j < end; ++j) acc += dout[static_cast<int64_t>(positions[j]) * C + c];
    row[c] = acc;
  }
}

// One warp per row. Whole warps leave together (row is per warp), so the shuffles see full warps.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                         const float* b, int64_t N, int64_t C, float eps) {
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
  float* o = out + row * C;
  for (int64_t c = lane; c < C; c += kWarp) o[c] = (x[c] - m) * r * w[c] + b[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dinp (accumulated), one warp per row.
__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                               const float* mean, const float* rstd, int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const float* x = inp + row * C;
  const float* d = dout + row * C;
  const float m = mean[row], r = rstd[row];
  float dnorm_mean = 0.f, dnorm_norm_mean = 0.f;
  for (int64_t c = lane; c < C; c += kWarp) {
    const float norm = (x[c] - m) * r;
    const float dnorm = w[c] * d[c];
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * norm;
  }
  dnorm_mean = warp_allreduce(dnorm_mean, SumOp{}) / C;
  dnorm_norm_mean = warp_allreduce(dnorm_norm_mean, SumOp{}) / C;
  float* di = dinp + row * C;
  for (int64_t c = lane; c < C; c += kWarp) {
    const float norm = (x[c] - m) * r;
    const float dnorm = w[c] * d[c];
    di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
  }
}

// LayerNorm's dw/db: chunk blockIdx.y of rows_per_chunk rows writes its partial sums (dw then db,
// 2C floats) to `partial`; a second kernel folds the chunks in order. The chunking depends on N
// alone, so the result is the same on every run.
__global__ void layernorm_backward_partial_kernel(float* partial, const float* dout, const float* inp,
                                                  const float* mean, const float* rstd, int64_t N, int64_t C,
                                                  int64_t rows_per_chunk) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * rows_per_chunk, end = min(N, begin + rows_per_chunk);
  float dw = 0.f, db = 0.f;
  for (int64_t r = begin; r < end; ++r) {
    const float d = dout[r * C + c];
    dw += (inp[r * C + c] - mean[r]) * rstd[r] * d;
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
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp, const float* w, int64_t N,
                                       int64_t C, float eps) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const float* x = inp + row * C;
  float ss = 0.f;
  for (int64_t c = lane; c < C; c += kWarp) ss += x[c] * x[c];
  const float r = 1.f / sqrtf(warp_allreduce(ss, SumOp{}) / C + eps);
  float* o = out + row * C;
  for (int64_t c = lane; c < C; c += kWarp) o[c] = x[c] * r * w[c];
  if (lane == 0) rstd[row] = r;
}

// d/dx of x * r * w, with g = w * dout: r * (g - x * r^2 * mean(g * x)), since dr/dx_j = -r^3 x_j / C.
__global__ void rmsnorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                             const float* rstd, int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const float* x = inp + row * C;
  const float* d = dout + row * C;
  const float r = rstd[row];
  float gx = 0.f;
  for (int64_t c = lane; c < C; c += kWarp) gx += w[c] * d[c] * x[c];
  const float k = warp_allreduce(gx, SumOp{}) / C * r * r;
  float* di = dinp + row * C;
  for (int64_t c = lane; c < C; c += kWarp) di[c] += (w[c] * d[c] - x[c] * k) * r;
}

// RMSNorm's dw as LayerNorm's: chunk blockIdx.y writes its C partial sums, a second kernel folds
// the chunks in order (rmsnorm_backward_fold_kernel); the chunking depends on N alone.
__global__ void rmsnorm_backward_partial_kernel(float* partial, const float* dout, const float* inp,
                                                const float* rstd, int64_t N, int64_t C, int64_t rows_per_chunk) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * rows_per_chunk, end = min(N, begin + rows_per_chunk);
  float dw = 0.f;
  for (int64_t r = begin; r < end; ++r) dw += inp[r * C + c] * rstd[r] * dout[r * C + c];
  partial[chunk * C + c] = dw;
}

__global__ void rmsnorm_backward_fold_kernel(float* dw, const float* partial, int64_t chunks, int64_t C) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float sw = 0.f;
  for (int64_t k = 0; k < chunks; ++k) sw += partial[k * C + c];
  dw[c] += sw;
}

// One thread per (row, head, pair): each pair is read and written by its own thread only. The
// angle is the f32 product HF computes (inv_freq @ position_ids.float()), then f32 cos and sin;
// the inverse negates the sine, which is sin(-angle) exactly.
__global__ void rope_kernel(float* x, int64_t T, int64_t W, int64_t heads, int64_t half, RopeTable freqs,
                            int64_t pos0, bool inverse, int64_t n) {
  GRID_STRIDE_LOOP(idx, n) {
    const int64_t i = idx % half, h = (idx / half) % heads, row = idx / (half * heads);
    const float angle = static_cast<float>(pos0 + row % T) * freqs.inv_freq[i];
    const float c = cosf(angle), s = inverse ? -sinf(angle) : sinf(angle);
    float* p = x + row * W + h * 2 * half + i;
    const float x1 = p[0], x2 = p[half];
    p[0] = x1 * c - x2 * s;
    p[half] = x2 * c + x1 * s;
  }
}

template <int W>
__global__ void add_bias_kernel(float* x, const float* bias, int64_t OC, int64_t packs) {
  GRID_STRIDE_LOOP(i, packs) {
    const int64_t idx = i * W;
    Pack<W> v = load_pack<W>(x + idx);
    const Pack<W> b = load_pack<W>(bias + idx % OC);
    for (int k = 0; k < W; ++k) v.v[k] += b.v[k];
    store_pack<W>(x + idx, v);
  }
}

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
__global__ void swiglu_forward_kernel(float* out, const float* gate_up, int64_t F, int64_t n) {
  GRID_STRIDE_LOOP(i, n) {
    const float* row = gate_up + (i / F) * 2 * F;
    const int64_t f = i % F;
    const float g = row[f];
    out[i] = g * sigmoid(g) * row[F + f];
  }
}

// silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g).
__global__ void swiglu_backward_kernel(float* dgate_up, const float* gate_up, const float* dout, int64_t F,
                                       int64_t n) {
  GRID_STRIDE_LOOP(i, n) {
    const int64_t r = i / F, f = i % F;
    const float g = gate_up[r * 2 * F + f], u = gate_up[r * 2 * F + F + f], d = dout[i];
    const float s = sigmoid(g);
    dgate_up[r * 2 * F + f] = d * u * s * (1.f + g * (1.f - s));
    dgate_up[r * 2 * F + F + f] = d * g * s;
  }
}

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

__global__ void kv_cache_write_kernel(float* k_cache, float* v_cache, const float* qkv, int64_t T, int64_t S,
                                      int64_t W, int64_t k0, int64_t KVd, int64_t pos0, int64_t n) {
  GRID_STRIDE_LOOP(i, n) {
    const int64_t j = i % KVd, bt = i / KVd, b = bt / T, t = bt % T;
    const float* k = qkv + bt * W + k0 + j;
    const int64_t at = (b * S + pos0 + t) * KVd + j;
    k_cache[at] = k[0];
    v_cache[at] = k[KVd];
  }
}

// One block per (b, h, t) query: its threads take the keys s <= pos0 + t in turn (a dot product of
// hd each), fold the row's max and sum over the block, then take the output's hd channels in turn,
// each summing its channel over the keys in order. The scores go to `scores` (P per query), which
// the cache's length would overflow in shared memory.
__global__ void attention_cached_kernel(float* out, const float* qkv, const float* k_cache, const float* v_cache,
                                        float* scores, int64_t T, int64_t S, int64_t H, int64_t KV, int64_t hd,
                                        int64_t pos0, float scale) {
  const int64_t row = blockIdx.x, t = row % T, h = (row / T) % H, b = row / (T * H);
  const int64_t C = H * hd, W = C + 2 * KV * hd, KVd = KV * hd, P = pos0 + T, last = pos0 + t;
  const float* q = qkv + (b * T + t) * W + h * hd;
  const float* k = k_cache + b * S * KVd + (h / (H / KV)) * hd;
  const float* v = v_cache + b * S * KVd + (h / (H / KV)) * hd;
  float* a = scores + row * P;
  float mx = -INFINITY;
  for (int64_t s = threadIdx.x; s <= last; s += blockDim.x) {
    float d = 0.f;
    for (int64_t j = 0; j < hd; ++j) d += q[j] * k[s * KVd + j];
    a[s] = d * scale;
    mx = fmaxf(mx, a[s]);
  }
  mx = block_allreduce(mx, -INFINITY, MaxOp{});
  float sum = 0.f;
  for (int64_t s = threadIdx.x; s <= last; s += blockDim.x) sum += (a[s] = expf(a[s] - mx));
  const float inv = 1.f / block_allreduce(sum, 0.f, SumOp{});  // its barriers publish every a[s]
  for (int64_t j = threadIdx.x; j < hd; j += blockDim.x) {
    float acc = 0.f;
    for (int64_t s = 0; s <= last; ++s) acc += a[s] * inv * v[s * KVd + j];
    out[(b * T + t) * C + h * hd + j] = acc;
  }
}

// ---- softmax rows, one block per row (cross_entropy and the vocabulary-parallel loss) ----

// The maximum of z[0, n), -inf when n == 0; every thread of the block returns it.
__device__ float block_row_max(const float* z, int64_t n) {
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, z[j]);
  return block_allreduce(mx, -INFINITY, MaxOp{});
}

// The sum of exp(z[j] - mx) over z[0, n): exps in double, summed in double (the CPU's terms are
// float, its sum double). Every thread of the block returns it.
__device__ double block_row_sumexp(const float* z, int64_t n, float mx) {
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += exp(static_cast<double>(z[j] - mx));
  return block_allreduce(sum, 0.0, SumOp{});
}

// d[j] = (exp(z[j] - mx) * inv - [j == y]) * scale over [0, n); y outside [0, n) subtracts nothing.
// Each thread writes only the elements it reads, so d may alias z once the block has finished
// reading the rest of the row (block_allreduce ends in __syncthreads).
__device__ void softmax_grad_row(float* d, const float* z, int64_t n, float mx, float inv, int64_t y, float scale) {
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float g = expf(z[j] - mx) * inv * scale;
    if (j == y) g -= scale;
    d[j] = g;
  }
}

// The whole row (and the target's logit) is read in the max and sum passes before any thread
// writes: dlogits may alias logits.
__global__ void cross_entropy_kernel(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                     int64_t V, float dloss_scale) {
  const int64_t row = blockIdx.x;
  const float* z = logits + row * V;
  const int32_t y = targets[row];
  const float zy = z[y];
  const float mx = block_row_max(z, V);
  const double sum = block_row_sumexp(z, V, mx);
  if (threadIdx.x == 0) losses[row] = static_cast<float>(log(sum)) + mx - zy;
  if (dlogits == nullptr) return;
  softmax_grad_row(dlogits + row * V, z, V, mx, static_cast<float>(1.0 / sum), y, dloss_scale);
}

// The vocabulary-parallel loss's steps over a shard's rows of Vl columns, `valid` of them real.
// cols[row] is the target's column in this shard, -1 where another rank holds it.
__global__ void vocab_ce_max_kernel(float* mx, const float* logits, int64_t Vl, int64_t valid) {
  const int64_t row = blockIdx.x;
  const float m = block_row_max(logits + row * Vl, valid);
  if (threadIdx.x == 0) mx[row] = m;
}

__global__ void vocab_ce_sums_kernel(float* sumexp, float* tlogit, const float* logits, const int32_t* cols,
                                     const float* mx, int64_t Vl, int64_t valid) {
  const int64_t row = blockIdx.x;
  const float* z = logits + row * Vl;
  const double sum = block_row_sumexp(z, valid, mx[row]);
  if (threadIdx.x != 0) return;
  sumexp[row] = static_cast<float>(sum);
  const int32_t y = cols[row];
  tlogit[row] = y >= 0 ? z[y] : 0.f;
}

// Nothing but this thread's own elements is read here, so dlogits may alias logits. The padding
// columns get exact zeros: they are not in the softmax.
__global__ void vocab_ce_finish_kernel(float* losses, float* dlogits, const float* logits, const int32_t* cols,
                                       const float* mx, const float* sumexp, const float* tlogit, int64_t Vl,
                                       int64_t valid, float dloss_scale) {
  const int64_t row = blockIdx.x;
  const float m = mx[row], s = sumexp[row];
  if (threadIdx.x == 0) losses[row] = static_cast<float>(log(static_cast<double>(s))) + m - tlogit[row];
  if (dlogits == nullptr) return;
  float* d = dlogits + row * Vl;
  softmax_grad_row(d, logits + row * Vl, valid, m, 1.f / s, cols[row], dloss_scale);
  for (int64_t j = valid + threadIdx.x; j < Vl; j += blockDim.x) d[j] = 0.f;
}

template <int W>
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t packs, AdamWStep a) {
  GRID_STRIDE_LOOP(i, packs) {
    const int64_t idx = i * W;
    Pack<W> pp = load_pack<W>(p + idx), mm = load_pack<W>(m + idx), vv = load_pack<W>(v + idx);
    const Pack<W> gg = load_pack<W>(g + idx);
    for (int k = 0; k < W; ++k) {
      const float grad = gg.v[k] * a.grad_scale;
      const float mi = a.beta1 * mm.v[k] + (1.f - a.beta1) * grad;
      const float vi = a.beta2 * vv.v[k] + (1.f - a.beta2) * grad * grad;
      mm.v[k] = mi;
      vv.v[k] = vi;
      pp.v[k] -= a.lr * ((mi * a.inv_bc1) / (sqrtf(vi * a.inv_bc2) + a.eps) + a.weight_decay * pp.v[k]);
    }
    store_pack<W>(p + idx, pp);
    store_pack<W>(m + idx, mm);
    store_pack<W>(v + idx, vv);
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

// LayerNorm backward's chunking of N rows: at most 256 chunks of at least 32 rows (fewer when N is
// small). A function of N only, which is what makes dw/db reproducible.
int64_t layernorm_chunks(int64_t N) { return std::clamp<int64_t>((N + 31) / 32, 1, 256); }

}  // namespace

cudaError_t launch_fill(void* x, DType t, int64_t n, float value, cudaStream_t s) {
  fill_kernel<<<grid_for(n), kThreads, 0, s>>>(x, t, n, value);
  return cudaGetLastError();
}

cudaError_t launch_cast(const void* src, DType src_type, void* dst, DType dst_type, int64_t n, cudaStream_t s) {
  cast_kernel<<<grid_for(n), kThreads, 0, s>>>(src, src_type, dst, dst_type, n);
  return cudaGetLastError();
}

cudaError_t launch_axpy(float alpha, const float* x, float* y, int64_t n, cudaStream_t s) {
  axpy_kernel<<<grid_for(n), kThreads, 0, s>>>(alpha, x, y, n);
  return cudaGetLastError();
}

cudaError_t launch_scale(float* x, float alpha, int64_t n, cudaStream_t s) {
  scale_kernel<<<grid_for(n), kThreads, 0, s>>>(x, alpha, n);
  return cudaGetLastError();
}

cudaError_t launch_add(const float* a, const float* b, float* out, int64_t n, cudaStream_t s) {
  add_kernel<<<grid_for(n), kThreads, 0, s>>>(a, b, out, n);
  return cudaGetLastError();
}

cudaError_t launch_mul(const float* a, const float* b, float* out, int64_t n, cudaStream_t s) {
  mul_kernel<<<grid_for(n), kThreads, 0, s>>>(a, b, out, n);
  return cudaGetLastError();
}

cudaError_t launch_reduce(const float* x, int64_t n, ReduceKind k, double* partial, float* out, bool accumulate,
                          cudaStream_t s) {
  int blocks = static_cast<int>(std::min<int64_t>(kReduceBlocks, std::max<int64_t>(1, (n + kThreads - 1) / kThreads)));
  reduce_partial_kernel<<<blocks, kThreads, 0, s>>>(x, n, k, partial);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  reduce_final_kernel<<<1, kThreads, 0, s>>>(partial, blocks, k, out, accumulate);
  return cudaGetLastError();
}

cudaError_t launch_sum_rows(const float* x, int64_t rows, int64_t cols, float* out, bool accumulate, cudaStream_t s) {
  int blocks = static_cast<int>(std::max<int64_t>(1, (cols + kThreads - 1) / kThreads));
  sum_rows_kernel<<<blocks, kThreads, 0, s>>>(x, rows, cols, out, accumulate);
  return cudaGetLastError();
}

// ---- layer and optimizer launchers ------------------------------------------------------------------

cudaError_t launch_embedding_forward(float* out, const int32_t* rows, const float* wte, const float* wpe, int64_t B,
                                     int64_t T, int64_t C, cudaStream_t s) {
  const int64_t n = B * T * C;
  if (n == 0) return cudaSuccess;
  if (packable(C, out, wte, wpe))
    embedding_forward_kernel<4><<<grid_for(n / 4), kThreads, 0, s>>>(out, rows, wte, wpe, T, C, n / 4);
  else
    embedding_forward_kernel<1><<<grid_for(n), kThreads, 0, s>>>(out, rows, wte, wpe, T, C, n);
  return cudaGetLastError();
}

cudaError_t launch_embedding_backward_dwpe(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C,
                                           cudaStream_t s) {
  if (T * C == 0) return cudaSuccess;
  embedding_backward_dwpe_kernel<<<grid_for(T * C), kThreads, 0, s>>>(dwpe, dout, B, T, C);
  return cudaGetLastError();
}

cudaError_t launch_embedding_backward_dwte(float* dwte, const float* dout, const int32_t* bucket_token,
                                           const int32_t* offsets, const int32_t* positions, int64_t buckets,
                                           int64_t C, cudaStream_t s) {
  if (buckets == 0 || C == 0) return cudaSuccess;
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, (C + kWarp - 1) / kWarp * kWarp));
  embedding_backward_dwte_kernel<<<static_cast<unsigned>(buckets), threads, 0, s>>>(dwte, dout, bucket_token, offsets,
                                                                                     positions, C);
  return cudaGetLastError();
}

cudaError_t launch_layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                     const float* b, int64_t N, int64_t C, float eps, cudaStream_t s) {
  if (N == 0) return cudaSuccess;
  layernorm_forward_kernel<<<row_blocks(N), kThreads, 0, s>>>(out, mean, rstd, inp, w, b, N, C, eps);
  return cudaGetLastError();
}

int64_t layernorm_backward_workspace(int64_t N, int64_t C) { return 2 * C * layernorm_chunks(N); }

cudaError_t launch_layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                                      const float* w, const float* mean, const float* rstd, float* workspace,
                                      int64_t N, int64_t C, cudaStream_t s) {
  if (N == 0 || C == 0) return cudaSuccess;
  layernorm_backward_dinp_kernel<<<row_blocks(N), kThreads, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t chunks = layernorm_chunks(N), rows_per_chunk = (N + chunks - 1) / chunks;
  const unsigned col_blocks = static_cast<unsigned>((C + kThreads - 1) / kThreads);
  layernorm_backward_partial_kernel<<<dim3(col_blocks, static_cast<unsigned>(chunks)), kThreads, 0, s>>>(
      workspace, dout, inp, mean, rstd, N, C, rows_per_chunk);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  layernorm_backward_fold_kernel<<<col_blocks, kThreads, 0, s>>>(dw, db, workspace, chunks, C);
  return cudaGetLastError();
}

cudaError_t launch_rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C,
                                   float eps, cudaStream_t s) {
  if (N == 0) return cudaSuccess;
  rmsnorm_forward_kernel<<<row_blocks(N), kThreads, 0, s>>>(out, rstd, inp, w, N, C, eps);
  return cudaGetLastError();
}

int64_t rmsnorm_backward_workspace(int64_t N, int64_t C) { return C * layernorm_chunks(N); }

cudaError_t launch_rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                                    const float* rstd, float* workspace, int64_t N, int64_t C, cudaStream_t s) {
  if (N == 0 || C == 0) return cudaSuccess;
  rmsnorm_backward_dinp_kernel<<<row_blocks(N), kThreads, 0, s>>>(dinp, dout, inp, w, rstd, N, C);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  // The chunking of LayerNorm's dw/db, for the same reproducibility.
  const int64_t chunks = layernorm_chunks(N), rows_per_chunk = (N + chunks - 1) / chunks;
  const unsigned col_blocks = static_cast<unsigned>((C + kThreads - 1) / kThreads);
  rmsnorm_backward_partial_kernel<<<dim3(col_blocks, static_cast<unsigned>(chunks)), kThreads, 0, s>>>(
      workspace, dout, inp, rstd, N, C, rows_per_chunk);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  rmsnorm_backward_fold_kernel<<<col_blocks, kThreads, 0, s>>>(dw, workspace, chunks, C);
  return cudaGetLastError();
}

cudaError_t launch_rope(float* x, int64_t rows, int64_t T, int64_t W, int64_t heads, int64_t half,
                        const RopeTable& freqs, int64_t pos0, bool inverse, cudaStream_t s) {
  const int64_t n = rows * heads * half;
  if (n == 0) return cudaSuccess;
  rope_kernel<<<grid_for(n), kThreads, 0, s>>>(x, T, W, heads, half, freqs, pos0, inverse, n);
  return cudaGetLastError();
}

cudaError_t launch_add_bias(float* x, const float* bias, int64_t N, int64_t OC, cudaStream_t s) {
  const int64_t n = N * OC;
  if (n == 0) return cudaSuccess;
  if (packable(OC, x, bias))
    add_bias_kernel<4><<<grid_for(n / 4), kThreads, 0, s>>>(x, bias, OC, n / 4);
  else
    add_bias_kernel<1><<<grid_for(n), kThreads, 0, s>>>(x, bias, OC, n);
  return cudaGetLastError();
}

cudaError_t launch_gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (packable(n, out, inp))
    gelu_forward_kernel<4><<<grid_for(n / 4), kThreads, 0, s>>>(out, inp, n / 4);
  else
    gelu_forward_kernel<1><<<grid_for(n), kThreads, 0, s>>>(out, inp, n);
  return cudaGetLastError();
}

cudaError_t launch_gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (packable(n, dinp, inp, dout))
    gelu_backward_kernel<4><<<grid_for(n / 4), kThreads, 0, s>>>(dinp, inp, dout, n / 4);
  else
    gelu_backward_kernel<1><<<grid_for(n), kThreads, 0, s>>>(dinp, inp, dout, n);
  return cudaGetLastError();
}

cudaError_t launch_swiglu_forward(float* out, const float* gate_up, int64_t N, int64_t F, cudaStream_t s) {
  const int64_t n = N * F;
  if (n == 0) return cudaSuccess;
  swiglu_forward_kernel<<<grid_for(n), kThreads, 0, s>>>(out, gate_up, F, n);
  return cudaGetLastError();
}

cudaError_t launch_swiglu_backward(float* dgate_up, const float* gate_up, const float* dout, int64_t N, int64_t F,
                                   cudaStream_t s) {
  const int64_t n = N * F;
  if (n == 0) return cudaSuccess;
  swiglu_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(dgate_up, gate_up, dout, F, n);
  return cudaGetLastError();
}

cudaError_t launch_causal_softmax(float* att, int64_t rows, int64_t T, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  causal_softmax_kernel<<<row_blocks(rows), kThreads, 0, s>>>(att, rows, T);
  return cudaGetLastError();
}

cudaError_t launch_causal_softmax_backward(float* datt, const float* att, int64_t rows, int64_t T, float scale,
                                           cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  causal_softmax_backward_kernel<<<row_blocks(rows), kThreads, 0, s>>>(datt, att, rows, T, scale);
  return cudaGetLastError();
}

cudaError_t launch_kv_cache_write(float* k_cache, float* v_cache, const float* qkv, int64_t B, int64_t T, int64_t S,
                                  int64_t H, int64_t KV, int64_t hd, int64_t pos0, cudaStream_t s) {
  const int64_t n = B * T * KV * hd;
  if (n == 0) return cudaSuccess;
  kv_cache_write_kernel<<<grid_for(n), kThreads, 0, s>>>(k_cache, v_cache, qkv, T, S, (H + 2 * KV) * hd, H * hd,
                                                          KV * hd, pos0, n);
  return cudaGetLastError();
}

cudaError_t launch_attention_cached(float* out, const float* qkv, const float* k_cache, const float* v_cache,
                                    float* scores, int64_t B, int64_t T, int64_t S, int64_t H, int64_t KV, int64_t hd,
                                    int64_t pos0, cudaStream_t s) {
  const int64_t rows = B * H * T;
  if (rows == 0) return cudaSuccess;
  const float scale = 1.f / sqrtf(static_cast<float>(hd));
  attention_cached_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(out, qkv, k_cache, v_cache, scores, T, S,
                                                                          H, KV, hd, pos0, scale);
  return cudaGetLastError();
}

cudaError_t launch_cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                 int64_t N, int64_t V, float dloss_scale, cudaStream_t s) {
  if (N == 0) return cudaSuccess;
  cross_entropy_kernel<<<static_cast<unsigned>(N), kCrossEntropyThreads, 0, s>>>(losses, dlogits, logits, targets, V,
                                                                                 dloss_scale);
  return cudaGetLastError();
}

cudaError_t launch_vocab_ce_max(float* mx, const float* logits, int64_t N, int64_t Vl, int64_t valid, cudaStream_t s) {
  if (N == 0) return cudaSuccess;
  if (N > kMaxRowBlocks) return cudaErrorInvalidConfiguration;
  vocab_ce_max_kernel<<<static_cast<unsigned>(N), kCrossEntropyThreads, 0, s>>>(mx, logits, Vl, valid);
  return cudaGetLastError();
}

cudaError_t launch_vocab_ce_sums(float* sumexp, float* tlogit, const float* logits, const int32_t* cols,
                                 const float* mx, int64_t N, int64_t Vl, int64_t valid, cudaStream_t s) {
  if (N == 0) return cudaSuccess;
  if (N > kMaxRowBlocks) return cudaErrorInvalidConfiguration;
  vocab_ce_sums_kernel<<<static_cast<unsigned>(N), kCrossEntropyThreads, 0, s>>>(sumexp, tlogit, logits, cols, mx, Vl,
                                                                                 valid);
  return cudaGetLastError();
}

cudaError_t launch_vocab_ce_finish(float* losses, float* dlogits, const float* logits, const int32_t* cols,
                                   const float* mx, const float* sumexp, const float* tlogit, int64_t N, int64_t Vl,
                                   int64_t valid, float dloss_scale, cudaStream_t s) {
  if (N == 0) return cudaSuccess;
  if (N > kMaxRowBlocks) return cudaErrorInvalidConfiguration;
  vocab_ce_finish_kernel<<<static_cast<unsigned>(N), kCrossEntropyThreads, 0, s>>>(
      losses, dlogits, logits, cols, mx, sumexp, tlogit, Vl, valid, dloss_scale);
  return cudaGetLastError();
}

cudaError_t launch_adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& a, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (packable(n, p, g, m, v))
    adamw_kernel<4><<<grid_for(n / 4), kThreads, 0, s>>>(p, g, m, v, n / 4, a);
  else
    adamw_kernel<1><<<grid_for(n), kThreads, 0, s>>>(p, g, m, v, n, a);
  return cudaGetLastError();
}

cudaError_t launch_sgd(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float weight_decay,
                       float grad_scale, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (packable(n, p, g, buf))
    sgd_kernel<4><<<grid_for(n / 4), kThreads, 0, s>>>(p, g, buf, n / 4, lr, momentum, weight_decay, grad_scale);
  else
    sgd_kernel<1><<<grid_for(n), kThreads, 0, s>>>(p, g, buf, n, lr, momentum, weight_decay, grad_scale);
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
