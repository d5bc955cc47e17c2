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
// With a cost ledger (cost.hpp) each primitive writes what it would cost on the ledger's target
// instead: the same bytes and FLOPs as the families' meta cases, and on a CUDA target the commands
// the CUDA backend issues for it (cuda/launches.hpp).
#include <atomic>

#include "src/backend/backend.hpp"
#include "src/backend/cost.hpp"
#include "src/backend/ops/dispatch.hpp"

namespace shardlab {
namespace {

class MetaEvent final : public Event {
 public:
  bool done() const override { return true; }
  void synchronize() override {}
};

// A GEMM operand's elements, as the CUDA backend rounds them (cuda/launches.hpp).
int64_t operand_elems(const GemmDesc& d, bool a) {
  return a ? cuda::gemm_operand_elems(d.batch, d.stride_a, d.trans_a == Trans::N ? d.m : d.k, d.lda)
           : cuda::gemm_operand_elems(d.batch, d.stride_b, d.trans_b == Trans::N ? d.k : d.n, d.ldb);
}

class MetaBackend final : public Backend {
 public:
  MetaBackend(GemmObserver on_gemm, CostLedger* ledger, bool low_precision)
      : on_gemm_(std::move(on_gemm)), ledger_(ledger), low_precision_(low_precision) {}
  Device device() const override { return Device::meta; }
  std::string describe() const override { return "meta (accounts for memory, computes nothing)"; }
  int threads() const override { return 1; }
  CostLedger* cost_ledger() override { return ledger_; }
  // As the device the ledger (or the prediction) stands for: a GPU hands bf16 parameters to its GEMMs.
  bool low_precision_gemm() const override {
    return ledger_ != nullptr ? ledger_->target() == Device::cuda : low_precision_;
  }
  bool reduces_bf16() const override { return low_precision_gemm(); }  // as a GPU's

  void* raw_alloc(size_t bytes) override {
    // 256-byte aligned, with a gap between blocks.
    uintptr_t p = next_.fetch_add((bytes + 255) / 256 * 256 + 256);
    return reinterpret_cast<void*>(p);
  }
  void raw_free(void*, size_t) override {}
  // A copy to or from host memory (a loss read back, a shard offloaded) waits for the device on
  // CUDA (CudaBackend::copy synchronises the compute stream first).
  void copy(Tensor dst, Tensor src) override {
    check_same_numel(src, dst, "copy");
    if (ledger_ == nullptr) return;
    const bool host = dst.device() == Device::cpu || src.device() == Device::cpu;
    OpCost c{.name = host ? "copy (host)" : "copy", .bytes = 2.0 * static_cast<double>(src.bytes())};
    if (host && ledger_->target() == Device::cuda) c.host_syncs = 1;
    ops::charge(*this, std::move(c), [&] { return cuda::copy_launches(host); });
  }

  std::unique_ptr<Event> record(StreamKind s) override {
    if (ledger_) ledger_->record(s);
    return std::make_unique<MetaEvent>();
  }
  void wait(StreamKind, const Event&) override {}
  void synchronize() override {
    if (ledger_) ledger_->host_sync(true);
  }

