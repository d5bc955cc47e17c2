// flash_attention.cu — the fused attention kernels (ops/flash_attention.hpp; host side in
// flash_attention.cpp): the online softmax, O(T) memory, no atomics.
//
// One warp per row, lanes splitting the head's channels (channel c on lane c % 32, at most
// kMaxHeadDim / 32 per lane, held in registers; values and outputs have vd channels, flash_vd): a
// score is a warp-wide sum, so every lane holds the same bits of it and of the running max and sum.
// Forward: a warp per query row, over the keys it sees. Backward: D = rowsum(dO * O) per query row; dq per query row (recomputing each
// probability from lse); dk and dv per key row, over the query rows of its K/V head's group that
// see it, heads in order. Each output row has exactly one writer, so results do not depend on
// scheduling. These kernels run on the CUDA cores (no tensor cores, no shared-memory tiles): they
// are the correct, memory-lean baseline, not the fast one. The inputs (q, k, v, out, dout) are f32
// or bf16 (In), widened as they are read; every sum, lse, dq, dk and dv are f32. Grids: launches.hpp.
#include "src/backend/cuda/kernel_util.cuh"

namespace shardlab::cuda {
namespace {

constexpr int kPerLane = kMaxHeadDim / kWarp;

struct Row {
  float v[kPerLane];
};

__device__ inline float widen(float x) { return x; }
__device__ inline float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline void narrow(float* p, float x) { *p = x; }
__device__ inline void narrow(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }

template <class In>
__device__ inline Row load_row(const In* p, int64_t hd) {
  Row r;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t c = threadIdx.x % kWarp + i * kWarp;
    r.v[i] = c < hd ? widen(p[c]) : 0.f;
  }
  return r;
}

template <class Out>
__device__ inline void store_row(Out* p, const Row& r, int64_t hd, float mul, bool add = false) {
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t c = threadIdx.x % kWarp + i * kWarp;
    if (c < hd) narrow(p + c, add ? widen(p[c]) + r.v[i] * mul : r.v[i] * mul);
  }
}

// The warp's dot product of a (held per lane) and the row at p; every lane returns it.
template <class In>
__device__ inline float dot_row(const Row& a, const In* p, int64_t hd) {
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t c = threadIdx.x % kWarp + i * kWarp;
    if (c < hd) acc += a.v[i] * widen(p[c]);
  }
  return warp_allreduce(acc, SumOp{});
}

template <class In>
__device__ inline void axpy_row(Row& y, float a, const In* p, int64_t hd) {
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t c = threadIdx.x % kWarp + i * kWarp;
    if (c < hd) y.v[i] += a * widen(p[c]);
  }
}

// flash_vd on the device: the value (and output) head dimension.
__device__ inline int64_t value_dim(const FlashShape& s) { return s.vd > 0 ? s.vd : s.hd; }

// Keys [0, end) query row t sees.
__device__ inline int64_t keys_seen(const FlashShape& s, int64_t t) {
  if (!s.causal) return s.Tk;
  const int64_t end = t + s.offset + 1;
  return end < 0 ? 0 : (end < s.Tk ? end : s.Tk);
}

__device__ inline int64_t warp_row() { return blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp; }

// Row = (b, h, t) over B H Tq rows.
template <class In>
__global__ void flash_forward_kernel(In* out, float* lse, const In* q, const In* k, const In* v, FlashShape s) {
  const int64_t row = warp_row();
  if (row >= s.B * s.H * s.Tq) return;
  const int64_t t = row % s.Tq, bh = row / s.Tq, b = bh / s.H, h = bh % s.H, g = h / (s.H / s.KV);
  const int64_t vd = value_dim(s);
  const Row qr = load_row(q + b * s.q_b + t * s.q_ld + h * s.hd, s.hd);
  const In* K = k + b * s.k_b + g * s.hd;
  const In* V = v + b * s.v_b + g * vd;
  Row acc{};
  float m = -INFINITY, l = 0.f;
  const int64_t end = keys_seen(s, t);
  for (int64_t j = 0; j < end; ++j) {
    const float score = dot_row(qr, K + j * s.k_ld, s.hd) * s.scale;
    const float m_new = fmaxf(m, score);
    const float alpha = expf(m - m_new), p = expf(score - m_new);  // expf(-inf) = 0 on the first key
    l = l * alpha + p;
    m = m_new;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc.v[i] *= alpha;
    axpy_row(acc, p, V + j * s.v_ld, vd);
  }
  store_row(out + b * s.o_b + t * s.o_ld + h * vd, acc, vd, l > 0.f ? 1.f / l : 0.f);
  if (threadIdx.x % kWarp == 0) lse[bh * s.Tq + t] = l > 0.f ? m + logf(l) : -INFINITY;
}

