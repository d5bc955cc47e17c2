// cuda_backend.hpp — the CUDA Backend's declaration: cuBLAS for GEMMs (f32, or bf16/f16 inputs
// with f32 accumulation), the kernels of the .cu files (kernels.cuh) for the rest, one compute and
// one comm stream per rank. Private to src/backend/cuda/; everything else gets one from
// make_cuda_backend(). Host code, compiled by the C++ compiler; only the .cu files go through nvcc.
//
// Implemented in:
//   cuda_backend.cpp      device, memory, streams and events, copies, matrix products
//   cuda_elementwise.cpp  element-wise operations and reductions
//   token_ids.cpp         the upload of the token ids the operation families take from the host
// and the operation families (src/backend/ops/) in one file each, cuda/<family>.cpp (ops.hpp)
// with its kernels in cuda/<family>.cu; they reach this class through CudaBackend::of.
//
// Design notes.
//  * What each operation puts on the stream (kernels and their grids, cuBLAS calls, copies) is
//    declared once in launches.hpp, in plain C++: the launchers (kernels.cuh) read their grids
//    from it and the meta backend counts the same lists. The host files check launches (the
//    operation families validated the tensors).
//  * Memory is stream-ordered (cudaMallocFromPoolAsync on the compute stream, from a memory pool
//    of this backend's own that keeps what it frees), so freeing a block never synchronises the
//    device, and the pool's reserved bytes tell the Pool's memory from everything else on the GPU.
//  * Copies that touch host memory synchronise the compute stream: the host buffer may be pageable
//    and the caller expects it filled (or free to reuse) when copy() returns.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "src/backend/backend.hpp"
#include "src/backend/block_cache.hpp"
#include "src/backend/cuda/cuda_check.hpp"
#include "src/backend/cuda/kernels.cuh"

