// cuda_backend.cpp — the CUDA Backend's device, memory, streams and events, copies and matrix
// products (cuBLAS), and the factory (cuda_backend.hpp has the design notes). What copy and gemm
// put on the stream: copy_launches and gemm_launches (launches.hpp).
#include "src/backend/cuda/cuda_backend.hpp"

#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cstdint>

namespace shardlab {
namespace cuda {
namespace {

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

}  // namespace

CudaBackend::CudaBackend(const BackendConfig& cfg) {
  int count = cuda_device_count();
  SHARD_REQUIRE(count > 0, "--device cuda: no CUDA device is visible to this process");
  device_ = cfg.device_index >= 0 ? cfg.device_index : cfg.local_rank % count;
  SHARD_REQUIRE(device_ < count, "CUDA device {} requested, {} visible", device_, count);
  CUDA_CHECK(cudaSetDevice(device_));
  CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&cublas_));
  CUBLAS_CHECK(cublasSetStream(cublas_, compute_));
  CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device_;
  CUDA_CHECK(cudaMemPoolCreate(&mempool_, &props));
  uint64_t keep_all = UINT64_MAX;  // freed blocks stay in the pool for the next step
  CUDA_CHECK(cudaMemPoolSetAttribute(mempool_, cudaMemPoolAttrReleaseThreshold, &keep_all));
  CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partial_), kReduceBlocks * sizeof(double), compute_));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  name_ = prop.name;
  host_ = make_cpu_backend(cfg);
}

CudaBackend::~CudaBackend() {
  cudnn_state_.reset();  // its handle was set to the compute stream
  cudaFreeAsync(partial_, compute_);
  scratch_.release(compute_);
  gemm_scratch_.release(compute_);
  cudnn_scratch_.release(compute_);
  lt_scratch_.release(compute_);
  arrivals_.release(compute_);
  cudaStreamSynchronize(compute_);
  cudaStreamSynchronize(comm_);
  pinned_cache_.release_all([](void* p) { cudaFreeHost(p); });
  for (IdSlot& slot : id_slots_) {
    if (slot.host) cudaFreeHost(slot.host);
    if (slot.copied) cudaEventDestroy(slot.copied);
  }
  cudaMemPoolDestroy(mempool_);
  cublasDestroy(cublas_);
  cublasLtDestroy(cublaslt_);
  cudaStreamDestroy(comm_);
  cudaStreamDestroy(compute_);
}

std::string CudaBackend::describe() const { return fmt::format("cuda:{} ({})", device_, name_); }

void* CudaBackend::raw_alloc(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMallocFromPoolAsync(&p, std::max<size_t>(bytes, 1), mempool_, compute_));
  return p;
}

void CudaBackend::raw_free(void* p, size_t) { CUDA_CHECK(cudaFreeAsync(p, compute_)); }

// The host tier is pinned, so copies to and from it can run asynchronously on a stream.
// cudaMallocHost costs milliseconds and offload stages a buffer per unit per step, so freed
// pinned blocks are kept by size (at most 1 GiB of them) and handed out again.
void* CudaBackend::raw_alloc_host(size_t bytes) {
  const size_t rounded = pinned_cache_.round(bytes);
  if (void* p = pinned_cache_.take(rounded)) return p;
  void* p = nullptr;
  CUDA_CHECK(cudaMallocHost(&p, rounded));
  return p;
}

void CudaBackend::raw_free_host(void* p, size_t bytes) {
  CUDA_CHECK(cudaStreamSynchronize(compute_));  // a copy issued on the stream may still read it
  if (!pinned_cache_.keep(p, pinned_cache_.round(bytes))) CUDA_CHECK(cudaFreeHost(p));
}

void CudaBackend::range_push(const char* name) { nvtxRangePushA(name); }
void CudaBackend::range_pop() { nvtxRangePop(); }

Backend::DeviceMemory CudaBackend::device_memory() const {
  DeviceMemory m;
  size_t free = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  m.free = free, m.total = total;
  CUDA_CHECK(cudaMemPoolGetAttribute(mempool_, cudaMemPoolAttrReservedMemCurrent, &m.reserved));
  return m;
}