  // ---- matrix products ----
  void gemm(const GemmDesc& d, const void*, const void*, void*) override {
    check_gemm(d);
    if (on_gemm_) on_gemm_(d);
    charge_gemm(d, 0);
  }
  // As the device the ledger stands for: a GPU runs the product and its epilogue in one cuBLASLt
  // call (the memory is the same either way: the callers' blocks).
  bool fuses_gemm_epilogue(const GemmDesc& d) const override {
    return low_precision_gemm() && low_precision_product(d);
  }
  bool gemm_epilogue(const GemmDesc& d, const void*, const void*, void*, GemmEpilogue e, const float* bias,
                     void* aux) override {
    check_gemm_epilogue(d, e, bias, aux);
    if (on_gemm_) on_gemm_(d);
    // Beside the product: the bias read; the sum written to aux (bias_gelu) or aux read (dgelu),
    // in C's dtype.
    const double mn = static_cast<double>(d.m) * static_cast<double>(d.n);
    charge_gemm(d, 4.0 * static_cast<double>(d.n) * (bias != nullptr) +
                       static_cast<double>(dtype_size(d.c_type)) * mn * (aux != nullptr));
    return true;
  }
  bool gemm_bias_grad(const GemmDesc& d, const void*, const void*, void*, float* dbias) override {
    check_gemm_epilogue(d, GemmEpilogue::bias_grad, dbias, nullptr);
    if (on_gemm_) on_gemm_(d);
    charge_gemm(d, 4.0 * static_cast<double>(d.n));  // beside the product: the bias gradient written
    return true;
  }
  void charge_gemm(const GemmDesc& d, double epilogue_bytes) {
    if (ledger_ == nullptr || ledger_->paused()) return;
    const bool gpu = ledger_->target() == Device::cuda;
    // The CUDA backend rounds f32 operands to round_inputs_to in kernels of their own first.
    DType at = d.a_type, bt = d.b_type;
    if (gpu && cuda::gemm_rounds(d, at))
      charge_cast(operand_elems(d, true), at, d.round_inputs_to), at = d.round_inputs_to;
    if (gpu && cuda::gemm_rounds(d, bt))
      charge_cast(operand_elems(d, false), bt, d.round_inputs_to), bt = d.round_inputs_to;
    const double flops = 2.0 * static_cast<double>(d.m) * static_cast<double>(d.n) * static_cast<double>(d.k) *
                         static_cast<double>(d.batch);
    const bool tensor = gpu && at != DType::f32 && bt != DType::f32;
    const double b = static_cast<double>(d.batch);
    const double bytes =
        b * (static_cast<double>(d.m * d.k) * dtype_size(at) + static_cast<double>(d.k * d.n) * dtype_size(bt) +
             static_cast<double>(d.m * d.n) * dtype_size(d.c_type) * (d.beta != 0.f ? 2 : 1));
    OpCost c{.name = "gemm", .flops = tensor ? 0 : flops, .tensor_flops = tensor ? flops : 0,
             .bytes = bytes + epilogue_bytes};
    c.m = d.m, c.n = d.n, c.k = d.k, c.batch = d.batch;
    if (gpu) c.launches = 1;  // one cuBLAS (or cuBLASLt) call, its own grid; the casts were charged above
    ledger_->add(std::move(c));
  }
  // ---- element-wise ----
  void fill(Tensor x, float) override {
    charge("fill", 0, pass_bytes(x.numel(), 0, 1, dtype_size(x.dtype())),
           [&] { return cuda::fill_launches(x.numel()); });
  }
  void cast(Tensor dst, Tensor src) override {
    check_same_numel(src, dst, "cast");
    charge_cast(src.numel(), src.dtype(), dst.dtype());  // a kernel on CUDA, whatever the dtypes
  }
  void cast_ranges(Tensor dst, Tensor src, std::span<const ElemRange> ranges) override {
    check_cast_ranges(dst, src, ranges);
    constexpr size_t kPerCall = 8 * cuda::kCastRanges;  // what one Launches list holds (CUDA's calls)
    for (size_t first = 0; first < ranges.size(); first += kPerCall) {
      const std::span<const ElemRange> part = ranges.subspan(first, std::min(kPerCall, ranges.size() - first));
      int64_t n = 0;
      for (const ElemRange& r : part) n += r.count;
      if (n == 0) continue;
      charge("cast", 0, static_cast<double>(n) * static_cast<double>(dtype_size(src.dtype()) + dtype_size(dst.dtype())),
             [&] { return cuda::cast_ranges_launches(part); });
    }
  }
  void axpy(float, Tensor x, Tensor) override {
    charge("axpy", 2.0 * x.numel(), pass_bytes(x.numel(), 2, 1), [&] { return cuda::axpy_launches(x.numel()); });
  }
  void scale(Tensor x, float) override {
    charge("scale", x.numel(), pass_bytes(x.numel(), 1, 1), [&] { return cuda::scale_launches(x.numel()); });
  }
  void add(Tensor a, Tensor, Tensor) override {
    charge("add", a.numel(), pass_bytes(a.numel(), 2, 1), [&] { return cuda::add_launches(a.numel()); });
  }
  void add_into(Tensor dst, Tensor src) override {
    check_add_into(dst, src);
    const double n = static_cast<double>(dst.numel());
    charge("add_into", n, n * static_cast<double>(2 * dtype_size(dst.dtype()) + dtype_size(src.dtype())),
           [&] { return cuda::add_into_launches(dst.numel()); });
  }
  void mul(Tensor a, Tensor, Tensor) override {
    charge("mul", a.numel(), pass_bytes(a.numel(), 2, 1), [&] { return cuda::mul_launches(a.numel()); });
  }
  void add_bias(Tensor x, Tensor bias) override {
    const int64_t N = bias_rows(x, bias), OC = bias.numel();
    charge("add_bias", x.numel(), pass_bytes(x.numel(), 1, 1) + pass_bytes(OC, 1, 0),
           [&] { return cuda::add_bias_launches(N, OC, true); });
  }
  // ---- reductions ----
  void sum(Tensor x, Tensor, bool) override { reduce("sum", x); }
  void sum_squares(Tensor x, Tensor, bool) override { reduce("sum_squares", x); }
  void max_abs(Tensor x, Tensor, bool) override { reduce("max_abs", x); }
  void sum_rows(Tensor x, Tensor out, bool) override {
    const int64_t cols = out.numel(), rows = cols > 0 ? x.numel() / cols : 0;
    // On a GPU the chunks' partial sums (doubles) are written and read back (launches.hpp).
    const double partials = ledger_ != nullptr && ledger_->target() == Device::cuda
                                ? 2.0 * 8 * double(cuda::sum_rows_chunks(rows, cols) * cols)
                                : 0.0;
    charge("sum_rows", x.numel(),
           pass_bytes(x.numel(), 1, 0, dtype_size(x.dtype())) + pass_bytes(cols, 1, 1) + partials,
           [&] { return cuda::sum_rows_launches(rows, cols); });
  }