namespace shardlab::cuda {

// The CUDA library type of a dtype.
inline cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

// n host ids in [0, V): the CPU kernels' check, with their message (token_ids.cpp).
void check_ids(const int32_t* ids, int64_t n, int64_t V, const char* what);

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendConfig& cfg);
  ~CudaBackend() override;

  // ---- device, memory, streams, copies (cuda_backend.cpp) ----
  Device device() const override { return Device::cuda; }
  std::string describe() const override;
  int threads() const override { return 1; }
  void* raw_alloc(size_t bytes) override;
  void raw_free(void* p, size_t) override;
  void* raw_alloc_host(size_t bytes) override;
  void raw_free_host(void* p, size_t bytes) override;
  Backend& host() override { return *host_; }
  void* native_stream(StreamKind s) override { return stream(s); }
  int device_index() const override { return device_; }
  void range_push(const char* name) override;
  void range_pop() override;
  DeviceMemory device_memory() const override;
  void copy(Tensor dst, Tensor src) override;
  std::unique_ptr<Event> record(StreamKind s) override;
  void wait(StreamKind s, const Event& e) override;
  void synchronize() override;
  bool low_precision_gemm() const override { return true; }
  bool reduces_bf16() const override { return true; }

  // ---- matrix products (cuda_backend.cpp; with epilogues, cuBLASLt: gemm_epilogue.cpp) ----
  void gemm(const GemmDesc& d, const void* a, const void* b, void* c) override;
  bool fuses_gemm_epilogue(const GemmDesc& d) const override { return low_precision_product(d); }
  bool gemm_epilogue(const GemmDesc& d, const void* a, const void* b, void* c, GemmEpilogue e, const float* bias,
                     void* aux) override;
  bool gemm_bias_grad(const GemmDesc& d, const void* a, const void* b, void* c, float* dbias) override;

  // ---- element-wise, reductions (cuda_elementwise.cpp) ----
  void fill(Tensor x, float value) override;
  void cast(Tensor dst, Tensor src) override;
  void cast_ranges(Tensor dst, Tensor src, std::span<const ElemRange> ranges) override;
  void axpy(float alpha, Tensor x, Tensor y) override;
  void scale(Tensor x, float alpha) override;
  void add(Tensor a, Tensor b, Tensor out) override;
  void mul(Tensor a, Tensor b, Tensor out) override;
  void add_into(Tensor dst, Tensor src) override;
  void add_bias(Tensor x, Tensor bias) override;
  void sum(Tensor x, Tensor out, bool accumulate) override;
  void sum_squares(Tensor x, Tensor out, bool accumulate) override;
  void max_abs(Tensor x, Tensor out, bool accumulate) override;
  void sum_rows(Tensor x, Tensor out, bool accumulate) override;

  // ---- for the operation families' implementations (cuda/<family>.cpp) ----
  // be, which must be a CudaBackend (the families dispatch here only for Device::cuda).
  static CudaBackend& of(Backend& be) {
    SHARD_CHECK(be.device() == Device::cuda, "a CUDA operation on a {} backend", device_name(be.device()));
    return static_cast<CudaBackend&>(be);
  }
  cudaStream_t compute_stream() const { return compute_; }
  void* device_scratch(size_t bytes) { return scratch_.get(bytes, compute_); }
  // n counters that are zero between the kernels that use them (each resets what it counted): zeroed
  // once when they grow (a memset on the compute stream, the first call's only).
  unsigned* arrival_counters(int64_t n) {
    const size_t want = static_cast<size_t>(n) * sizeof(unsigned);
    if (want > arrivals_.bytes) {
      arrivals_.get(want, compute_);
      CUDA_CHECK(cudaMemsetAsync(arrivals_.p, 0, want, compute_));
    }
    return static_cast<unsigned*>(arrivals_.p);
  }
  // cuDNN attention (cudnn_attention.cpp): its handle and built graphs, made on first use and
  // released before the streams; its workspace, outside the Pool like cuBLAS's.
  std::shared_ptr<void>& cudnn_state() { return cudnn_state_; }
  void* cudnn_workspace(size_t bytes) { return cudnn_scratch_.get(bytes, compute_); }
  // Token ids (token_ids.cpp): host_ids_ uploaded; n ids checked against V and uploaded; the rows
  // of a vocabulary shard [v0, v0 + rows) of n ids (-1 for other ranks'), on the host or uploaded;
  // host_ids_ = positions grouped by row (embedding_backward's buckets), returning their count.
  const int32_t* upload_host_ids();
  const int32_t* upload_ids(const int32_t* ids, int64_t n, int64_t V, const char* what);
  const int32_t* host_shard_rows(const int32_t* ids, int64_t n, int64_t v0, int64_t rows, const char* what);
  const int32_t* upload_shard_rows(const int32_t* ids, int64_t n, int64_t v0, int64_t rows, const char* what);
  int64_t group_positions_by_row(const int32_t* rows, int64_t n, int64_t V);

 private:
  cudaStream_t stream(StreamKind s) const { return s == StreamKind::compute ? compute_ : comm_; }
  // A product's operands as it reads them: f32 ones rounded to round_inputs_to in the GEMM scratch
  // first (gemm_launches' casts), so that both run on the tensor cores.
  struct Operands {
    const void* a;
    const void* b;
    DType at, bt;
  };
  Operands rounded(const GemmDesc& d, const void* a, const void* b);
  void product(const GemmDesc& d, const Operands& o, void* c);  // cuBLAS, no epilogue
  // The product and its epilogue in one cuBLASLt call; false where cuBLASLt offers no algorithm.
  bool lt_product(const GemmDesc& d, const Operands& o, void* c, GemmEpilogue e, const float* bias, void* aux);
  bool lt_refused(const GemmDesc& d, GemmEpilogue e);  // says so once on stderr; false
  void reduce(Tensor x, Tensor out, bool accumulate, ReduceKind k, const char* name);

  void shard_rows(const int32_t* ids, int64_t n, int64_t v0, int64_t rows, const char* what,
                  std::vector<int32_t>& out);

  int device_ = 0;
  std::string name_;
  cudaStream_t compute_{};
  cudaStream_t comm_{};
  cublasHandle_t cublas_{};
  cublasLtHandle_t cublaslt_{};
  bool lt_warned_ = false;  // a product whose epilogue cuBLASLt would not fuse was said once
  cudaMemPool_t mempool_{};  // the Pool's device memory
  double* partial_ = nullptr;  // (kReduceBlocks,) per-block partial results of a reduction
  // Device memory outside the Pool (like cuBLAS's workspace), grown on demand. Freeing the old
  // buffer is ordered on the compute stream after every kernel that still reads it.
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
    void* get(size_t want, cudaStream_t s) {
      if (want > bytes) {
        if (p != nullptr) CUDA_CHECK(cudaFreeAsync(p, s));
        p = nullptr, bytes = 0;
        CUDA_CHECK(cudaMallocAsync(&p, want, s));
        bytes = want;
      }
      return p;
    }
    void release(cudaStream_t s) {
      if (p != nullptr) cudaFreeAsync(p, s);
      p = nullptr, bytes = 0;
    }
  };
  Scratch scratch_;       // the layers' operations' (token ids, LayerNorm and RMSNorm partials)
  Scratch gemm_scratch_;  // f32 GEMM operands rounded to bf16
  Scratch cudnn_scratch_;  // cuDNN's workspace
  Scratch lt_scratch_;     // cuBLASLt's workspace
  Scratch arrivals_;       // sum_rows' per-tile arrival counters (arrival_counters)
  std::shared_ptr<void> cudnn_state_;
  std::vector<int32_t> host_ids_;  // token ids (or their grouping) being prepared for upload
  std::vector<int32_t> shard_rows_;  // a vocabulary shard's rows of token ids, -1 for other ranks'
  struct IdSlot {
    void* host = nullptr;  // pinned
    size_t bytes = 0;
    cudaEvent_t copied{};  // the upload that last read it
  };
  std::array<IdSlot, 8> id_slots_{};
  size_t next_id_slot_ = 0;
  std::unique_ptr<Backend> host_;  // computes on the host tier (the offloaded optimizer)
  BlockCache pinned_cache_{256, size_t{1} << 30};  // freed pinned host blocks
};

}  // namespace shardlab::cuda
