// gemm_epilogue.cpp — CudaBackend::gemm_epilogue: a product and its epilogue (bias, bias + GELU
// keeping the sum, GELU's backward) in one cuBLASLt call, as llm.c's matmul_cublaslt does for
// GPT-2's linear layers, instead of the product and then add_bias, gelu_forward or gelu_backward
// kernels, for products on bf16 operands (fuses_gemm_epilogue; f32 runs keep the f32 kernels'
// GELU). Where cuBLASLt does not take a product (its alignment and type rules, a refused call),
// gemm_epilogue says so (once on stderr) and the caller runs the product and those kernels.
//
// Row-major C (m, n) = op(A) op(B) is column-major C^T (n, m) = op(B)^T op(A)^T, as in gemm(): in
// cuBLASLt's terms M = n, N = m, K = k, its A is our B and its B our A. Its bias is M long, one
// per row of the column-major result: one per column n of ours, nn.Linear's. The auxiliary
// (pre-GELU) buffer is laid out as C. A bias gradient (BGRADA) is written where the bias would be
// read, f32, one per column n of ours.
#include "src/backend/cuda/cuda_backend.hpp"

namespace shardlab::cuda {
namespace {

// The descriptors of one call, destroyed with it.
struct LtCall {
  cublasLtMatmulDesc_t op{};
  cublasLtMatrixLayout_t a{}, b{}, c{};
  cublasLtMatmulPreference_t pref{};
  LtCall() = default;
  LtCall(const LtCall&) = delete;
  LtCall& operator=(const LtCall&) = delete;
  ~LtCall() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

template <class T>
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value)));
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::bias_gelu: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    // Its A is our B, untransposed (cuBLASLt's rule for BGRADA): the sums over K are per row of
    // the column-major result, per column n of ours.
    case GemmEpilogue::bias_grad: return CUBLASLT_EPILOGUE_BGRADA;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The largest power of two up to 256 dividing a pointer: what cuBLASLt's heuristic may assume of it
// (it assumes 256 unless told; a weight's view inside a unit's flat buffer often sits off that).
uint32_t alignment(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

// cuBLASLt's workspace: what it may use for any algorithm it picks (32 MiB, as cuBLAS asks on Hopper).
constexpr size_t kLtWorkspace = size_t{32} << 20;

}  // namespace

bool CudaBackend::lt_product(const GemmDesc& d, const Operands& o, void* c, GemmEpilogue e, const float* bias,
                             void* aux) {
  // Every pointer 16-byte aligned (the tensor-core kernels' loads) and the auxiliary buffer's rows
  // a multiple of 8 elements (cuBLASLt's rule); else the caller's composition.
  if (!aligned16(o.a, o.b, c, bias, aux) || (aux != nullptr && d.n % 8 != 0)) return false;
  const uint64_t M = static_cast<uint64_t>(d.n), N = static_cast<uint64_t>(d.m), K = static_cast<uint64_t>(d.k);
  const cublasOperation_t opa = d.trans_b == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T;  // on our B
  const cublasOperation_t opb = d.trans_a == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T;  // on our A
  LtCall call;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&call.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set(call.op, CUBLASLT_MATMUL_DESC_TRANSA, opa);
  set(call.op, CUBLASLT_MATMUL_DESC_TRANSB, opb);
  set(call.op, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(e));
  if (bias != nullptr) {
    set(call.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    set(call.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(CUDA_R_32F));
  }
  if (aux != nullptr) {  // of C's type (f32 or bf16), cuBLASLt's default
    set(call.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    set(call.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(d.ldc));
  }
  // Stored shapes (rows, columns, leading dimension) in column-major terms, before the ops.
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&call.a, cuda_type(o.bt), opa == CUBLAS_OP_N ? M : K,
                                          opa == CUBLAS_OP_N ? K : M, d.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&call.b, cuda_type(o.at), opb == CUBLAS_OP_N ? K : N,
                                          opb == CUBLAS_OP_N ? N : K, d.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&call.c, cuda_type(d.c_type), M, N, d.ldc));
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&call.pref));
  const uint64_t workspace_bytes = kLtWorkspace;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof(workspace_bytes)));
  // cuBLASLt's A is our B, its B our A, and C is D.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, o.b}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, o.a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, c}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, c}};
  for (const auto& [attr, p] : aligns) {
    const uint32_t bytes = alignment(p);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(call.pref, attr, &bytes, sizeof(bytes)));
  }
  cublasLtMatmulHeuristicResult_t found{};
  int count = 0;
  if (cublasLtMatmulAlgoGetHeuristic(cublaslt_, call.op, call.a, call.b, call.c, call.c, call.pref, 1, &found,
                                     &count) != CUBLAS_STATUS_SUCCESS ||
      count == 0)
    return false;
  void* workspace = lt_scratch_.get(kLtWorkspace, compute_);
  const float one = 1.f, beta = d.beta;  // beta 1: C read and summed in place (a residual)
  // A refusal enqueues nothing: the composition runs instead.
  if (cublasLtMatmul(cublaslt_, call.op, &one, o.b, call.a, o.a, call.b, &beta, c, call.c, c, call.c, &found.algo,
                     workspace, kLtWorkspace, compute_) != CUBLAS_STATUS_SUCCESS)
    return false;
  CUDA_CHECK(cudaGetLastError());
  return true;
}

bool CudaBackend::gemm_epilogue(const GemmDesc& d, const void* a, const void* b, void* c, GemmEpilogue e,
                                const float* bias, void* aux) {
  check_gemm_epilogue(d, e, bias, aux);
  SHARD_CHECK(fuses_gemm_epilogue(d), "cuda gemm with a {} epilogue: f32 operands are not fused (fuses_gemm_epilogue)",
              gemm_epilogue_name(e));
  if (lt_product(d, rounded(d, a, b), c, e, bias, aux)) return true;
  return lt_refused(d, e);
}

bool CudaBackend::gemm_bias_grad(const GemmDesc& d, const void* a, const void* b, void* c, float* dbias) {
  check_gemm_epilogue(d, GemmEpilogue::bias_grad, dbias, nullptr);
  SHARD_CHECK(fuses_gemm_epilogue(d), "cuda gemm with a bias gradient: f32 operands are not fused");
  if (lt_product(d, rounded(d, a, b), c, GemmEpilogue::bias_grad, dbias, nullptr)) return true;
  return lt_refused(d, GemmEpilogue::bias_grad);
}

bool CudaBackend::lt_refused(const GemmDesc& d, GemmEpilogue e) {
  if (!lt_warned_)
    fmt::print(stderr, "shardlab: cuBLASLt did not take a {} x {} x {} product with a {} epilogue on {} (alignment, "
               "shape or status): the product, then the epilogue's own kernels\n", d.m, d.n, d.k,
               gemm_epilogue_name(e), describe());
  lt_warned_ = true;
  return false;
}

}  // namespace shardlab::cuda