 private:
  template <class LaunchesOf>
  void charge(const char* name, double flops, double bytes, LaunchesOf&& launches) {
    ops::charge(*this, OpCost{.name = name, .flops = flops, .bytes = bytes}, std::forward<LaunchesOf>(launches));
  }
  void charge_cast(int64_t n, DType from, DType to) {
    charge("cast", 0, static_cast<double>(n) * static_cast<double>(dtype_size(from) + dtype_size(to)),
           [&] { return cuda::cast_launches(n); });
  }
  void reduce(const char* name, const Tensor& x) {
    SHARD_CHECK(x.dtype() == DType::f32 || (x.dtype() == DType::bf16 && reduces_bf16()), "{}: {} input on a {}", name,
                dtype_name(x.dtype()), reduces_bf16() ? "GPU" : "CPU");
    charge(name, x.numel(), pass_bytes(x.numel(), 1, 0, dtype_size(x.dtype())),
           [&] { return cuda::reduce_launches(x.numel()); });
  }

  // Non-canonical on x86-64 (bits 48-63 differ from bit 47): any dereference faults at once, and
  // no real mapping can ever lie there, however many terabytes a prediction hands out.
  std::atomic<uintptr_t> next_{uintptr_t{0xdead} << 48};
  GemmObserver on_gemm_;
  CostLedger* ledger_;
  bool low_precision_;  // without a ledger: low_precision_gemm()
};

}  // namespace

std::unique_ptr<Backend> make_meta_backend(GemmObserver on_gemm, CostLedger* ledger, bool low_precision_gemm) {
  return std::make_unique<MetaBackend>(std::move(on_gemm), ledger, low_precision_gemm);
}

}  // namespace shardlab
