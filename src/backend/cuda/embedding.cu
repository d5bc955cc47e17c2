// embedding.cu — the embedding kernels (ops/embedding.hpp; host side in embedding.cpp).
// Mirrors src/backend/cpu/embedding.cpp formula for formula; the cross-row sums of the gradients
// run in an order fixed by the shapes alone.
#include "src/backend/cuda/kernel_util.cuh"

namespace shardlab::cuda {
namespace {

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

}  // namespace

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

}  // namespace shardlab::cuda
