// mla.cu — the latent attention kernels (ops/mla.hpp; host side in mla.cpp; grids in launches.hpp).
//
// Forward: a thread per element of qkv, reading its source (and, on a rope channel, the channel it
// pairs with): each element written by its own thread. Backward: a thread per element of dq and
// dkv (rope channels of dq rotated back), then a thread per pair of the shared rotary key, summing
// its heads' gradients in order and rotating the sum back (the CPU's order). Angles, cos and sin in
// f32 as rope.cu's.
#include "src/backend/cuda/kernel_util.cuh"

namespace shardlab::cuda {
namespace {

// Channel c of a rope part rotated by position pos: its pair's partner read from src, sign < 0 the
// inverse rotation.
__device__ inline float rotated(const float* src, int64_t c, int64_t half, bool interleave, const RopeTable& f,
                                float pos, float sign) {
  const int64_t i = interleave ? c / 2 : c % half;
  const bool first = interleave ? c % 2 == 0 : c < half;
  const int64_t a = interleave ? 2 * i : i, b = interleave ? 2 * i + 1 : i + half;
  const float angle = pos * f.inv_freq[i];
  const float cs = cosf(angle), sn = sign * sinf(angle);
  return first ? src[a] * cs - src[b] * sn : src[b] * cs + src[a] * sn;
}

__global__ void mla_qkv_forward_kernel(float* qkv, const float* q, const float* kv, const float* kva, MlaHeads m,
                                       RopeTable f, int64_t pos0, int64_t T, int64_t n) {
  const int64_t H = m.heads, qk = m.nope + m.rope, W = H * (2 * qk + m.v), kvw = m.nope + m.v, half = m.rope / 2;
  GRID_STRIDE_LOOP(idx, n) {
    const int64_t row = idx / W, col = idx % W;
    const float pos = static_cast<float>(pos0 + row % T);
    float out;
    if (col < 2 * H * qk) {  // a query or key head
      const bool key = col >= H * qk;
      const int64_t h = (col % (H * qk)) / qk, c = col % qk;
      if (c < m.nope) {
        out = key ? kv[row * H * kvw + h * kvw + c] : q[row * H * qk + h * qk + c];
      } else {
        const float* src = key ? kva + row * (m.kv_rank + m.rope) + m.kv_rank : q + row * H * qk + h * qk + m.nope;
        out = rotated(src, c - m.nope, half, m.interleave, f, pos, 1.f);
      }
    } else {  // a value head
      const int64_t h = (col - 2 * H * qk) / m.v, c = (col - 2 * H * qk) % m.v;
      out = kv[row * H * kvw + h * kvw + m.nope + c];
    }
    qkv[idx] = out;
  }
}

// Elements of dq (row, H qk) then of dkv (row, H (nope + v)), row by row.
__global__ void mla_qkv_backward_kernel(float* dq, float* dkv, const float* dqkv, MlaHeads m, RopeTable f,
                                        int64_t pos0, int64_t T, int64_t n) {
  const int64_t H = m.heads, qk = m.nope + m.rope, W = H * (2 * qk + m.v), kvw = m.nope + m.v, half = m.rope / 2;
  const int64_t per = H * qk + H * kvw;
  GRID_STRIDE_LOOP(idx, n) {
    const int64_t row = idx / per, col = idx % per;
    const float* r = dqkv + row * W;
    if (col < H * qk) {
      const int64_t h = col / qk, c = col % qk;
      dq[row * H * qk + col] = c < m.nope ? r[col]
                                          : rotated(r + h * qk + m.nope, c - m.nope, half, m.interleave, f,
                                                    static_cast<float>(pos0 + row % T), -1.f);
    } else {
      const int64_t j = col - H * qk, h = j / kvw, c = j % kvw;
      dkv[row * H * kvw + j] = c < m.nope ? r[H * qk + h * qk + c] : r[2 * H * qk + h * m.v + c - m.nope];
    }
  }
}

// Pair i of row `row`'s shared rotary key: both channels' sums over heads, rotated back.
__global__ void mla_k_rope_backward_kernel(float* dkva, const float* dqkv, MlaHeads m, RopeTable f, int64_t pos0,
                                           int64_t T, int64_t n) {
  const int64_t H = m.heads, qk = m.nope + m.rope, W = H * (2 * qk + m.v), half = m.rope / 2;
  GRID_STRIDE_LOOP(idx, n) {
    const int64_t row = idx / half, i = idx % half;
    const int64_t a = m.interleave ? 2 * i : i, b = m.interleave ? 2 * i + 1 : i + half;
    const float* k = dqkv + row * W + H * qk + m.nope;
    float sa = 0.f, sb = 0.f;
    for (int64_t h = 0; h < H; ++h) sa += k[h * qk + a], sb += k[h * qk + b];
    const float angle = static_cast<float>(pos0 + row % T) * f.inv_freq[i];
    const float cs = cosf(angle), sn = -sinf(angle);
    float* out = dkva + row * (m.kv_rank + m.rope) + m.kv_rank;
    out[a] = sa * cs - sb * sn;
    out[b] = sb * cs + sa * sn;
  }
}

}  // namespace

cudaError_t launch_mla_qkv_forward(float* qkv, const float* q, const float* kv, const float* kva, const MlaHeads& m,
                                   const RopeTable& freqs, int64_t pos0, int64_t B, int64_t T, cudaStream_t s) {
  const Launches L = mla_qkv_forward_launches(m, B, T);
  if (L.count == 0) return cudaSuccess;
  mla_qkv_forward_kernel<<<L[0].x, kThreads, 0, s>>>(qkv, q, kv, kva, m, freqs, pos0, T, B * T * m.width());
  return cudaGetLastError();
}

cudaError_t launch_mla_qkv_backward(float* dq, float* dkv, float* dkva, const float* dqkv, const MlaHeads& m,
                                    const RopeTable& freqs, int64_t pos0, int64_t B, int64_t T, cudaStream_t s) {
  const Launches L = mla_qkv_backward_launches(m, B, T);
  if (L.count == 0) return cudaSuccess;
  mla_qkv_backward_kernel<<<L[0].x, kThreads, 0, s>>>(dq, dkv, dqkv, m, freqs, pos0, T,
                                                      B * T * m.heads * (m.qk() + m.nope + m.v));
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  mla_k_rope_backward_kernel<<<L[1].x, kThreads, 0, s>>>(dkva, dqkv, m, freqs, pos0, T, B * T * (m.rope / 2));
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
