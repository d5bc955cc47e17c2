// cpu_backend.cpp — the CPU Backend: oneDNN's or OpenBLAS's sgemm for matrix products (gemm.hpp
// picks per shape), OpenMP loops for the rest.
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

namespace shardlab {
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
    return fmt::format("cpu ({}, {}, {} threads)", gemm, cpu::gemm_isa_describe(), threads_);
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
    check_f32(x, "sum_rows");
    check_f32(out, "sum_rows");
    SHARD_CHECK(x.ndim() == 2 && out.numel() == x.dim(1), "sum_rows: x {} and out {}", x.shape_str(),
                out.shape_str());
    int64_t rows = x.dim(0), cols = x.dim(1);
    const float* xp = x.ptr<float>();
    float* op = out.ptr<float>();
    // Columns split across threads; each thread walks rows in order, so the result is deterministic.
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
    for (int64_t c0 = 0; c0 < cols; c0 += 256) {
      int64_t c1 = std::min(cols, c0 + 256);
      double acc[256] = {};
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = xp + r * cols;
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
      }
      for (int64_t c = c0; c < c1; ++c) op[c] = static_cast<float>((accumulate ? op[c] : 0.0) + acc[c - c0]);
    }
  }

  // ---- the layers' operations: embeddings, normalisation, positions, activations, attention, losses ----
  void embedding_forward(Tensor out, const int32_t* tokens, int64_t B, int64_t T, Tensor wte, Tensor wpe) override {
    const int64_t C = embedding_shape(out, wte, wpe, B, T);
    cpu::embedding_forward(out.ptr<float>(), tokens, wte.ptr<float>(), wpe.data() ? wpe.ptr<float>() : nullptr, B, T, C,
                           wte.dim(0));
  }
  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int64_t B,
                          int64_t T) override {
    const int64_t C = embedding_backward_shape(dwte, dwpe, dout, B, T);
    cpu::embedding_backward(dwte.ptr<float>(), dwpe.data() ? dwpe.ptr<float>() : nullptr, dout.ptr<float>(), tokens,
                            B, T, C);
  }
  void embedding_forward_shard(Tensor out, const int32_t* tokens, int64_t B, int64_t T, Tensor wte, Tensor wpe,
                               int64_t v0) override {
    const int64_t C = embedding_shard_shape(out, wte, wpe, B, T, v0);
    check_shard_ids(tokens, B * T, "token");
    cpu::embedding_forward_shard(out.ptr<float>(), tokens, wte.ptr<float>(), wpe.data() ? wpe.ptr<float>() : nullptr,
                                 B, T, C, wte.dim(0), v0);
  }
  void embedding_backward_shard(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int64_t B, int64_t T,
                                int64_t v0) override {
    const int64_t C = embedding_backward_shard_shape(dwte, dwpe, dout, B, T, v0);
    check_shard_ids(tokens, B * T, "token");
    cpu::embedding_backward_shard(dwte.ptr<float>(), dwpe.data() ? dwpe.ptr<float>() : nullptr, dout.ptr<float>(),
                                  tokens, B, T, C, dwte.dim(0), v0);
  }
  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias,
                         float eps) override {
    const auto [N, C] = layernorm_shape(out, mean, rstd, inp, weight, bias, "layernorm_forward");
    cpu::layernorm_forward(out.ptr<float>(), mean.ptr<float>(), rstd.ptr<float>(), inp.ptr<float>(),
                           weight.ptr<float>(), bias.ptr<float>(), N, C, eps);
  }
  void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                          Tensor mean, Tensor rstd) override {
    const auto [N, C] = layernorm_backward_shape(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
    cpu::layernorm_backward(dinp.ptr<float>(), dweight.ptr<float>(), dbias.ptr<float>(), dout.ptr<float>(),
                            inp.ptr<float>(), weight.ptr<float>(), mean.ptr<float>(), rstd.ptr<float>(), N, C);
  }
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps) override {
    const auto [N, C] = rmsnorm_shape(out, rstd, inp, weight, "rmsnorm_forward");
    cpu::rmsnorm_forward(out.ptr<float>(), rstd.ptr<float>(), inp.ptr<float>(), weight.ptr<float>(), N, C, eps);
  }
  void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd) override {
    const auto [N, C] = rmsnorm_backward_shape(dinp, dweight, dout, inp, weight, rstd);
    cpu::rmsnorm_backward(dinp.ptr<float>(), dweight.ptr<float>(), dout.ptr<float>(), inp.ptr<float>(),
                          weight.ptr<float>(), rstd.ptr<float>(), N, C);
  }
  void rope(Tensor x, int64_t heads, int64_t head_dim, const RopeFreqs& freqs, int64_t pos0, bool inverse) override {
    const auto [B, T, W] = rope_shape(x, heads, head_dim, freqs);
    cpu::rope(x.ptr<float>(), B, T, W, heads, head_dim, freqs, pos0, inverse);
  }
  void gelu_forward(Tensor out, Tensor inp) override {
    check_same_numel(out, inp, "gelu_forward");
    cpu::gelu_forward(out.ptr<float>(), inp.ptr<float>(), inp.numel());
  }
  void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) override {
    check_same_numel(dinp, inp, "gelu_backward");
    check_same_numel(dout, inp, "gelu_backward");
    cpu::gelu_backward(dinp.ptr<float>(), inp.ptr<float>(), dout.ptr<float>(), inp.numel());
  }
  void swiglu_forward(Tensor out, Tensor gate_up) override {
    const auto [N, F] = swiglu_shape(out, gate_up, "swiglu_forward");
    cpu::swiglu_forward(out.ptr<float>(), gate_up.ptr<float>(), N, F);
  }
  void swiglu_backward(Tensor dgate_up, Tensor gate_up, Tensor dout) override {
    const auto [N, F] = swiglu_shape(dout, gate_up, "swiglu_backward");
    check_same_numel(dgate_up, gate_up, "swiglu_backward");
    cpu::swiglu_backward(dgate_up.ptr<float>(), gate_up.ptr<float>(), dout.ptr<float>(), N, F);
  }
  void attention_forward(Tensor out, Tensor att, Tensor qkv, int64_t H, int64_t KV) override {
    auto [B, T, C] = attention_shape(qkv, out, att, H, KV, "attention_forward");
    cpu::attention_forward(out.ptr<float>(), att.ptr<float>(), qkv.ptr<float>(), B, T, C, H, KV);
  }
  void kv_cache_write(Tensor k_cache, Tensor v_cache, Tensor qkv, int64_t H, int64_t KV, int64_t pos0) override {
    const auto [B, T, C, S] = attention_cached_shape(Tensor(), qkv, k_cache, v_cache, H, KV, pos0, "kv_cache_write");
    cpu::kv_cache_write(k_cache.ptr<float>(), v_cache.ptr<float>(), qkv.ptr<float>(), B, T, S, H, KV, C / H, pos0);
  }
  void attention_cached(Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t H, int64_t KV,
                        int64_t pos0) override {
    const auto [B, T, C, S] = attention_cached_shape(out, qkv, k_cache, v_cache, H, KV, pos0, "attention_cached");
    cpu::attention_cached(out.ptr<float>(), qkv.ptr<float>(), k_cache.ptr<float>(), v_cache.ptr<float>(), B, T, S, H,
                          KV, C / H, pos0);
  }
  void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor att, int64_t H, int64_t KV,
                          Tensor scratch) override {
    auto [B, T, C] = attention_shape(qkv, dout, att, H, KV, "attention_backward");
    check_attention_backward(dqkv, qkv, scratch, T, H);
    cpu::attention_backward(dqkv.ptr<float>(), scratch.ptr<float>(), dout.ptr<float>(), qkv.ptr<float>(),
                            att.ptr<float>(), B, T, C, H, KV);
  }
  void cross_entropy(Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets,
                     float dloss_scale) override {
    const auto [N, V] = cross_entropy_shape(losses, dlogits, logits);
    float* d = dlogits.data() ? dlogits.ptr<float>() : nullptr;
    cpu::cross_entropy(losses.ptr<float>(), d, logits.ptr<float>(), targets, N, V, dloss_scale);
  }

  void vocab_ce_max(Tensor mx, Tensor logits, int64_t valid) override {
    const auto [N, Vl] = vocab_ce_shape(mx, logits, valid);
    cpu::vocab_ce_max(mx.ptr<float>(), logits.ptr<float>(), N, Vl, valid);
  }
  void vocab_ce_sums(Tensor sumexp, Tensor tlogit, Tensor logits, const int32_t* targets, int64_t v0, int64_t valid,
                     Tensor mx) override {
    const auto [N, Vl] = vocab_ce_sums_shape(sumexp, tlogit, logits, mx, v0, valid);
    check_shard_ids(targets, N, "target");
    cpu::vocab_ce_sums(sumexp.ptr<float>(), tlogit.ptr<float>(), logits.ptr<float>(), targets, N, Vl, v0, valid,
                       mx.ptr<float>());
  }
  void vocab_ce_finish(Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets, int64_t v0, int64_t valid,
                       Tensor mx, Tensor sumexp, Tensor tlogit, float dloss_scale) override {
    const auto [N, Vl] = vocab_ce_finish_shape(losses, dlogits, logits, mx, sumexp, tlogit, v0, valid);
    check_shard_ids(targets, N, "target");
    cpu::vocab_ce_finish(losses.ptr<float>(), dlogits.data() ? dlogits.ptr<float>() : nullptr, logits.ptr<float>(),
                         targets, N, Vl, v0, valid, mx.ptr<float>(), sumexp.ptr<float>(), tlogit.ptr<float>(),
                         dloss_scale);
  }

  // ---- optimizers ----
  void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWArgs& a) override {
    check_same_numel(param, grad, "adamw_update");
    check_same_numel(param, m, "adamw_update");
    check_same_numel(param, v, "adamw_update");
    cpu::adamw_update(param.ptr<float>(), grad.ptr<float>(), m.ptr<float>(), v.ptr<float>(), param.numel(), a);
  }
  void sgd_update(Tensor param, Tensor grad, Tensor momentum, const SgdArgs& a) override {
    check_same_numel(param, grad, "sgd_update");
    check_same_numel(param, momentum, "sgd_update");
    cpu::sgd_update(param.ptr<float>(), grad.ptr<float>(), momentum.ptr<float>(), param.numel(), a);
  }

 private:
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
