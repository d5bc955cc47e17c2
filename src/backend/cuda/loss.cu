// loss.cu — the softmax cross-entropy kernels, whole and vocabulary-parallel (ops/loss.hpp;
// host side in loss.cpp; grids in launches.hpp): one block per row of logits.
#include "src/backend/cuda/kernel_util.cuh"

namespace shardlab::cuda {
namespace {

constexpr int kCrossEntropyThreads = 512;        // one block per row of V logits
constexpr int64_t kMaxRowBlocks = 2147483647;    // gridDim.x's limit, for one block per row

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
// D: f32, or bf16 (a separate buffer, the products' operand: each gradient rounded once).
template <class D>
__device__ void softmax_grad_row(D* d, const float* z, int64_t n, float mx, float inv, int64_t y, float scale) {
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float g = expf(z[j] - mx) * inv * scale;
    if (j == y) g -= scale;
    store_f32(d + j, g);
  }
}

// The whole row (and the target's logit) is read in the max and sum passes before any thread
// writes: dlogits may alias logits.
template <class D>
__global__ void cross_entropy_kernel(float* losses, D* dlogits, const float* logits, const int32_t* targets,
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

}  // namespace

// cross_entropy_launches, vocab_ce_sums_launches and vocab_ce_finish_launches start with the
// targets' upload (loss.cpp): their kernel is L[1].
cudaError_t launch_cross_entropy(float* losses, void* dlogits, DType dt, const float* logits, const int32_t* targets,
                                 int64_t N, int64_t V, float dloss_scale, cudaStream_t s) {
  const Launches L = cross_entropy_launches(N, V);
  if (L.count == 0) return cudaSuccess;
  if (dt == DType::bf16)
    cross_entropy_kernel<<<L[1].x, kCrossEntropyThreads, 0, s>>>(losses, static_cast<__nv_bfloat16*>(dlogits), logits,
                                                                 targets, V, dloss_scale);
  else
    cross_entropy_kernel<<<L[1].x, kCrossEntropyThreads, 0, s>>>(losses, static_cast<float*>(dlogits), logits,
                                                                 targets, V, dloss_scale);
  return cudaGetLastError();
}

cudaError_t launch_vocab_ce_max(float* mx, const float* logits, int64_t N, int64_t Vl, int64_t valid, cudaStream_t s) {
  const Launches L = vocab_ce_max_launches(N, Vl);
  if (L.count == 0) return cudaSuccess;
  if (N > kMaxRowBlocks) return cudaErrorInvalidConfiguration;
  vocab_ce_max_kernel<<<L[0].x, kCrossEntropyThreads, 0, s>>>(mx, logits, Vl, valid);
  return cudaGetLastError();
}

cudaError_t launch_vocab_ce_sums(float* sumexp, float* tlogit, const float* logits, const int32_t* cols,
                                 const float* mx, int64_t N, int64_t Vl, int64_t valid, cudaStream_t s) {
  const Launches L = vocab_ce_sums_launches(N, Vl);
  if (L.count == 0) return cudaSuccess;
  if (N > kMaxRowBlocks) return cudaErrorInvalidConfiguration;
  vocab_ce_sums_kernel<<<L[1].x, kCrossEntropyThreads, 0, s>>>(sumexp, tlogit, logits, cols, mx, Vl, valid);
  return cudaGetLastError();
}

cudaError_t launch_vocab_ce_finish(float* losses, float* dlogits, const float* logits, const int32_t* cols,
                                   const float* mx, const float* sumexp, const float* tlogit, int64_t N, int64_t Vl,
                                   int64_t valid, float dloss_scale, cudaStream_t s) {
  const Launches L = vocab_ce_finish_launches(N, Vl);
  if (L.count == 0) return cudaSuccess;
  if (N > kMaxRowBlocks) return cudaErrorInvalidConfiguration;
  vocab_ce_finish_kernel<<<L[1].x, kCrossEntropyThreads, 0, s>>>(losses, dlogits, logits, cols, mx, sumexp, tlogit,
                                                                   Vl, valid, dloss_scale);
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
