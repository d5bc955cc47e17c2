// cuda_elementwise.cpp — the CUDA Backend's element-wise operations and reductions: tensors
// validated here, grids in launches.hpp (read by the launchers, kernels.cuh).
#include <cmath>

#include "src/backend/cuda/cuda_backend.hpp"

namespace shardlab::cuda {
namespace {

void check_pair(const Tensor& a, const Tensor& b, const char* op) {
  check_f32(a, op);
  check_f32(b, op);
  check_same_numel(a, b, op);
}

void check_binary(const Tensor& a, const Tensor& b, const Tensor& out, const char* name) {
  check_pair(a, b, name);
  check_pair(a, out, name);
}

}  // namespace

// ---- element-wise -------------------------------------------------------------------------------

void CudaBackend::fill(Tensor x, float value) {
  int64_t n = x.numel();
  CUDA_CHECK(launch_fill(x.data(), x.dtype(), n, value, compute_));
}

void CudaBackend::cast(Tensor dst, Tensor src) {
  check_same_numel(src, dst, "cast");
  int64_t n = src.numel();
  CUDA_CHECK(launch_cast(src.data(), src.dtype(), dst.data(), dst.dtype(), n, compute_));
}

void CudaBackend::cast_ranges(Tensor dst, Tensor src, std::span<const ElemRange> ranges) {
  check_cast_ranges(dst, src, ranges);
  constexpr size_t kPerCall = 8 * cuda::kCastRanges;  // what one Launches list holds
  for (size_t first = 0; first < ranges.size(); first += kPerCall)
    CUDA_CHECK(launch_cast_ranges(src.data(), src.dtype(), dst.data(), dst.dtype(),
                                  ranges.subspan(first, std::min(kPerCall, ranges.size() - first)), compute_));
}

void CudaBackend::axpy(float alpha, Tensor x, Tensor y) {
  check_pair(x, y, "axpy");
  int64_t n = x.numel();
  CUDA_CHECK(launch_axpy(alpha, x.ptr<float>(), y.ptr<float>(), n, compute_));
}

void CudaBackend::scale(Tensor x, float alpha) {
  check_f32(x, "scale");
  int64_t n = x.numel();
  CUDA_CHECK(launch_scale(x.ptr<float>(), alpha, n, compute_));
}

void CudaBackend::add(Tensor a, Tensor b, Tensor out) {
  check_binary(a, b, out, "add");
  CUDA_CHECK(launch_add(a.ptr<float>(), b.ptr<float>(), out.ptr<float>(), a.numel(), compute_));
}

void CudaBackend::add_into(Tensor dst, Tensor src) {
  check_add_into(dst, src);
  CUDA_CHECK(launch_add_into(dst.data(), dst.dtype(), src.data(), src.dtype(), dst.numel(), compute_));
}

void CudaBackend::mul(Tensor a, Tensor b, Tensor out) {
  check_binary(a, b, out, "mul");
  CUDA_CHECK(launch_mul(a.ptr<float>(), b.ptr<float>(), out.ptr<float>(), a.numel(), compute_));
}

void CudaBackend::add_bias(Tensor x, Tensor bias) {
  CUDA_CHECK(launch_add_bias(x.ptr<float>(), bias.ptr<float>(), bias_rows(x, bias), bias.numel(), compute_));
}

// ---- reductions ---------------------------------------------------------------------------------

void CudaBackend::reduce(Tensor x, Tensor out, bool accumulate, ReduceKind k, const char* name) {
  SHARD_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, "{}: f32 or bf16 input, got {}", name,
              dtype_name(x.dtype()));
  check_f32(out, name);
  SHARD_CHECK(out.numel() == 1, "{}: out must hold 1 element, has {}", name, out.numel());
  CUDA_CHECK(launch_reduce(x.data(), x.dtype(), x.numel(), k, partial_, out.ptr<float>(), accumulate, compute_));
}

void CudaBackend::sum(Tensor x, Tensor out, bool accumulate) { reduce(x, out, accumulate, ReduceKind::sum, "sum"); }

void CudaBackend::sum_squares(Tensor x, Tensor out, bool accumulate) {
  reduce(x, out, accumulate, ReduceKind::sum_squares, "sum_squares");
}

void CudaBackend::max_abs(Tensor x, Tensor out, bool accumulate) {
  reduce(x, out, accumulate, ReduceKind::max_abs, "max_abs");
}

void CudaBackend::sum_rows(Tensor x, Tensor out, bool accumulate) {
  check_sum_rows(x, out);
  const int64_t rows = x.dim(0), cols = x.dim(1);
  auto* partial = static_cast<double*>(
      device_scratch(static_cast<size_t>(cuda::sum_rows_chunks(rows, cols) * std::max<int64_t>(cols, 1)) * sizeof(double)));
  CUDA_CHECK(launch_sum_rows(x.data(), x.dtype(), rows, cols, partial, arrival_counters(cuda::sum_rows_tiles(cols)),
                             out.ptr<float>(), accumulate, compute_));
}

}  // namespace shardlab::cuda
