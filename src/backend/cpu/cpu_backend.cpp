// cpu_backend.cpp — the CPU Backend: oneDNN's or OpenBLAS's sgemm for matrix products (gemm.hpp
// picks per shape), OpenMP loops for the element-wise primitives and reductions. The operation
// families' kernels are in cpu/<family>.cpp (kernels.hpp).
//
// One rank is one process; its thread count (cores / ranks on the node by default) is set once
// for OpenMP, which the Debian builds of oneDNN and of OpenBLAS (openmp flavour) also use, so GEMMs
// and element-wise loops share one pool.
// Everything is synchronous: an event is complete when recorded, and streams need no ordering.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "src/backend/backend.hpp"
#include "src/backend/block_cache.hpp"
#include "src/backend/cpu/gemm.hpp"
#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cpu/tile_product.hpp"

namespace shardlab {

// x (N, OC) += bias on every row (kernels.hpp).
namespace cpu {
void add_bias(float* x, const float* bias, int64_t N, int64_t OC) {
#pragma omp parallel for schedule(static) if (N * OC > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    float* row = x + i * OC;
#pragma omp simd
    for (int64_t c = 0; c < OC; ++c) row[c] += bias[c];
  }
}
}  // namespace cpu

namespace {

using cpu::kParallelMin;

class CpuEvent final : public Event {
 public:
  bool done() const override { return true; }
  void synchronize() override {}
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendConfig& cfg)
      : threads_(cfg.threads > 0 ? cfg.threads : default_cpu_threads(cfg.local_ranks)),
        policy_(cpu::parse_gemm_policy(cfg.cpu_gemm)) {
    omp_set_num_threads(threads_);
    cpu::set_gemm_policy(policy_);
    // oneDNN's profiler hooks (ITT) cost about 2% of a step and serve only VTune; off unless asked for.
    setenv("DNNL_ITT_TASK_LEVEL", "0", /*overwrite=*/0);
  }

  Device device() const override { return Device::cpu; }
  std::string describe() const override {
    const char* gemm = policy_ == cpu::GemmPolicy::automatic ? "oneDNN/OpenBLAS sgemm by shape"
                       : policy_ == cpu::GemmPolicy::onednn  ? "oneDNN sgemm"
                                                             : "OpenBLAS sgemm";
    return fmt::format("cpu ({}, {}, attention tiles {}, {} threads)", gemm, cpu::gemm_isa_describe(),
                       cpu::tile_product_isa(), threads_);
  }
  int threads() const override { return threads_; }

  ~CpuBackend() override {
    cache_.release_all([](void* p) { std::free(p); });
  }

  // Freed blocks are kept by size (at most 1 GiB of them) and handed out again (block_cache.hpp).
  void* raw_alloc(size_t bytes) override {
    const size_t rounded = cache_.round(bytes);
    if (void* p = cache_.take(rounded)) return p;
    void* p = std::aligned_alloc(64, rounded);
    SHARD_CHECK(p != nullptr, "host allocation of {} bytes failed", bytes);
    return p;
  }
  void raw_free(void* p, size_t bytes) override {
    if (!cache_.keep(p, cache_.round(bytes))) std::free(p);
  }

  void copy(Tensor dst, Tensor src) override {
    check_same_numel(dst, src, "copy");
    SHARD_CHECK(dst.dtype() == src.dtype(), "copy: dtypes differ ({} <- {}); use cast", dtype_name(dst.dtype()),
                dtype_name(src.dtype()));
    SHARD_CHECK(dst.device() == Device::cpu && src.device() == Device::cpu, "cpu backend copy of a {} tensor",
                device_name(dst.device() == Device::cpu ? src.device() : dst.device()));
    if (dst.data() != src.data()) std::memmove(dst.data(), src.data(), src.bytes());
  }

  std::unique_ptr<Event> record(StreamKind) override { return std::make_unique<CpuEvent>(); }
  void wait(StreamKind, const Event&) override {}
  void synchronize() override {}

  void gemm(const GemmDesc& d, const void* a, const void* b, void* c) override {
    check_gemm(d);
    SHARD_CHECK(d.a_type == DType::f32 && d.b_type == DType::f32 && d.c_type == DType::f32,
                "cpu gemm computes f32 only (A {}, B {}, C {})", dtype_name(d.a_type), dtype_name(d.b_type),
                dtype_name(d.c_type));
    const float* A = static_cast<const float*>(a);
    const float* B = static_cast<const float*>(b);
    float* C = static_cast<float*>(c);
    for (int64_t i = 0; i < d.batch; ++i)
      cpu::sgemm(d.trans_a, d.trans_b, d.m, d.n, d.k, d.alpha, A + i * d.stride_a, d.lda, B + i * d.stride_b, d.ldb,
                 d.beta, C + i * d.stride_c, d.ldc);
  }

  void fill(Tensor x, float value) override {
    int64_t n = x.numel();
    if (x.dtype() == DType::f32) {
      float* p = x.ptr<float>();
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
      for (int64_t i = 0; i < n; ++i) p[i] = value;
      return;
    }
    uint16_t bits = x.dtype() == DType::bf16 ? f32_to_bf16_bits(value) : f32_to_f16_bits(value);
    std::fill_n(static_cast<uint16_t*>(x.data()), n, bits);
  }

