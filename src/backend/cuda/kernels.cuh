// kernels.cuh — launchers of the CUDA backend's kernels. Plain signatures, no fmt and no Tensor:
// this header is shared by nvcc (kernels.cu) and the host compiler (cuda_backend.cpp). Each
// launcher does its own grid math and returns the launch status for the caller's CUDA_CHECK.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "src/core/dtype.hpp"

namespace shardlab::cuda {

enum class ReduceKind : int { sum, sum_squares, max_abs };

// Blocks of per-block partial results a reduction needs in its workspace (doubles).
inline constexpr int kReduceBlocks = 512;

cudaError_t launch_fill(void* x, DType t, int64_t n, float value, cudaStream_t s);
cudaError_t launch_cast(const void* src, DType src_type, void* dst, DType dst_type, int64_t n, cudaStream_t s);
cudaError_t launch_axpy(float alpha, const float* x, float* y, int64_t n, cudaStream_t s);
cudaError_t launch_scale(float* x, float alpha, int64_t n, cudaStream_t s);
cudaError_t launch_add(const float* a, const float* b, float* out, int64_t n, cudaStream_t s);
cudaError_t launch_mul(const float* a, const float* b, float* out, int64_t n, cudaStream_t s);
// out[0] (+)= reduction of x; partial is a device workspace of kReduceBlocks doubles.
cudaError_t launch_reduce(const float* x, int64_t n, ReduceKind k, double* partial, float* out, bool accumulate,
                          cudaStream_t s);
// out[c] (+)= sum_r x[r, c]
cudaError_t launch_sum_rows(const float* x, int64_t rows, int64_t cols, float* out, bool accumulate, cudaStream_t s);

}  // namespace shardlab::cuda