// D (B, H, Tq) = rowsum(dO * O).
template <class In>
__global__ void flash_d_kernel(float* D, const In* dout, const In* out, FlashShape s) {
  const int64_t row = warp_row();
  if (row >= s.B * s.H * s.Tq) return;
  const int64_t t = row % s.Tq, bh = row / s.Tq, b = bh / s.H, h = bh % s.H;
  const int64_t vd = value_dim(s), at = b * s.o_b + t * s.o_ld + h * vd;
  const float d = dot_row(load_row(dout + at, vd), out + at, vd);
  if (threadIdx.x % kWarp == 0) D[row] = d;
}

// dq row (b, h, t) = scale sum_j p_tj (dO_t . v_j - D_t) k_j.
template <class In>
__global__ void flash_dq_kernel(float* dq, const In* dout, const In* q, const In* k, const In* v, const float* lse,
                                const float* D, FlashShape s) {
  const int64_t row = warp_row();
  if (row >= s.B * s.H * s.Tq) return;
  const int64_t t = row % s.Tq, bh = row / s.Tq, b = bh / s.H, h = bh % s.H, g = h / (s.H / s.KV);
  const int64_t vd = value_dim(s);
  const Row qr = load_row(q + b * s.q_b + t * s.q_ld + h * s.hd, s.hd);
  const Row dor = load_row(dout + b * s.o_b + t * s.o_ld + h * vd, vd);
  const In* K = k + b * s.k_b + g * s.hd;
  const In* V = v + b * s.v_b + g * vd;
  const float L = lse[row], Dt = D[row];
  Row acc{};
  const int64_t end = keys_seen(s, t);
  for (int64_t j = 0; j < end; ++j) {
    const float p = expf(dot_row(qr, K + j * s.k_ld, s.hd) * s.scale - L);
    const float ds = p * (dot_row(dor, V + j * s.v_ld, vd) - Dt);
    axpy_row(acc, ds, K + j * s.k_ld, s.hd);
  }
  store_row(dq + b * s.q_b + t * s.q_ld + h * s.hd, acc, s.hd, s.scale, s.accumulate);
}

// dk and dv rows (b, g, j): over the group's query heads in order, and the query rows that see key j.
template <class In>
__global__ void flash_dkv_kernel(float* dk, float* dv, const In* dout, const In* q, const In* k, const In* v,
                                 const float* lse, const float* D, FlashShape s) {
  const int64_t row = warp_row();
  if (row >= s.B * s.KV * s.Tk) return;
  const int64_t j = row % s.Tk, bg = row / s.Tk, b = bg / s.KV, g = bg % s.KV, group = s.H / s.KV;
  const int64_t vd = value_dim(s);
  const Row kr = load_row(k + b * s.k_b + j * s.k_ld + g * s.hd, s.hd);
  const Row vr = load_row(v + b * s.v_b + j * s.v_ld + g * vd, vd);
  const int64_t first = s.causal ? (j - s.offset > 0 ? j - s.offset : 0) : 0;
  Row dkr{}, dvr{};
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    const In* Q = q + b * s.q_b + h * s.hd;
    const In* dO = dout + b * s.o_b + h * vd;
    const float* L = lse + (b * s.H + h) * s.Tq;
    const float* Dh = D + (b * s.H + h) * s.Tq;
    for (int64_t t = first; t < s.Tq; ++t) {
      const float p = expf(dot_row(kr, Q + t * s.q_ld, s.hd) * s.scale - L[t]);
      axpy_row(dvr, p, dO + t * s.o_ld, vd);
      const float ds = p * (dot_row(vr, dO + t * s.o_ld, vd) - Dh[t]);
      axpy_row(dkr, ds * s.scale, Q + t * s.q_ld, s.hd);
    }
  }
  store_row(dk + b * s.k_b + j * s.k_ld + g * s.hd, dkr, s.hd, 1.f, s.accumulate);
  store_row(dv + b * s.v_b + j * s.v_ld + g * vd, dvr, vd, 1.f, s.accumulate);
}

