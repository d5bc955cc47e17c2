// cuda_backend.cpp — the CUDA Backend: cuBLAS for GEMMs (f32, or bf16/f16 inputs with f32
// accumulation), the kernels of kernels.cu for the rest, one compute and one comm stream per rank.
// Host code, compiled by the C++ compiler; only kernels.cu goes through nvcc.
//
// Design notes.
//  * Launchers (kernels.cuh) own the grid math; this file validates tensors and checks launches.
//  * Memory is stream-ordered (cudaMallocFromPoolAsync on the compute stream, from a memory pool
//    of this backend's own that keeps what it frees), so freeing a block never synchronises the
//    device, and the pool's reserved bytes tell the Pool's memory from everything else on the GPU.
//  * Copies that touch host memory synchronise the compute stream: the host buffer may be pageable
//    and the caller expects it filled (or free to reuse) when copy() returns.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>

#include "src/backend/backend.hpp"
#include "src/backend/block_cache.hpp"
#include "src/backend/cuda/cuda_check.hpp"
#include "src/backend/cuda/kernels.cuh"

namespace shardlab {
namespace {

using cuda::ReduceKind;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

class CudaEvent final : public Event {
 public:
  CudaEvent() { CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~CudaEvent() override { cudaEventDestroy(event_); }
  bool done() const override {
    cudaError_t st = cudaEventQuery(event_);
    if (st == cudaErrorNotReady) return false;
    CUDA_CHECK(st);
    return true;
  }
  void synchronize() override { CUDA_CHECK(cudaEventSynchronize(event_)); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_{};
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendConfig& cfg) {
    int count = cuda_device_count();
    SHARD_REQUIRE(count > 0, "--device cuda: no CUDA device is visible to this process");
    device_ = cfg.device_index >= 0 ? cfg.device_index : cfg.local_rank % count;
    SHARD_REQUIRE(device_ < count, "CUDA device {} requested, {} visible", device_, count);
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, compute_));
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    CUDA_CHECK(cudaMemPoolCreate(&mempool_, &props));
    uint64_t keep_all = UINT64_MAX;  // freed blocks stay in the pool for the next step
    CUDA_CHECK(cudaMemPoolSetAttribute(mempool_, cudaMemPoolAttrReleaseThreshold, &keep_all));
    CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partial_), cuda::kReduceBlocks * sizeof(double), compute_));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    name_ = prop.name;
    host_ = make_cpu_backend(cfg);
  }
  ~CudaBackend() override {
    pinned_cache_.release_all([](void* p) { cudaFreeHost(p); });
    cudaFreeAsync(partial_, compute_);
    cudaStreamSynchronize(compute_);
    cudaStreamSynchronize(comm_);
    cudaMemPoolDestroy(mempool_);
    cublasDestroy(cublas_);
    cudaStreamDestroy(comm_);
    cudaStreamDestroy(compute_);
  }

  Device device() const override { return Device::cuda; }
  std::string describe() const override { return fmt::format("cuda:{} ({})", device_, name_); }
  int threads() const override { return 1; }

  void* raw_alloc(size_t bytes) override {
    void* p = nullptr;
    CUDA_CHECK(cudaMallocFromPoolAsync(&p, std::max<size_t>(bytes, 1), mempool_, compute_));
    return p;
  }
  void raw_free(void* p, size_t) override { CUDA_CHECK(cudaFreeAsync(p, compute_)); }
  // The host tier is pinned, so copies to and from it can run asynchronously on a stream.
  // cudaMallocHost costs milliseconds and offload stages a buffer per unit per step, so freed
  // pinned blocks are kept by size (at most 1 GiB of them) and handed out again.
  void* raw_alloc_host(size_t bytes) override {
    const size_t rounded = pinned_cache_.round(bytes);
    if (void* p = pinned_cache_.take(rounded)) return p;
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, rounded));
    return p;
  }
  void raw_free_host(void* p, size_t bytes) override {
    CUDA_CHECK(cudaStreamSynchronize(compute_));  // a copy issued on the stream may still read it
    if (!pinned_cache_.keep(p, pinned_cache_.round(bytes))) CUDA_CHECK(cudaFreeHost(p));
  }
  Backend& host() override { return *host_; }
  void* native_stream(StreamKind s) override { return stream(s); }
  int device_index() const override { return device_; }
  void range_push(const char* name) override { nvtxRangePushA(name); }
  void range_pop() override { nvtxRangePop(); }
  DeviceMemory device_memory() const override {
    DeviceMemory m;
    size_t free = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    m.free = free, m.total = total;
    CUDA_CHECK(cudaMemPoolGetAttribute(mempool_, cudaMemPoolAttrReservedMemCurrent, &m.reserved));
    return m;
  }

  void copy(Tensor dst, Tensor src) override {
    check_same_numel(dst, src, "copy");
    SHARD_CHECK(dst.dtype() == src.dtype(), "copy: dtypes differ ({} <- {}); use cast", dtype_name(dst.dtype()),
                dtype_name(src.dtype()));
    CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.bytes(), cudaMemcpyDefault, compute_));
    if (dst.device() == Device::cpu || src.device() == Device::cpu) CUDA_CHECK(cudaStreamSynchronize(compute_));
  }

  std::unique_ptr<Event> record(StreamKind s) override {
    auto e = std::make_unique<CudaEvent>();
    CUDA_CHECK(cudaEventRecord(e->get(), stream(s)));
    return e;
  }
  void wait(StreamKind s, const Event& e) override {
    CUDA_CHECK(cudaStreamWaitEvent(stream(s), static_cast<const CudaEvent&>(e).get(), 0));
  }
  void synchronize() override {
    CUDA_CHECK(cudaStreamSynchronize(compute_));
    CUDA_CHECK(cudaStreamSynchronize(comm_));
  }

  void gemm(const GemmDesc& d, const void* a, const void* b, void* c) override {
    check_gemm(d);
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
    cublasOperation_t opa = d.trans_a == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T;
    cublasOperation_t opb = d.trans_b == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T;
    const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // f32 accumulation for every input type
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(cublas_, opb, opa, static_cast<int>(d.n), static_cast<int>(d.m),
                                            static_cast<int>(d.k), &d.alpha, b, cuda_type(d.ab_type),
                                            static_cast<int>(d.ldb), d.stride_b, a, cuda_type(d.ab_type),
                                            static_cast<int>(d.lda), d.stride_a, &d.beta, c, cuda_type(d.c_type),
                                            static_cast<int>(d.ldc), d.stride_c, static_cast<int>(d.batch), compute,
                                            CUBLAS_GEMM_DEFAULT));
  }

  void fill(Tensor x, float value) override {
    int64_t n = x.numel();
    CUDA_CHECK(cuda::launch_fill(x.data(), x.dtype(), n, value, compute_));
  }

  void cast(Tensor dst, Tensor src) override {
    check_same_numel(src, dst, "cast");
    int64_t n = src.numel();
    CUDA_CHECK(cuda::launch_cast(src.data(), src.dtype(), dst.data(), dst.dtype(), n, compute_));
  }

  void axpy(float alpha, Tensor x, Tensor y) override {
    check_pair(x, y, "axpy");
    int64_t n = x.numel();
    CUDA_CHECK(cuda::launch_axpy(alpha, x.ptr<float>(), y.ptr<float>(), n, compute_));
  }

  void scale(Tensor x, float alpha) override {
    check_f32(x, "scale");
    int64_t n = x.numel();
    CUDA_CHECK(cuda::launch_scale(x.ptr<float>(), alpha, n, compute_));
  }

  void add(Tensor a, Tensor b, Tensor out) override {
    check_binary(a, b, out, "add");
    CUDA_CHECK(cuda::launch_add(a.ptr<float>(), b.ptr<float>(), out.ptr<float>(), a.numel(), compute_));
  }
  void mul(Tensor a, Tensor b, Tensor out) override {
    check_binary(a, b, out, "mul");
    CUDA_CHECK(cuda::launch_mul(a.ptr<float>(), b.ptr<float>(), out.ptr<float>(), a.numel(), compute_));
  }

  void sum(Tensor x, Tensor out, bool accumulate) override { reduce(x, out, accumulate, ReduceKind::sum, "sum"); }
  void sum_squares(Tensor x, Tensor out, bool accumulate) override {
    reduce(x, out, accumulate, ReduceKind::sum_squares, "sum_squares");
  }
  void max_abs(Tensor x, Tensor out, bool accumulate) override {
    reduce(x, out, accumulate, ReduceKind::max_abs, "max_abs");
  }

  void sum_rows(Tensor x, Tensor out, bool accumulate) override {
    check_f32(x, "sum_rows");
    check_f32(out, "sum_rows");
    SHARD_CHECK(x.ndim() == 2 && out.numel() == x.dim(1), "sum_rows: x {} and out {}", x.shape_str(),
                out.shape_str());
    CUDA_CHECK(cuda::launch_sum_rows(x.ptr<float>(), x.dim(0), x.dim(1), out.ptr<float>(), accumulate, compute_));
  }

  // ---- GPT-2 and optimizer kernels: not yet on CUDA. They fail loudly rather than compute nothing. ----
  [[noreturn]] static void not_yet(const char* op) {
    throw InputError(fmt::format("{} is not implemented on the CUDA backend yet: use --device cpu", op));
  }
  void embedding_forward(Tensor, const int32_t*, int64_t, int64_t, Tensor, Tensor) override { not_yet("embedding_forward"); }
  void embedding_backward(Tensor, Tensor, Tensor, const int32_t*, int64_t, int64_t) override { not_yet("embedding_backward"); }
  void layernorm_forward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor) override { not_yet("layernorm_forward"); }
  void layernorm_backward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor) override { not_yet("layernorm_backward"); }
  void add_bias(Tensor, Tensor) override { not_yet("add_bias"); }
  void gelu_forward(Tensor, Tensor) override { not_yet("gelu_forward"); }
  void gelu_backward(Tensor, Tensor, Tensor) override { not_yet("gelu_backward"); }
  void attention_forward(Tensor, Tensor, Tensor, int64_t) override { not_yet("attention_forward"); }
  void attention_backward(Tensor, Tensor, Tensor, Tensor, int64_t, Tensor) override { not_yet("attention_backward"); }
  void cross_entropy(Tensor, Tensor, Tensor, const int32_t*, float) override { not_yet("cross_entropy"); }
  void adamw_update(Tensor, Tensor, Tensor, Tensor, const AdamWArgs&) override { not_yet("adamw_update"); }
  void sgd_update(Tensor, Tensor, Tensor, const SgdArgs&) override { not_yet("sgd_update"); }

 private:
  cudaStream_t stream(StreamKind s) const { return s == StreamKind::compute ? compute_ : comm_; }

  static void check_pair(const Tensor& a, const Tensor& b, const char* op) {
    check_f32(a, op);
    check_f32(b, op);
    check_same_numel(a, b, op);
  }

  static void check_binary(const Tensor& a, const Tensor& b, const Tensor& out, const char* name) {
    check_pair(a, b, name);
    check_pair(a, out, name);
  }

  void reduce(Tensor x, Tensor out, bool accumulate, ReduceKind k, const char* name) {
    check_f32(x, name);
    check_f32(out, name);
    SHARD_CHECK(out.numel() == 1, "{}: out must hold 1 element, has {}", name, out.numel());
    CUDA_CHECK(cuda::launch_reduce(x.ptr<float>(), x.numel(), k, partial_, out.ptr<float>(), accumulate, compute_));
  }

  int device_ = 0;
  std::string name_;
  cudaStream_t compute_{};
  cudaStream_t comm_{};
  cublasHandle_t cublas_{};
  cudaMemPool_t mempool_{};  // the Pool's device memory
  double* partial_ = nullptr;  // (cuda::kReduceBlocks,) per-block partial results of a reduction
  std::unique_ptr<Backend> host_;  // computes on the host tier (the offloaded optimizer)
  BlockCache pinned_cache_{256, size_t{1} << 30};  // freed pinned host blocks
};

}  // namespace

bool cuda_compiled() { return true; }

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(const BackendConfig& cfg) { return std::make_unique<CudaBackend>(cfg); }

}  // namespace shardlab
