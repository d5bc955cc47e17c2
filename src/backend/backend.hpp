// backend.hpp — Backend: the one interface between shardlab and a device. Memory (raw allocation,
// used only by memory::Pool), copies, streams and events, GEMM and the element-wise primitives and
// reductions. Two implementations: cpu/ (oneDNN or OpenBLAS sgemm + OpenMP) and cuda/ (cuBLAS + CUDA
// kernels), chosen at run time by --device; and meta/, which accounts for memory and computes
// nothing (memory predictions). The layers' operations (embedding, norms, RoPE, activations,
// attention, KV cache, losses, optimizer updates) are free functions in ops/, one file per family,
// that check their tensors once and dispatch on device().
//
// Conventions. Matrices are row-major. Element-wise kernels compute in f32 and take f32 tensors
// unless they say otherwise; `cast` moves between f32, bf16 and f16. Reductions write one f32 to
// `out` on the backend's device (no host sync on a GPU) and accumulate in higher precision than
// their inputs. Work is issued on a stream: on the CPU everything is synchronous and events are
// complete when recorded; on CUDA, kernels go to the compute stream and collectives to the comm
// stream, and the two are ordered by events, never by a host sync.
#pragma once
#include <cstdint>
#include <memory>
#include <functional>
#include <span>
#include <string>

#include "src/core/elem_range.hpp"
#include "src/core/tensor.hpp"

namespace shardlab {

enum class Trans : uint8_t { N, T };
class CostLedger;  // src/backend/cost.hpp

// C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b], for b in [0, batch), row-major.
// op(A) is (m, k), op(B) is (k, n), C is (m, n). Leading dimensions are row strides in elements.
struct GemmDesc {
  Trans trans_a = Trans::N;
  Trans trans_b = Trans::N;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.f;
  float beta = 0.f;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch entries
  DType a_type = DType::f32, b_type = DType::f32;  // A's and B's storage (bf16 on GPUs; f32 everywhere)
  DType c_type = DType::f32;                        // C; accumulation is always f32
  // f32 inputs may be rounded to this dtype first: a backend whose low-precision GEMMs are much
  // faster (low_precision_gemm()) does, so an f32 activation meets a bf16 weight on the tensor
  // cores; the others compute in f32 and ignore it.
  DType round_inputs_to = DType::f32;
};

// What a GEMM may apply to its product before C is written (Backend::gemm_epilogue): a bias on
// every row; a bias, then GELU (the tanh form), the sum kept in aux; or GELU's derivative at aux
// times the product (GELU's backward). bias_grad (Backend::gemm_bias_grad): beside the product,
// the sums over k of its B operand, a weight gradient's bias gradient.
enum class GemmEpilogue : uint8_t { bias, bias_gelu, dgelu, bias_grad };
const char* gemm_epilogue_name(GemmEpilogue e);

enum class StreamKind : uint8_t { compute, comm };

class Event {
 public:
  virtual ~Event() = default;
  virtual bool done() const = 0;
  virtual void synchronize() = 0;  // host waits
};

struct BackendConfig {
  int threads = 0;        // CPU threads for this rank; 0 = cores / ranks on this node
  int local_ranks = 1;    // processes sharing this node (for the default thread count)
  int device_index = -1;  // CUDA device; -1 = local rank modulo device count
  int local_rank = 0;
  std::string cpu_gemm = "auto";  // sgemm library of the CPU backend: auto (by shape) | onednn | openblas
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string describe() const = 0;
  virtual int threads() const = 0;

  // Raw device memory. Only memory::Pool calls these; everything else allocates through a Pool.
  virtual void* raw_alloc(size_t bytes) = 0;
  virtual void raw_free(void* p, size_t bytes) = 0;
  // Host memory for the host tier of a Pool (pinned on CUDA, so copies can be asynchronous); on
  // the CPU and meta backends the same memory as raw_alloc.
  virtual void* raw_alloc_host(size_t bytes) { return raw_alloc(bytes); }
  virtual void raw_free_host(void* p, size_t bytes) { raw_free(p, bytes); }
  // The backend that computes on host memory: this one on the CPU and meta backends, a CPU
  // backend on CUDA (the host optimizer of --offload runs there).
  virtual Backend& host() { return *this; }

  // dst <- src, same dtype and element count; either may live on the host or on this device.
  virtual void copy(Tensor dst, Tensor src) = 0;