  void cast(Tensor dst, Tensor src) override {
    check_same_numel(src, dst, "cast");
    int64_t n = src.numel();
    const int64_t chunk = 1 << 14;
    const char* s = static_cast<const char*>(src.data());
    char* t = static_cast<char*>(dst.data());
    size_t ss = dtype_size(src.dtype()), ts = dtype_size(dst.dtype());
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; i += chunk) {
      convert(s + i * ss, src.dtype(), t + i * ts, dst.dtype(), static_cast<size_t>(std::min(chunk, n - i)));
    }
  }

  void axpy(float alpha, Tensor x, Tensor y) override {
    check_elementwise(x, y, "axpy");
    const float* xp = x.ptr<float>();
    float* yp = y.ptr<float>();
    int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) yp[i] += alpha * xp[i];
  }

  void scale(Tensor x, float alpha) override {
    check_f32(x, "scale");
    float* p = x.ptr<float>();
    int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) p[i] *= alpha;
  }

  void add(Tensor a, Tensor b, Tensor out) override { binary(a, b, out, "add", [](float u, float v) { return u + v; }); }
  void mul(Tensor a, Tensor b, Tensor out) override { binary(a, b, out, "mul", [](float u, float v) { return u * v; }); }
  void add_into(Tensor dst, Tensor src) override {
    check_add_into(dst, src);
    if (dst.dtype() == DType::f32 && src.dtype() == DType::f32) return add(dst, src, dst);
    // Chunks widened with cast's conversion, summed, and rounded back with it.
    const int64_t n = dst.numel(), chunk = 4096;
    char* d = static_cast<char*>(dst.data());
    const char* s = static_cast<const char*>(src.data());
    const size_t ds = dtype_size(dst.dtype()), ss = dtype_size(src.dtype());
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; i += chunk) {
      const size_t m = static_cast<size_t>(std::min(chunk, n - i));
      float a[4096], b[4096];
      convert(d + i * ds, dst.dtype(), a, DType::f32, m);
      convert(s + i * ss, src.dtype(), b, DType::f32, m);
      for (size_t j = 0; j < m; ++j) a[j] += b[j];
      convert(a, DType::f32, d + i * ds, dst.dtype(), m);
    }
  }
  void add_bias(Tensor x, Tensor bias) override {
    cpu::add_bias(x.ptr<float>(), bias.ptr<float>(), bias_rows(x, bias), bias.numel());
  }

  void sum(Tensor x, Tensor out, bool accumulate) override {
    reduce_to_scalar(x, out, accumulate, "sum", [](float v) { return static_cast<double>(v); });
  }
  void sum_squares(Tensor x, Tensor out, bool accumulate) override {
    reduce_to_scalar(x, out, accumulate, "sum_squares", [](float v) { return static_cast<double>(v) * v; });
  }

  void max_abs(Tensor x, Tensor out, bool accumulate) override {
    check_f32(x, "max_abs");
    check_scalar(out, "max_abs");
    const float* p = x.ptr<float>();
    int64_t n = x.numel();
    float m = 0.f;
#pragma omp parallel for reduction(max : m) schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(p[i]));
    float* o = out.ptr<float>();
    o[0] = accumulate ? std::max(o[0], m) : m;
  }

  void sum_rows(Tensor x, Tensor out, bool accumulate) override {
    check_sum_rows(x, out);
    if (x.dtype() == DType::bf16) return sum_rows_of(static_cast<const uint16_t*>(x.data()), x, out, accumulate);
    sum_rows_of(x.ptr<float>(), x, out, accumulate);
  }

 private:
  static float widened(float v) { return v; }
  static float widened(uint16_t bits) { return bf16_bits_to_f32(bits); }
  // Columns split across threads; each thread walks rows in order, so the result is deterministic.
  template <class T>
  static void sum_rows_of(const T* xp, const Tensor& x, Tensor out, bool accumulate) {
    const int64_t rows = x.dim(0), cols = x.dim(1);
    float* op = out.ptr<float>();
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
    for (int64_t c0 = 0; c0 < cols; c0 += 256) {
      int64_t c1 = std::min(cols, c0 + 256);
      double acc[256] = {};
      for (int64_t r = 0; r < rows; ++r) {
        const T* row = xp + r * cols;
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += widened(row[c]);
      }
      for (int64_t c = c0; c < c1; ++c) op[c] = static_cast<float>((accumulate ? op[c] : 0.0) + acc[c - c0]);
    }
  }
  static void check_elementwise(const Tensor& a, const Tensor& b, const char* op) {
    check_f32(a, op);
    check_f32(b, op);
    check_same_numel(a, b, op);
  }
  static void check_scalar(const Tensor& out, const char* op) {
    check_f32(out, op);
    SHARD_CHECK(out.numel() == 1, "{}: out must hold 1 element, has {}", op, out.numel());
  }

  template <class F>
  void binary(Tensor a, Tensor b, Tensor out, const char* op, F f) {
    check_elementwise(a, b, op);
    check_elementwise(a, out, op);
    const float* ap = a.ptr<float>();
    const float* bp = b.ptr<float>();
    float* o = out.ptr<float>();
    int64_t n = a.numel();
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) o[i] = f(ap[i], bp[i]);
  }

  template <class F>
  void reduce_to_scalar(Tensor x, Tensor out, bool accumulate, const char* op, F f) {
    check_f32(x, op);
    check_scalar(out, op);
    const float* p = x.ptr<float>();
    int64_t n = x.numel();
    double acc = 0.0;
    // simd: the double sum is split across vector lanes (a fixed order for a given build and thread count).
#pragma omp parallel for simd reduction(+ : acc) schedule(static) if (parallel : n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) acc += f(p[i]);
    float* o = out.ptr<float>();
    o[0] = static_cast<float>((accumulate ? o[0] : 0.0) + acc);
  }

  int threads_;
  cpu::GemmPolicy policy_;
  BlockCache cache_{64, size_t{1} << 30};  // 64-byte aligned blocks, at most 1 GiB cached
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendConfig& cfg) { return std::make_unique<CpuBackend>(cfg); }

void on_every_cpu_thread(const std::function<void()>& f) {
#pragma omp parallel
  f();
}

}  // namespace shardlab