void CudaBackend::copy(Tensor dst, Tensor src) {
  check_same_numel(dst, src, "copy");
  SHARD_CHECK(dst.dtype() == src.dtype(), "copy: dtypes differ ({} <- {}); use cast", dtype_name(dst.dtype()),
              dtype_name(src.dtype()));
  CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.bytes(), cudaMemcpyDefault, compute_));
  if (dst.device() == Device::cpu || src.device() == Device::cpu) CUDA_CHECK(cudaStreamSynchronize(compute_));
}

std::unique_ptr<Event> CudaBackend::record(StreamKind s) {
  auto e = std::make_unique<CudaEvent>();
  CUDA_CHECK(cudaEventRecord(e->get(), stream(s)));
  return e;
}

void CudaBackend::wait(StreamKind s, const Event& e) {
  CUDA_CHECK(cudaStreamWaitEvent(stream(s), static_cast<const CudaEvent&>(e).get(), 0));
}

void CudaBackend::synchronize() {
  CUDA_CHECK(cudaStreamSynchronize(compute_));
  CUDA_CHECK(cudaStreamSynchronize(comm_));
}

// ---- matrix products ----------------------------------------------------------------------------

void CudaBackend::gemm(const GemmDesc& d, const void* a, const void* b, void* c) {
  check_gemm(d);
  product(d, rounded(d, a, b), c);
}

CudaBackend::Operands CudaBackend::rounded(const GemmDesc& d, const void* a, const void* b) {
  DType at = d.a_type, bt = d.b_type;
  // The casts and the product of gemm_launches(d): the casts' grids are cast_launches', which
  // launch_cast reads, and which operands they round is gemm_rounds'.
  const bool round_a = gemm_rounds(d, at), round_b = gemm_rounds(d, bt);
  if (round_a || round_b) {
    // f32 operands rounded to round_inputs_to in the GEMM scratch, so both run on the tensor cores.
    const int64_t na = gemm_operand_elems(d.batch, d.stride_a, d.trans_a == Trans::N ? d.m : d.k, d.lda);
    const int64_t nb = gemm_operand_elems(d.batch, d.stride_b, d.trans_b == Trans::N ? d.k : d.n, d.ldb);
    const size_t half = dtype_size(d.round_inputs_to);
    const size_t a_bytes = round_a ? (static_cast<size_t>(na) * half + 255) / 256 * 256 : 0;
    char* scratch = static_cast<char*>(gemm_scratch_.get(a_bytes + (round_b ? nb * half : 0), compute_));
    if (round_a) {
      CUDA_CHECK(launch_cast(a, DType::f32, scratch, d.round_inputs_to, na, compute_));
      a = scratch, at = d.round_inputs_to;
    }
    if (round_b) {
      CUDA_CHECK(launch_cast(b, DType::f32, scratch + a_bytes, d.round_inputs_to, nb, compute_));
      b = scratch + a_bytes, bt = d.round_inputs_to;
    }
  }
  SHARD_CHECK(at == bt, "cuda gemm: A is {} and B {}; mixed operands need round_inputs_to", dtype_name(at),
              dtype_name(bt));
  return {a, b, at, bt};
}

void CudaBackend::product(const GemmDesc& d, const Operands& o, void* c) {
  const void* a = o.a;
  const void* b = o.b;
  const DType at = o.at, bt = o.bt;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  cublasOperation_t opa = d.trans_a == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T;
  cublasOperation_t opb = d.trans_b == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // f32 accumulation for every input type
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(cublas_, opb, opa, static_cast<int>(d.n), static_cast<int>(d.m),
                                          static_cast<int>(d.k), &d.alpha, b, cuda_type(bt), static_cast<int>(d.ldb),
                                          d.stride_b, a, cuda_type(at), static_cast<int>(d.lda), d.stride_a, &d.beta,
                                          c, cuda_type(d.c_type), static_cast<int>(d.ldc), d.stride_c,
                                          static_cast<int>(d.batch), compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace cuda

bool cuda_compiled() { return true; }

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(const BackendConfig& cfg) {
  return std::make_unique<cuda::CudaBackend>(cfg);
}

}  // namespace shardlab
