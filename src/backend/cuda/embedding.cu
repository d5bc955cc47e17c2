// embedding.cu — the embedding kernels (ops/embedding.hpp; host side in embedding.cpp; grids in
// launches.hpp).
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

// The shard's forward issues the same list (embedding_forward_shard_launches).
cudaError_t launch_embedding_forward(float* out, const int32_t* rows, const float* wte, const float* wpe, int64_t B,
                                     int64_t T, int64_t C, cudaStream_t s) {
  const int64_t n = B * T * C;
  const bool aligned = aligned16(out, wte, wpe);
  const Launches L = embedding_forward_launches(B, T, C, aligned);  // [ids' upload (embedding.cpp), kernel]
  if (L.count < 2) return cudaSuccess;
  if (packable(C, aligned))
    embedding_forward_kernel<4><<<L[1].x, kThreads, 0, s>>>(out, rows, wte, wpe, T, C, n / 4);
  else
    embedding_forward_kernel<1><<<L[1].x, kThreads, 0, s>>>(out, rows, wte, wpe, T, C, n);
  return cudaGetLastError();
}

// embedding_backward_launches: [dwpe kernel], the grouped positions' upload (embedding.cpp), [dwte kernel].
cudaError_t launch_embedding_backward_dwpe(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C,
                                           int64_t buckets, cudaStream_t s) {
  const Launches L = embedding_backward_launches(B, T, C, true, buckets);
  if (L[0].kind != LaunchKind::kernel) return cudaSuccess;
  embedding_backward_dwpe_kernel<<<L[0].x, kThreads, 0, s>>>(dwpe, dout, B, T, C);
  return cudaGetLastError();
}

cudaError_t launch_embedding_backward_dwte(float* dwte, const float* dout, const int32_t* bucket_token,
                                           const int32_t* offsets, const int32_t* positions, int64_t B, int64_t T,
                                           int64_t C, bool dwpe, int64_t buckets, cudaStream_t s) {
  const Launches L = embedding_backward_launches(B, T, C, dwpe, buckets);
  const Launch& last = L[L.count - 1];
  if (last.kind != LaunchKind::kernel) return cudaSuccess;
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, (C + kWarp - 1) / kWarp * kWarp));
  embedding_backward_dwte_kernel<<<last.x, threads, 0, s>>>(dwte, dout, bucket_token, offsets, positions, C);
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
