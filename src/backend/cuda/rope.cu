// rope.cu — the rotary position embedding kernel (ops/rope.hpp; host side in rope.cpp; grid in
// launches.hpp).
#include "src/backend/cuda/kernel_util.cuh"

namespace shardlab::cuda {
namespace {

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

}  // namespace

cudaError_t launch_rope(float* x, int64_t B, int64_t T, int64_t W, int64_t heads, int64_t half,
                        const RopeTable& freqs, int64_t pos0, bool inverse, cudaStream_t s) {
  const Launches L = rope_launches(heads, half, pos0, inverse, B, T, W);
  if (L.count == 0) return cudaSuccess;
  rope_kernel<<<L[0].x, kThreads, 0, s>>>(x, T, W, heads, half, freqs, pos0, inverse, B * T * heads * half);
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
