// kv_cache.cu — the KV cache kernels of decoding (ops/kv_cache.hpp; host side in kv_cache.cpp;
// grids in launches.hpp, whose C is H hd).
#include "src/backend/cuda/kernel_util.cuh"

namespace shardlab::cuda {
namespace {

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

}  // namespace

cudaError_t launch_kv_cache_write(float* k_cache, float* v_cache, const float* qkv, int64_t B, int64_t T, int64_t S,
                                  int64_t H, int64_t KV, int64_t hd, int64_t pos0, cudaStream_t s) {
  const Launches L = kv_cache_write_launches(H, KV, pos0, B, T, H * hd, S);
  if (L.count == 0) return cudaSuccess;
  kv_cache_write_kernel<<<L[0].x, kThreads, 0, s>>>(k_cache, v_cache, qkv, T, S, (H + 2 * KV) * hd, H * hd, KV * hd,
                                                     pos0, B * T * KV * hd);
  return cudaGetLastError();
}

cudaError_t launch_attention_cached(float* out, const float* qkv, const float* k_cache, const float* v_cache,
                                    float* scores, int64_t B, int64_t T, int64_t S, int64_t H, int64_t KV, int64_t hd,
                                    int64_t pos0, cudaStream_t s) {
  const Launches L = attention_cached_launches(H, KV, pos0, B, T, H * hd, S);
  if (L.count == 0) return cudaSuccess;
  const float scale = 1.f / sqrtf(static_cast<float>(hd));
  attention_cached_kernel<<<L[0].x, kThreads, 0, s>>>(out, qkv, k_cache, v_cache, scores, T, S, H, KV, hd, pos0,
                                                       scale);
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