// Context parallelism's merge (ops/flash_attention.hpp): a thread per query row, its channels in turn.
__global__ void flash_merge_kernel(float* out, float* lse, const float* part, const float* part_lse, FlashShape s) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (row >= s.B * s.H * s.Tq) return;
  const float lp = part_lse[row];
  if (lp == -INFINITY) return;
  const float l = lse[row], m = fmaxf(l, lp), w_old = expf(l - m), w_part = expf(lp - m), sum = w_old + w_part;
  const int64_t t = row % s.Tq, bh = row / s.Tq, b = bh / s.H, h = bh % s.H;
  const int64_t vd = value_dim(s);
  float* o = out + b * s.o_b + t * s.o_ld + h * vd;
  const float* p = part + b * s.o_b + t * s.o_ld + h * vd;
  const float a = w_old / sum, c = w_part / sum;
  for (int64_t k = 0; k < vd; ++k) o[k] = o[k] * a + p[k] * c;
  lse[row] = m + logf(sum);
}

}  // namespace

cudaError_t launch_flash_merge(float* out, float* lse, const float* part, const float* part_lse, const FlashShape& s,
                               cudaStream_t st) {
  const Launches L = flash_attention_merge_launches(s);
  if (L.count == 0) return cudaSuccess;
  const int64_t rows = s.B * s.H * s.Tq;
  if ((rows + kFlashMergeThreads - 1) / kFlashMergeThreads > 2147483647) return cudaErrorInvalidValue;
  flash_merge_kernel<<<L[0].x, kFlashMergeThreads, 0, st>>>(out, lse, part, part_lse, s);
  return cudaGetLastError();
}

namespace {

template <class In>
cudaError_t forward(void* out, float* lse, const void* q, const void* k, const void* v, const FlashShape& s,
                    const Launches& L, cudaStream_t st) {
  flash_forward_kernel<In><<<L[0].x, kThreads, 0, st>>>(static_cast<In*>(out), lse, static_cast<const In*>(q),
                                                          static_cast<const In*>(k), static_cast<const In*>(v), s);
  return cudaGetLastError();
}

template <class In>
cudaError_t backward(float* dq, float* dk, float* dv, float* D, const void* dout_, const void* q_, const void* k_,
                     const void* v_, const void* out_, const float* lse, const FlashShape& s, const Launches& L,
                     cudaStream_t st) {
  const In *dout = static_cast<const In*>(dout_), *q = static_cast<const In*>(q_), *k = static_cast<const In*>(k_);
  const In *v = static_cast<const In*>(v_), *out = static_cast<const In*>(out_);
  flash_d_kernel<In><<<L[0].x, kThreads, 0, st>>>(D, dout, out, s);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  flash_dq_kernel<In><<<L[1].x, kThreads, 0, st>>>(dq, dout, q, k, v, lse, D, s);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (L.count < 3) return cudaSuccess;  // no key rows
  flash_dkv_kernel<In><<<L[2].x, kThreads, 0, st>>>(dk, dv, dout, q, k, v, lse, D, s);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_flash_forward(void* out, float* lse, const void* q, const void* k, const void* v,
                                 const FlashShape& s, cudaStream_t st) {
  const Launches L = flash_attention_forward_launches(s);
  if (L.count == 0) return cudaSuccess;
  const int64_t rows = s.B * s.H * s.Tq;
  if (s.hd > kMaxHeadDim || flash_vd(s) > kMaxHeadDim || rows > int64_t{kRowsPerBlock} * 2147483647)
    return cudaErrorInvalidValue;
  return s.bf16 ? forward<__nv_bfloat16>(out, lse, q, k, v, s, L, st) : forward<float>(out, lse, q, k, v, s, L, st);
}

cudaError_t launch_flash_backward(float* dq, float* dk, float* dv, float* D, const void* dout, const void* q,
                                  const void* k, const void* v, const void* out, const float* lse,
                                  const FlashShape& s, cudaStream_t st) {
  const Launches L = flash_attention_backward_launches(s);
  if (L.count == 0) return cudaSuccess;
  const int64_t qrows = s.B * s.H * s.Tq, krows = s.B * s.KV * s.Tk;
  if (s.hd > kMaxHeadDim || flash_vd(s) > kMaxHeadDim || qrows > int64_t{kRowsPerBlock} * 2147483647 ||
      krows > int64_t{kRowsPerBlock} * 2147483647)
    return cudaErrorInvalidValue;
  return s.bf16 ? backward<__nv_bfloat16>(dq, dk, dv, D, dout, q, k, v, out, lse, s, L, st)
                : backward<float>(dq, dk, dv, D, dout, q, k, v, out, lse, s, L, st);
}

}  // namespace shardlab::cuda
