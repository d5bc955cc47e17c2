// meta_backend.cpp — a Backend that accounts for memory and computes nothing.
//
// The memory prediction runs the real training step (runner, strategy, optimizer, communicator
// staging) on this backend, so each strategy is written once and the prediction is what that code
// allocates (PyTorch's FSDP memory tracker runs the real model under fake tensors for the same
// reason). raw_alloc hands out addresses from a counter in the non-canonical part of the address
// space: distinct, aligned, and never mappable, so code that touched one would fault at once
// instead of reading garbage.
// Every kernel, copy and cast returns without touching memory; reductions leave `out` unwritten,
// so a loss or norm read back through copy() keeps whatever the host buffer held (callers zero it).
#include <atomic>

#include "src/backend/backend.hpp"

namespace shardlab {
namespace {

class MetaEvent final : public Event {
 public:
  bool done() const override { return true; }
  void synchronize() override {}
};

class MetaBackend final : public Backend {
 public:
  explicit MetaBackend(GemmObserver on_gemm) : on_gemm_(std::move(on_gemm)) {}
  Device device() const override { return Device::meta; }
  std::string describe() const override { return "meta (accounts for memory, computes nothing)"; }
  int threads() const override { return 1; }

  void* raw_alloc(size_t bytes) override {
    // 256-byte aligned, with a gap between blocks.
    uintptr_t p = next_.fetch_add((bytes + 255) / 256 * 256 + 256);
    return reinterpret_cast<void*>(p);
  }
  void raw_free(void*, size_t) override {}
  void copy(Tensor dst, Tensor src) override { check_same_numel(src, dst, "copy"); }

  std::unique_ptr<Event> record(StreamKind) override { return std::make_unique<MetaEvent>(); }
  void wait(StreamKind, const Event&) override {}
  void synchronize() override {}

  // ---- matrix products ----
  void gemm(const GemmDesc& d, const void*, const void*, void*) override {
    check_gemm(d);
    if (on_gemm_) on_gemm_(d);
  }
  // ---- element-wise ----
  void fill(Tensor, float) override {}
  void cast(Tensor dst, Tensor src) override { check_same_numel(src, dst, "cast"); }
  void axpy(float, Tensor, Tensor) override {}
  void scale(Tensor, float) override {}
  void add(Tensor, Tensor, Tensor) override {}
  void mul(Tensor, Tensor, Tensor) override {}
  void add_bias(Tensor, Tensor) override {}
  // ---- reductions ----
  void sum(Tensor, Tensor, bool) override {}
  void sum_squares(Tensor, Tensor, bool) override {}
  void max_abs(Tensor, Tensor, bool) override {}
  void sum_rows(Tensor, Tensor, bool) override {}
  // ---- the layers' operations: embeddings, normalisation, positions, activations, attention, losses ----
  void embedding_forward(Tensor, const int32_t*, int64_t, int64_t, Tensor, Tensor) override {}
  void embedding_backward(Tensor, Tensor, Tensor, const int32_t*, int64_t, int64_t) override {}
  void layernorm_forward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, float) override {}
  void layernorm_backward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor) override {}
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float) override {
    rmsnorm_shape(out, rstd, inp, weight, "rmsnorm_forward");
  }
  void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd) override {
    rmsnorm_backward_shape(dinp, dweight, dout, inp, weight, rstd);
  }
  void rope(Tensor x, int64_t heads, int64_t head_dim, const RopeFreqs& freqs, int64_t, bool) override {
    rope_shape(x, heads, head_dim, freqs);
  }
  void gelu_forward(Tensor, Tensor) override {}
  void gelu_backward(Tensor, Tensor, Tensor) override {}
  void swiglu_forward(Tensor out, Tensor gate_up) override { swiglu_shape(out, gate_up, "swiglu_forward"); }
  void swiglu_backward(Tensor dgate_up, Tensor gate_up, Tensor dout) override {
    swiglu_shape(dout, gate_up, "swiglu_backward");
    check_same_numel(dgate_up, gate_up, "swiglu_backward");
  }
  void attention_forward(Tensor out, Tensor att, Tensor qkv, int64_t H, int64_t KV) override {
    attention_shape(qkv, out, att, H, KV, "attention_forward");
  }
  void attention_backward(Tensor, Tensor, Tensor, Tensor, int64_t, int64_t, Tensor) override {}
  void kv_cache_write(Tensor k_cache, Tensor v_cache, Tensor qkv, int64_t H, int64_t KV, int64_t pos0) override {
    attention_cached_shape(Tensor(), qkv, k_cache, v_cache, H, KV, pos0, "kv_cache_write");
  }
  void attention_cached(Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t H, int64_t KV,
                        int64_t pos0) override {
    attention_cached_shape(out, qkv, k_cache, v_cache, H, KV, pos0, "attention_cached");
  }
  void cross_entropy(Tensor, Tensor, Tensor, const int32_t*, float) override {}
  void embedding_forward_shard(Tensor out, const int32_t*, int64_t B, int64_t T, Tensor wte, Tensor wpe,
                               int64_t v0) override {
    embedding_shard_shape(out, wte, wpe, B, T, v0);
  }
  void embedding_backward_shard(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t*, int64_t B, int64_t T,
                                int64_t v0) override {
    embedding_backward_shard_shape(dwte, dwpe, dout, B, T, v0);
  }
  void vocab_ce_max(Tensor mx, Tensor logits, int64_t valid) override { vocab_ce_shape(mx, logits, valid); }
  void vocab_ce_sums(Tensor sumexp, Tensor tlogit, Tensor logits, const int32_t*, int64_t v0, int64_t valid,
                     Tensor mx) override {
    vocab_ce_sums_shape(sumexp, tlogit, logits, mx, v0, valid);
  }
  void vocab_ce_finish(Tensor losses, Tensor dlogits, Tensor logits, const int32_t*, int64_t v0, int64_t valid,
                       Tensor mx, Tensor sumexp, Tensor tlogit, float) override {
    vocab_ce_finish_shape(losses, dlogits, logits, mx, sumexp, tlogit, v0, valid);
  }
  // ---- optimizers ----
  void adamw_update(Tensor, Tensor, Tensor, Tensor, const AdamWArgs&) override {}
  void sgd_update(Tensor, Tensor, Tensor, const SgdArgs&) override {}

 private:
  // Non-canonical on x86-64 (bits 48-63 differ from bit 47): any dereference faults at once, and
  // no real mapping can ever lie there, however many terabytes a prediction hands out.
  std::atomic<uintptr_t> next_{uintptr_t{0xdead} << 48};
  GemmObserver on_gemm_;
};

}  // namespace

std::unique_ptr<Backend> make_meta_backend(GemmObserver on_gemm) {
  return std::make_unique<MetaBackend>(std::move(on_gemm));
}

}  // namespace shardlab
