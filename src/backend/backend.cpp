#include "src/backend/backend.hpp"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace shardlab {

std::unique_ptr<Backend> make_backend(Device device, const BackendConfig& cfg) {
  return device == Device::cpu ? make_cpu_backend(cfg) : make_cuda_backend(cfg);
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu;
  if (s == "cuda" || s == "gpu") return Device::cuda;
  throw InputError(fmt::format("unknown device '{}': expected cpu or cuda", s));
}

int default_cpu_threads(int local_ranks) {
  cpu_set_t set;
  int cores = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, local_ranks));
}

void check_same_numel(const Tensor& a, const Tensor& b, const char* op) {
  SHARD_CHECK(a.numel() == b.numel(), "{}: element counts differ: {} {} vs {} {}", op, a.numel(), a.shape_str(),
              b.numel(), b.shape_str());
}

void check_f32(const Tensor& t, const char* op) {
  SHARD_CHECK(t.dtype() == DType::f32, "{}: expects f32, got {} tensor {}", op, dtype_name(t.dtype()), t.shape_str());
}

int64_t bias_rows(const Tensor& x, const Tensor& bias) {
  const int64_t OC = bias.numel();
  SHARD_CHECK(OC > 0 && x.numel() % OC == 0, "add_bias: x {} bias {}", x.shape_str(), bias.shape_str());
  return x.numel() / OC;
}

void check_gemm(const GemmDesc& d) {
  SHARD_CHECK(d.m >= 0 && d.n >= 0 && d.k >= 0 && d.batch >= 1, "gemm: m={} n={} k={} batch={}", d.m, d.n, d.k,
              d.batch);
  int64_t a_cols = d.trans_a == Trans::N ? d.k : d.m;
  int64_t b_cols = d.trans_b == Trans::N ? d.n : d.k;
  SHARD_CHECK(d.lda >= std::max<int64_t>(1, a_cols), "gemm: lda={} < {} columns of A", d.lda, a_cols);
  SHARD_CHECK(d.ldb >= std::max<int64_t>(1, b_cols), "gemm: ldb={} < {} columns of B", d.ldb, b_cols);
  SHARD_CHECK(d.ldc >= std::max<int64_t>(1, d.n), "gemm: ldc={} < n={}", d.ldc, d.n);
}

bool low_precision_product(const GemmDesc& d) {
  const auto as_read = [&](DType t) { return t == DType::f32 ? d.round_inputs_to : t; };
  return as_read(d.a_type) != DType::f32 && as_read(d.b_type) != DType::f32;
}

void check_add_into(const Tensor& dst, const Tensor& src) {
  check_same_numel(dst, src, "add_into");
  for (const Tensor* t : {&dst, &src})
    SHARD_CHECK(t->dtype() == DType::f32 || t->dtype() == DType::bf16, "add_into: f32 or bf16 expected, got {}",
                dtype_name(t->dtype()));
}

void check_sum_rows(const Tensor& x, const Tensor& out) {
  SHARD_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, "sum_rows: f32 or bf16 x, got {}",
              dtype_name(x.dtype()));
  check_f32(out, "sum_rows");
  SHARD_CHECK(x.ndim() == 2 && out.numel() == x.dim(1), "sum_rows: x {} and out {}", x.shape_str(), out.shape_str());
}

const char* gemm_epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::bias: return "bias";
    case GemmEpilogue::bias_gelu: return "bias_gelu";
    case GemmEpilogue::dgelu: return "dgelu";
    case GemmEpilogue::bias_grad: return "bias_grad";
  }
  return "?";
}

void check_cast_ranges(const Tensor& dst, const Tensor& src, std::span<const ElemRange> ranges) {
  check_same_numel(src, dst, "cast_ranges");
  for (const ElemRange& r : ranges)
    SHARD_CHECK(r.offset >= 0 && r.count >= 0 && r.offset + r.count <= src.numel(),
                "cast_ranges: elements [{}, {}) of a buffer of {}", r.offset, r.offset + r.count, src.numel());
}

void check_gemm_epilogue(const GemmDesc& d, GemmEpilogue e, const float* bias, const void* aux) {
  check_gemm(d);
  const bool sums = e == GemmEpilogue::bias || e == GemmEpilogue::bias_grad;
  SHARD_CHECK(d.batch == 1 && d.alpha == 1.f && (d.beta == 0.f || (d.beta == 1.f && sums)) &&
                  (d.c_type == DType::f32 || d.c_type == DType::bf16) && d.ldc == d.n,
              "gemm with a {} epilogue: one product into a whole f32 or bf16 C, summed into it (beta 1) only with a "
              "bias or its gradient (batch {} alpha {} beta {} C {} ldc {} n {})",
              gemm_epilogue_name(e), d.batch, d.alpha, d.beta, dtype_name(d.c_type), d.ldc, d.n);
  SHARD_CHECK((bias != nullptr) == (e != GemmEpilogue::dgelu) && (aux != nullptr) == !sums,
              "gemm with a {} epilogue: bias {} and aux {} given", gemm_epilogue_name(e), bias != nullptr,
              aux != nullptr);
  SHARD_CHECK(e != GemmEpilogue::bias_grad || d.trans_b == Trans::N,
              "gemm with a bias gradient: B (k, n) untransposed, its sums over k the gradient");
}

}  // namespace shardlab