  // The CUDA stream behind `stream` (a cudaStream_t), for transports that issue work on it
  // (NCCL); nullptr on backends without streams. The device it computes on; -1 on the host.
  virtual void* native_stream(StreamKind) { return nullptr; }
  // Whether GEMMs with bf16 operands (and round_inputs_to) run much faster here than f32 ones: the
  // model then hands the gathered bf16 parameters to them (ParamSet::gemm) instead of f32 copies.
  virtual bool low_precision_gemm() const { return false; }
  // Whether sum, sum_squares and max_abs read a bf16 x as it is (widened as read, in the order an f32
  // x is read: the result of a widened copy without the copy). The CPU's take f32 only.
  virtual bool reduces_bf16() const { return false; }
  // Where a step's costs are written instead of computed (the meta backend's, when a prediction
  // prices the step: src/backend/cost.hpp); nullptr elsewhere.
  virtual CostLedger* cost_ledger() { return nullptr; }
  virtual int device_index() const { return -1; }
  // The device's memory as the driver reports it, and what this backend's allocator has reserved
  // from it (the Pool's blocks live there). Their difference is what lives outside the pool: the
  // CUDA context, cuBLAS's workspace, NCCL's buffers (and, when ranks share a GPU, the others'
  // memory). All zero on backends without a device.
  struct DeviceMemory {
    uint64_t free = 0, total = 0, reserved = 0;
    uint64_t outside_pool() const { return total - free > reserved ? total - free - reserved : 0; }
  };
  virtual DeviceMemory device_memory() const { return {}; }
  // Named ranges for a profiler's timeline (NVTX on CUDA, so Nsight Systems shows units and
  // collectives); no-ops elsewhere. Use Backend::Range.
  virtual void range_push(const char*) {}
  virtual void range_pop() {}
  class Range {
   public:
    Range(Backend& be, const char* name) : be_(be) { be_.range_push(name); }
    ~Range() { be_.range_pop(); }
    Range(const Range&) = delete;
    Range& operator=(const Range&) = delete;

   private:
    Backend& be_;
  };

  virtual std::unique_ptr<Event> record(StreamKind stream) = 0;
  virtual void wait(StreamKind stream, const Event& event) = 0;  // stream waits on event
  virtual void synchronize() = 0;                                // host waits for all streams

  // The primitives every operation family builds on; the layers' operations are in ops/.

  // ---- matrix products ----
  virtual void gemm(const GemmDesc& d, const void* a, const void* b, void* c) = 0;
  // Whether gemm_epilogue runs this product and its epilogue as one (CUDA: cuBLASLt's epilogues,
  // for products on bf16 operands: an f32 run keeps the f32 kernels' GELU). Elsewhere the callers
  // compose the product and the element-wise passes (blocks/linear.hpp's gemm_epilogue, the
  // reference), which is also what the fused form is tested against.
  virtual bool fuses_gemm_epilogue(const GemmDesc&) const { return false; }
  // C = e(op(A) op(B)) for one product (d.batch 1, d.alpha 1, d.beta 0, C f32 or bf16 (d.c_type)
  // with ldc == n; d.beta 1 with bias: C = C + product + bias, a residual summed in place): bias:
  // + bias (n floats) on every row of C; bias_gelu: aux = product + bias,
  // C = gelu(aux) (gelu of the f32 sum; aux and C each rounded once to C's dtype); dgelu:
  // C = gelu'(aux) * product. aux: (m, n) in C's dtype (unused by bias). Only where
  // fuses_gemm_epilogue(d) (InternalError elsewhere). False where the backend did not take this
  // product after all (a library's alignment rules; C and aux untouched): the caller composes.
  // (Inline, so Backend keeps no key function: its vtable comes with every file that uses it.)
  virtual bool gemm_epilogue(const GemmDesc&, const void*, const void*, void*, GemmEpilogue e, const float*, void*) {
    SHARD_CHECK(false, "gemm with epilogue {} on {}, which does not fuse it (fuses_gemm_epilogue)",
                static_cast<int>(e), describe());
    return false;
  }
  // A weight-gradient product and its bias's gradient in one (cuBLASLt's BGRADA epilogue): C (+)=
  // op(A) B as gemm_epilogue's C (d.beta 0 or 1, trans_b N) and dbias (n floats) = the sums over
  // k of B (k, n) as the product reads it, overwritten (so dbias must hold zeros for a sum). Only
  // where fuses_gemm_epilogue(d); false where the backend did not take it (C and dbias untouched).
  virtual bool gemm_bias_grad(const GemmDesc&, const void*, const void*, void*, float*) {
    SHARD_CHECK(false, "gemm with a bias gradient on {}, which does not fuse it (fuses_gemm_epilogue)", describe());
    return false;
  }

