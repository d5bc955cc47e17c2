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
#include <array>
#include <climits>
#include <cstring>
#include <cmath>
#include <vector>

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
    cudaFreeAsync(partial_, compute_);
    scratch_.release(compute_);
    gemm_scratch_.release(compute_);
    cudaStreamSynchronize(compute_);
    cudaStreamSynchronize(comm_);
    pinned_cache_.release_all([](void* p) { cudaFreeHost(p); });
    for (IdSlot& slot : id_slots_) {
      if (slot.host) cudaFreeHost(slot.host);
      if (slot.copied) cudaEventDestroy(slot.copied);
    }
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

  bool low_precision_gemm() const override { return true; }

  void gemm(const GemmDesc& d, const void* a, const void* b, void* c) override {
    check_gemm(d);
    DType at = d.a_type, bt = d.b_type;
    if (d.round_inputs_to != DType::f32 && (at == DType::f32 || bt == DType::f32)) {
      // f32 operands rounded to round_inputs_to in the GEMM scratch, so both run on the tensor cores.
      const int64_t na = operand_elems(d.batch, d.stride_a, d.trans_a == Trans::N ? d.m : d.k, d.lda);
      const int64_t nb = operand_elems(d.batch, d.stride_b, d.trans_b == Trans::N ? d.k : d.n, d.ldb);
      const size_t half = dtype_size(d.round_inputs_to);
      const size_t a_bytes = at == DType::f32 ? (static_cast<size_t>(na) * half + 255) / 256 * 256 : 0;
      char* scratch = static_cast<char*>(gemm_scratch_.get(a_bytes + (bt == DType::f32 ? nb * half : 0), compute_));
      if (at == DType::f32) {
        CUDA_CHECK(cuda::launch_cast(a, DType::f32, scratch, d.round_inputs_to, na, compute_));
        a = scratch, at = d.round_inputs_to;
      }
      if (bt == DType::f32) {
        CUDA_CHECK(cuda::launch_cast(b, DType::f32, scratch + a_bytes, d.round_inputs_to, nb, compute_));
        b = scratch + a_bytes, bt = d.round_inputs_to;
      }
    }
    SHARD_CHECK(at == bt, "cuda gemm: A is {} and B {}; mixed operands need round_inputs_to", dtype_name(at),
                dtype_name(bt));
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
    cublasOperation_t opa = d.trans_a == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T;
    cublasOperation_t opb = d.trans_b == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T;
    const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // f32 accumulation for every input type
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(cublas_, opb, opa, static_cast<int>(d.n), static_cast<int>(d.m),
                                            static_cast<int>(d.k), &d.alpha, b, cuda_type(bt),
                                            static_cast<int>(d.ldb), d.stride_b, a, cuda_type(at),
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

  // ---- GPT-2 and optimizer kernels ----
  // Token ids are host memory (the trainer's Batch holds host vectors): they are checked on the
  // host, as the CPU kernels check them, and copied to device scratch on the compute stream.
  void embedding_forward(Tensor out, const int32_t* tokens, int64_t B, int64_t T, Tensor wte, Tensor wpe) override {
    const int64_t C = embedding_shape(out, wte, wpe, B, T);
    const int32_t* ids = upload_ids(tokens, B * T, wte.dim(0), "token");
    CUDA_CHECK(cuda::launch_embedding_forward(out.ptr<float>(), ids, wte.ptr<float>(), wpe.ptr<float>(), B, T, C,
                                              compute_));
  }
  // Deterministic without atomics: positions are grouped by token on the host (a stable counting
  // sort), and one block per distinct token adds its positions' rows in ascending order, as the CPU.
  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int64_t B,
                          int64_t T) override {
    const int64_t C = embedding_backward_shape(dwte, dwpe, dout, B, T);
    CUDA_CHECK(cuda::launch_embedding_backward_dwpe(dwpe.ptr<float>(), dout.ptr<float>(), B, T, C, compute_));
    const int64_t buckets = group_positions_by_token(tokens, B * T, dwte.dim(0));
    const int32_t* grouped = upload_host_ids();  // [bucket tokens | offsets | positions]
    CUDA_CHECK(cuda::launch_embedding_backward_dwte(dwte.ptr<float>(), dout.ptr<float>(), grouped, grouped + buckets,
                                                    grouped + 2 * buckets + 1, buckets, C, compute_));
  }
  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias) override {
    const auto [N, C] = layernorm_shape(out, mean, rstd, inp, weight, bias, "layernorm_forward");
    CUDA_CHECK(cuda::launch_layernorm_forward(out.ptr<float>(), mean.ptr<float>(), rstd.ptr<float>(), inp.ptr<float>(),
                                              weight.ptr<float>(), bias.ptr<float>(), N, C, compute_));
  }
  void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                          Tensor mean, Tensor rstd) override {
    const auto [N, C] = layernorm_backward_shape(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
    auto* workspace = static_cast<float*>(device_scratch(cuda::layernorm_backward_workspace(N, C) * sizeof(float)));
    CUDA_CHECK(cuda::launch_layernorm_backward(dinp.ptr<float>(), dweight.ptr<float>(), dbias.ptr<float>(),
                                               dout.ptr<float>(), inp.ptr<float>(), weight.ptr<float>(),
                                               mean.ptr<float>(), rstd.ptr<float>(), workspace, N, C, compute_));
  }
  void add_bias(Tensor x, Tensor bias) override {
    CUDA_CHECK(cuda::launch_add_bias(x.ptr<float>(), bias.ptr<float>(), bias_rows(x, bias), bias.numel(), compute_));
  }
  void gelu_forward(Tensor out, Tensor inp) override {
    check_same_numel(out, inp, "gelu_forward");
    CUDA_CHECK(cuda::launch_gelu_forward(out.ptr<float>(), inp.ptr<float>(), inp.numel(), compute_));
  }
  void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) override {
    check_same_numel(dinp, inp, "gelu_backward");
    check_same_numel(dout, inp, "gelu_backward");
    CUDA_CHECK(cuda::launch_gelu_backward(dinp.ptr<float>(), inp.ptr<float>(), dout.ptr<float>(), inp.numel(),
                                          compute_));
  }
  // Per batch entry, GEMMs batched over the H heads: head h's q, k, v are columns [h*hs, (h+1)*hs)
  // of the (T, 3C) rows (leading dimension 3C, batch stride hs), and its output goes to the same
  // columns of (T, C), as on the CPU.
  void attention_forward(Tensor out, Tensor att, Tensor qkv, int64_t H) override {
    auto [B, T, C] = attention_shape(qkv, out, att, H, "attention_forward");
    const int64_t hs = C / H, C3 = 3 * C, TT = T * T;
    const float scale = 1.f / std::sqrt(static_cast<float>(hs));
    for (int64_t b = 0; b < B; ++b) {  // scores, scaled: att = scale * q k^T
      const float* q = qkv.ptr<float>() + b * T * C3;
      gemm({.trans_b = Trans::T, .m = T, .n = T, .k = hs, .alpha = scale, .lda = C3, .ldb = C3, .ldc = T,
            .batch = H, .stride_a = hs, .stride_b = hs, .stride_c = TT},
           q, q + C, att.ptr<float>() + b * H * TT);
    }
    CUDA_CHECK(cuda::launch_causal_softmax(att.ptr<float>(), B * H * T, T, compute_));
    for (int64_t b = 0; b < B; ++b) {  // out_h = att v
      gemm({.m = T, .n = hs, .k = T, .lda = T, .ldb = C3, .ldc = C, .batch = H, .stride_a = TT, .stride_b = hs,
            .stride_c = hs},
           att.ptr<float>() + b * H * TT, qkv.ptr<float>() + b * T * C3 + 2 * C, out.ptr<float>() + b * T * C);
    }
  }
  void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor att, int64_t H, Tensor scratch) override {
    auto [B, T, C] = attention_shape(qkv, dout, att, H, "attention_backward");
    check_attention_backward(dqkv, qkv, scratch, T, H);
    const int64_t hs = C / H, C3 = 3 * C, TT = T * T;
    const float scale = 1.f / std::sqrt(static_cast<float>(hs));
    float* datt = scratch.ptr<float>();  // (H, T, T), reused by every batch entry (stream order)
    for (int64_t b = 0; b < B; ++b) {
      const float* q = qkv.ptr<float>() + b * T * C3;
      float* dq = dqkv.ptr<float>() + b * T * C3;
      const float* a = att.ptr<float>() + b * H * TT;
      const float* dh = dout.ptr<float>() + b * T * C;
      gemm({.trans_b = Trans::T, .m = T, .n = T, .k = hs, .lda = C, .ldb = C3, .ldc = T, .batch = H,
            .stride_a = hs, .stride_b = hs, .stride_c = TT},
           dh, q + 2 * C, datt);  // d(att) = dh v^T
      gemm({.trans_a = Trans::T, .m = T, .n = hs, .k = T, .lda = T, .ldb = C, .ldc = C3, .batch = H,
            .stride_a = TT, .stride_b = hs, .stride_c = hs},
           a, dh, dq + 2 * C);  // dv = att^T dh
      CUDA_CHECK(cuda::launch_causal_softmax_backward(datt, a, H * T, T, scale, compute_));
      const GemmDesc dpre_times{.m = T, .n = hs, .k = T, .lda = T, .ldb = C3, .ldc = C3, .batch = H,
                                .stride_a = TT, .stride_b = hs, .stride_c = hs};
      gemm(dpre_times, datt, q + C, dq);  // dq = dpre k
      GemmDesc dpre_t_times = dpre_times;
      dpre_t_times.trans_a = Trans::T;
      gemm(dpre_t_times, datt, q, dq + C);  // dk = dpre^T q
    }
  }
  void cross_entropy(Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets,
                     float dloss_scale) override {
    const auto [N, V] = cross_entropy_shape(losses, dlogits, logits);
    float* d = dlogits.data() ? dlogits.ptr<float>() : nullptr;
    const int32_t* ids = upload_ids(targets, N, V, "target");
    CUDA_CHECK(cuda::launch_cross_entropy(losses.ptr<float>(), d, logits.ptr<float>(), ids, N, V, dloss_scale,
                                          compute_));
  }

  // ---- optimizers ----
  void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWArgs& a) override {
    check_same_numel(param, grad, "adamw_update");
    check_same_numel(param, m, "adamw_update");
    check_same_numel(param, v, "adamw_update");
    // Bias corrections on the host, in float, exactly as the CPU kernel computes them.
    const float inv_bc1 = 1.f / (1.f - std::pow(a.beta1, static_cast<float>(a.step)));
    const float inv_bc2 = 1.f / (1.f - std::pow(a.beta2, static_cast<float>(a.step)));
    const cuda::AdamWStep s{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale, inv_bc1, inv_bc2};
    CUDA_CHECK(cuda::launch_adamw(param.ptr<float>(), grad.ptr<float>(), m.ptr<float>(), v.ptr<float>(),
                                  param.numel(), s, compute_));
  }
  void sgd_update(Tensor param, Tensor grad, Tensor momentum, const SgdArgs& a) override {
    check_same_numel(param, grad, "sgd_update");
    check_same_numel(param, momentum, "sgd_update");
    CUDA_CHECK(cuda::launch_sgd(param.ptr<float>(), grad.ptr<float>(), momentum.ptr<float>(), param.numel(), a.lr,
                                a.momentum, a.weight_decay, a.grad_scale, compute_));
  }

 private:
  cudaStream_t stream(StreamKind s) const { return s == StreamKind::compute ? compute_ : comm_; }

  // Elements an operand spans: `rows` rows of `ld` in each of `batch` entries `stride` apart.
  static int64_t operand_elems(int64_t batch, int64_t stride, int64_t rows, int64_t ld) {
    return (batch - 1) * stride + rows * ld;
  }

  void* device_scratch(size_t bytes) { return scratch_.get(bytes, compute_); }

  // host_ids_ -> device scratch on the compute stream, through a pinned slot: from pageable
  // memory cudaMemcpyAsync would first wait for the stream (a host sync per upload). The slot is
  // reused kIdSlots uploads later, once the copy that read it has run (its event).
  const int32_t* upload_host_ids() {
    const size_t bytes = host_ids_.size() * sizeof(int32_t);
    if (bytes == 0) return nullptr;
    IdSlot& slot = id_slots_[next_id_slot_++ % id_slots_.size()];
    if (slot.copied) CUDA_CHECK(cudaEventSynchronize(slot.copied));
    else CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
    if (slot.bytes < bytes) {
      if (slot.host) CUDA_CHECK(cudaFreeHost(slot.host));
      slot.host = nullptr;
      CUDA_CHECK(cudaMallocHost(&slot.host, bytes));
      slot.bytes = bytes;
    }
    std::memcpy(slot.host, host_ids_.data(), bytes);
    void* dev = device_scratch(bytes);
    CUDA_CHECK(cudaMemcpyAsync(dev, slot.host, bytes, cudaMemcpyHostToDevice, compute_));
    CUDA_CHECK(cudaEventRecord(slot.copied, compute_));
    return static_cast<const int32_t*>(dev);
  }

  // Checks n host ids against the vocabulary (the CPU kernels' check) and uploads them.
  const int32_t* upload_ids(const int32_t* ids, int64_t n, int64_t V, const char* what) {
    host_ids_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      SHARD_CHECK(ids[i] >= 0 && ids[i] < V, "{} id {} at position {} outside vocabulary of {}", what, ids[i], i, V);
      host_ids_[static_cast<size_t>(i)] = ids[i];
    }
    return upload_host_ids();
  }

  // Fills host_ids_ with [bucket tokens (U) | offsets (U + 1) | positions (n)]: the distinct tokens
  // in ascending order, and each one's positions, ascending (a stable counting sort). Returns U.
  int64_t group_positions_by_token(const int32_t* tokens, int64_t n, int64_t V) {
    SHARD_CHECK(n <= INT32_MAX, "embedding_backward: {} positions overflow int32 offsets", n);
    std::vector<int32_t> start(static_cast<size_t>(V) + 1, 0);  // start[v]: first slot of token v
    for (int64_t i = 0; i < n; ++i) {
      SHARD_CHECK(tokens[i] >= 0 && tokens[i] < V, "token id {} at position {} outside vocabulary of {}", tokens[i],
                  i, V);
      ++start[static_cast<size_t>(tokens[i]) + 1];
    }
    int64_t buckets = 0;
    for (int64_t v = 0; v < V; ++v) {
      buckets += start[static_cast<size_t>(v) + 1] > 0;
      start[static_cast<size_t>(v) + 1] += start[static_cast<size_t>(v)];
    }
    host_ids_.resize(static_cast<size_t>(2 * buckets + 1 + n));
    int32_t* bucket_token = host_ids_.data();
    int32_t* offsets = bucket_token + buckets;
    int32_t* positions = offsets + buckets + 1;
    int64_t u = 0;
    for (int64_t v = 0; v < V; ++v) {
      if (start[static_cast<size_t>(v) + 1] == start[static_cast<size_t>(v)]) continue;
      bucket_token[u] = static_cast<int32_t>(v);
      offsets[u++] = start[static_cast<size_t>(v)];
    }
    offsets[buckets] = static_cast<int32_t>(n);
    for (int64_t i = 0; i < n; ++i) positions[start[static_cast<size_t>(tokens[i])]++] = static_cast<int32_t>(i);
    return buckets;
  }

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
  Scratch scratch_;       // the GPT-2 kernels' (token ids, LayerNorm partials)
  Scratch gemm_scratch_;  // f32 GEMM operands rounded to bf16
  std::vector<int32_t> host_ids_;  // token ids (or their grouping) being prepared for upload
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
