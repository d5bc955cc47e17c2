// meta_backend.cpp — a Backend that accounts for memory and computes nothing.
//
// The memory prediction runs the real training step (runner, strategy, optimizer, communicator
// staging) on this backend, so each strategy is written once and the prediction is what that code
// allocates (PyTorch's FSDP memory tracker runs the real model under fake tensors for the same
// reason). raw_alloc hands out addresses from a counter in the non-canonical part of the address
// space: distinct, aligned, and never mappable, so code that touched one would fault at once
// instead of reading garbage.
// Every kernel, copy and cast returns without touching memory (the operation families, ops/, check
// their tensors and then do nothing for this device); reductions leave `out` unwritten,
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