  // ---- element-wise ----
  virtual void fill(Tensor x, float value) = 0;          // any dtype
  virtual void cast(Tensor dst, Tensor src) = 0;         // dst <- src, any dtypes, same numel (as copy)
  // dst[r] <- src[r] for each range r of both flat buffers (same numel), the rest of dst untouched:
  // one cast of each range here; one launch for up to cuda::kCastRanges of them on CUDA.
  virtual void cast_ranges(Tensor dst, Tensor src, std::span<const ElemRange> ranges) {
    for (const ElemRange& r : ranges) cast(dst.slice(r.offset, r.count), src.slice(r.offset, r.count));
  }
  virtual void axpy(float alpha, Tensor x, Tensor y) = 0;  // y += alpha * x
  virtual void scale(Tensor x, float alpha) = 0;           // x *= alpha
  virtual void add(Tensor a, Tensor b, Tensor out) = 0;    // out = a + b (out may alias a or b)
  virtual void mul(Tensor a, Tensor b, Tensor out) = 0;    // out = a * b
  // dst += src in one pass, each f32 or bf16: both widened to f32, summed, rounded once to dst's
  // dtype (what cast(dst, widened dst + widened src) gives, without the f32 copies).
  virtual void add_into(Tensor dst, Tensor src) = 0;
  // x (N, OC) += bias (OC) on every row
  virtual void add_bias(Tensor x, Tensor bias) = 0;

  // ---- reductions ----
  // out[0] (+)= sum(x) / sum(x^2) / max|x|; accumulate adds to (or maxes with) what out holds. x
  // f32, or bf16 where reduces_bf16().
  virtual void sum(Tensor x, Tensor out, bool accumulate) = 0;
  virtual void sum_squares(Tensor x, Tensor out, bool accumulate) = 0;
  virtual void max_abs(Tensor x, Tensor out, bool accumulate) = 0;
  // out[c] (+)= sum_r x[r, c] for x of shape (rows, cols), f32 or bf16 (widened as read; out f32):
  // bias gradients.
  virtual void sum_rows(Tensor x, Tensor out, bool accumulate) = 0;
};

std::unique_ptr<Backend> make_backend(Device device, const BackendConfig& cfg);
std::unique_ptr<Backend> make_cpu_backend(const BackendConfig& cfg);
// on_gemm, when set, sees every product the meta backend is asked for: a step's GEMMs as the
// model issues them (step_gemms in src/train/predict.hpp), for benchmarks' sgemm ceilings.
using GemmObserver = std::function<void(const GemmDesc&)>;
// With `ledger`, every operation the step issues is written to it as it would run on the ledger's
// target device (cost.hpp), and GEMMs take low-precision operands where that device would; without
// one, low_precision_gemm() is the flag's (a memory prediction of a step on a GPU).
std::unique_ptr<Backend> make_meta_backend(GemmObserver on_gemm = {}, CostLedger* ledger = nullptr,
                                           bool low_precision_gemm = false);
// Throws InputError when shardlab was built without CUDA or no device is visible.
std::unique_ptr<Backend> make_cuda_backend(const BackendConfig& cfg);
bool cuda_compiled();
int cuda_device_count();  // 0 without CUDA or without a device; never throws
Device parse_device(const std::string& s);
int default_cpu_threads(int local_ranks);  // max(1, usable cores / local_ranks)
// Runs f once on each thread of the CPU backend's OpenMP pool, the calling thread among them.
void on_every_cpu_thread(const std::function<void()>& f);

// Shape checks shared by the implementations and the operation families.
void check_same_numel(const Tensor& a, const Tensor& b, const char* op);
void check_f32(const Tensor& t, const char* op);
void check_gemm(const GemmDesc& d);
// Whether a product runs on low-precision operands (both bf16 or f16 as stored, or rounded to
// round_inputs_to): a GPU's tensor-core product.
bool low_precision_product(const GemmDesc& d);
// add_into's operands: the same count, each f32 or bf16.
void check_add_into(const Tensor& dst, const Tensor& src);
// check_gemm, and what gemm_epilogue asks of the product and its operands.
void check_gemm_epilogue(const GemmDesc& d, GemmEpilogue e, const float* bias, const void* aux);
// cast_ranges' arguments: dst and src of one numel, every range inside it.
void check_cast_ranges(const Tensor& dst, const Tensor& src, std::span<const ElemRange> ranges);
int64_t bias_rows(const Tensor& x, const Tensor& bias);  // x is (rows, bias.numel())
void check_sum_rows(const Tensor& x, const Tensor& out);  // x (rows, cols) f32 or bf16, out (cols) f32

}  // namespace shardlab
