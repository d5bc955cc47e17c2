// cuda_check.hpp — CUDA_CHECK and CUBLAS_CHECK: the CUDA members of the SHARD_CHECK family; they
// report the failed call, file:line, rank and device through the same reporter.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "src/core/check.hpp"

#define CUDA_CHECK(call)                                                                              \
  do {                                                                                                \
    cudaError_t err_ = (call);                                                                        \
    if (err_ != cudaSuccess) [[unlikely]]                                                             \
      ::shardlab::check_failed(#call, __FILE__, __LINE__,                                             \
                               ::fmt::format("CUDA error {} ({})", cudaGetErrorName(err_), cudaGetErrorString(err_))); \
  } while (0)

#define CUBLAS_CHECK(call)                                                                            \
  do {                                                                                                \
    cublasStatus_t st_ = (call);                                                                      \
    if (st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                                    \
      ::shardlab::check_failed(#call, __FILE__, __LINE__,                                             \
                               ::fmt::format("cuBLAS status {} ({})", static_cast<int>(st_), cublasGetStatusString(st_))); \
  } while (0)
