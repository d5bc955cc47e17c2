// elementwise.cu — the CUDA backend's element-wise kernels and reductions (cuda_elementwise.cpp
// launches them; their grids: launches.hpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "src/backend/cuda/kernel_util.cuh"

namespace shardlab::cuda {
namespace {

__global__ void fill_kernel(void* x, DType t, int64_t n, float v) {
  GRID_STRIDE_LOOP(i, n) store_from_f32(x, t, i, v);
}

__global__ void cast_kernel(const void* src, DType st, void* dst, DType dt, int64_t n) {
  GRID_STRIDE_LOOP(i, n) store_from_f32(dst, dt, i, load_as_f32(src, st, i));
}

// Up to kCastRanges ranges, passed by value: range r's elements are [ends[r - 1], ends[r]) of the
// grid's n = ends[count - 1] and sit at offsets[r] on.
struct CastRangeList {
  int count;
  int64_t offsets[kCastRanges], ends[kCastRanges];
};

__global__ void cast_ranges_kernel(const void* src, DType st, void* dst, DType dt, CastRangeList list) {
  const int64_t n = list.ends[list.count - 1];
  GRID_STRIDE_LOOP(i, n) {
    int r = 0;
    while (i >= list.ends[r]) ++r;
    const int64_t at = list.offsets[r] + i - (r == 0 ? 0 : list.ends[r - 1]);
    store_from_f32(dst, dt, at, load_as_f32(src, st, at));
  }
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

// The cast kernel's conversions either side of one f32 sum.
__global__ void add_into_kernel(void* dst, DType dt, const void* src, DType st, int64_t n) {
  GRID_STRIDE_LOOP(i, n) store_from_f32(dst, dt, i, load_as_f32(dst, dt, i) + load_as_f32(src, st, i));
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

// x f32 or bf16 (widened as read: the same sums as of a widened copy).
template <class T>
__global__ void reduce_partial_kernel(const T* x, int64_t n, ReduceKind k, double* partial) {
  double acc = 0.0;
  GRID_STRIDE_LOOP(i, n) acc = reduce_combine(k, acc, reduce_map(k, to_f32(x[i])));
  double r = block_reduce(k, acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = r;
}

__global__ void reduce_final_kernel(const double* partial, int count, ReduceKind k, float* out, bool accumulate) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc = reduce_combine(k, acc, partial[i]);
  double r = block_reduce(k, acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(accumulate ? reduce_combine(k, out[0], r) : r);
}

// Block (tile, chunk) of kWarp x kRowsPerBlock threads: thread (tx, ty) sums column tile kWarp + tx
// over rows ty, ty + kRowsPerBlock, ... of the chunk (a warp reads kWarp adjacent floats), then the
// block's rows of partial sums are added in order.
// x f32 or bf16 (widened as read). Both stages in one launch: the last of a tile's blocks to
// finish (an arrival counter per tile, zero before and reset after) folds that tile's partials in
// chunk order, so the result does not depend on which block came last.
template <class T>
__global__ void sum_rows_kernel(const T* x, int64_t rows, int64_t cols, int64_t chunk_rows, double* partial,
                                unsigned* arrivals, float* out, bool accumulate) {
  __shared__ double part[kRowsPerBlock][kWarp + 1];
  __shared__ bool last;
  const int64_t c = blockIdx.x * (int64_t)kWarp + threadIdx.x;
  const int64_t r0 = blockIdx.y * chunk_rows, r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  double acc = 0.0;
  if (c < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowsPerBlock) acc += to_f32(x[r * cols + c]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    double sum = 0.0;
    for (int k = 0; k < kRowsPerBlock; ++k) sum += part[k][threadIdx.x];
    partial[blockIdx.y * cols + c] = sum;
    __threadfence();  // the partial is visible before this block is counted
  }
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) last = atomicAdd(arrivals + blockIdx.x, 1u) == gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // every other block's partial, counted before, is read after
  if (threadIdx.y == 0 && c < cols) {
    double sum = 0.0;
    for (int64_t k = 0; k < gridDim.y; ++k) sum += reinterpret_cast<volatile double*>(partial)[k * cols + c];
    out[c] = static_cast<float>((accumulate ? out[c] : 0.0) + sum);
  }
  if (threadIdx.x == 0 && threadIdx.y == 0) arrivals[blockIdx.x] = 0;  // ready for the next call
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

}  // namespace

cudaError_t launch_fill(void* x, DType t, int64_t n, float value, cudaStream_t s) {
  fill_kernel<<<fill_launches(n)[0].x, kThreads, 0, s>>>(x, t, n, value);
  return cudaGetLastError();
}

cudaError_t launch_cast(const void* src, DType src_type, void* dst, DType dst_type, int64_t n, cudaStream_t s) {
  cast_kernel<<<cast_launches(n)[0].x, kThreads, 0, s>>>(src, src_type, dst, dst_type, n);
  return cudaGetLastError();
}

cudaError_t launch_cast_ranges(const void* src, DType src_type, void* dst, DType dst_type,
                               std::span<const ElemRange> ranges, cudaStream_t s) {
  const Launches L = cast_ranges_launches(ranges);
  int launch = 0;
  for (size_t first = 0; first < ranges.size(); first += kCastRanges) {
    CastRangeList list{};
    int64_t n = 0;
    for (size_t i = first; i < std::min(ranges.size(), first + kCastRanges); ++i) {
      if (ranges[i].count == 0) continue;
      n += ranges[i].count;
      list.offsets[list.count] = ranges[i].offset;
      list.ends[list.count++] = n;
    }
    if (n == 0) continue;  // none launched for it (cast_ranges_launches)
    cast_ranges_kernel<<<L[launch++].x, kThreads, 0, s>>>(src, src_type, dst, dst_type, list);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t launch_axpy(float alpha, const float* x, float* y, int64_t n, cudaStream_t s) {
  axpy_kernel<<<axpy_launches(n)[0].x, kThreads, 0, s>>>(alpha, x, y, n);
  return cudaGetLastError();
}

cudaError_t launch_scale(float* x, float alpha, int64_t n, cudaStream_t s) {
  scale_kernel<<<scale_launches(n)[0].x, kThreads, 0, s>>>(x, alpha, n);
  return cudaGetLastError();
}

cudaError_t launch_add(const float* a, const float* b, float* out, int64_t n, cudaStream_t s) {
  add_kernel<<<add_launches(n)[0].x, kThreads, 0, s>>>(a, b, out, n);
  return cudaGetLastError();
}

cudaError_t launch_add_into(void* dst, DType dst_type, const void* src, DType src_type, int64_t n, cudaStream_t s) {
  add_into_kernel<<<add_into_launches(n)[0].x, kThreads, 0, s>>>(dst, dst_type, src, src_type, n);
  return cudaGetLastError();
}

cudaError_t launch_mul(const float* a, const float* b, float* out, int64_t n, cudaStream_t s) {
  mul_kernel<<<mul_launches(n)[0].x, kThreads, 0, s>>>(a, b, out, n);
  return cudaGetLastError();
}

cudaError_t launch_reduce(const void* x, DType xt, int64_t n, ReduceKind k, double* partial, float* out,
                          bool accumulate, cudaStream_t s) {
  const Launches L = reduce_launches(n);
  if (xt == DType::bf16)
    reduce_partial_kernel<<<L[0].x, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(x), n, k, partial);
  else
    reduce_partial_kernel<<<L[0].x, kThreads, 0, s>>>(static_cast<const float*>(x), n, k, partial);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  reduce_final_kernel<<<L[1].x, kThreads, 0, s>>>(partial, static_cast<int>(L[0].x), k, out, accumulate);
  return cudaGetLastError();
}

cudaError_t launch_sum_rows(const void* x, DType xt, int64_t rows, int64_t cols, double* partial, unsigned* arrivals,
                            float* out, bool accumulate, cudaStream_t s) {
  const Launches L = sum_rows_launches(rows, cols);
  const dim3 grid(L[0].x, L[0].y), block(kWarp, kRowsPerBlock);
  const int64_t chunk = sum_rows_chunk_rows(rows, cols);
  if (xt == DType::bf16)
    sum_rows_kernel<<<grid, block, 0, s>>>(static_cast<const __nv_bfloat16*>(x), rows, cols, chunk, partial, arrivals,
                                           out, accumulate);
  else
    sum_rows_kernel<<<grid, block, 0, s>>>(static_cast<const float*>(x), rows, cols, chunk, partial, arrivals, out,
                                           accumulate);
  return cudaGetLastError();
}

cudaError_t launch_add_bias(float* x, const float* bias, int64_t N, int64_t OC, cudaStream_t s) {
  const int64_t n = N * OC;
  const bool aligned = aligned16(x, bias);
  const Launches L = add_bias_launches(N, OC, aligned);
  if (L.count == 0) return cudaSuccess;
  if (packable(OC, aligned))
    add_bias_kernel<4><<<L[0].x, kThreads, 0, s>>>(x, bias, OC, n / 4);
  else
    add_bias_kernel<1><<<L[0].x, kThreads, 0, s>>>(x, bias, OC, n);
  return cudaGetLastError();
}

}  // namespace shardlab::cuda
