// gemm.hpp — the CPU backend's sgemm: two libraries (oneDNN, OpenBLAS) and the rule that picks one
// per call from the host's vector ISA and the product's shape.
//
// The rule is fixed, not measured per process: a per-process measurement could pick differently in
// two runs of the same job, and a resumed run must repeat the bits of an uninterrupted one.
// `shardlab bench-gemm` times every candidate on a model's shapes and prints what the rule picks,
// so the rule can be checked on any host (docs/performance.md, "CPU GEMM").
#pragma once
#include <cstdint>
#include <string>

#include "src/backend/backend.hpp"

namespace shardlab::cpu {

enum class GemmLib { onednn, openblas };
// What --cpu-gemm asks for: the rule, or one library for every product.
enum class GemmPolicy { automatic, onednn, openblas };

const char* gemm_lib_name(GemmLib lib);
GemmPolicy parse_gemm_policy(const std::string& s);  // auto | onednn | openblas; InputError otherwise

// The vector ISA both libraries run with, as oneDNN sees it (ONEDNN_MAX_CPU_ISA caps it):
// "avx512" or "avx2" (anything narrower counts as avx2: the rule has measurements for these two).
bool host_avx512();
std::string gemm_isa_describe();  // e.g. "oneDNN avx2, OpenBLAS Haswell"
// The libraries linked, as they report themselves: "oneDNN 3.0.0 (...), OpenBLAS 0.3.21 ...".
std::string gemm_library_versions();

// C (m, n) = op(A) op(B), op(A) (m, k), row-major with leading dimensions lda and ldb (elements).
struct GemmShape {
  Trans ta = Trans::N, tb = Trans::N;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0;
};

// The library the rule picks for a product.
GemmLib gemm_rule(const GemmShape& s, bool avx512);

// Process-wide policy: the CPU kernels are free functions, so each CPU backend sets it from its
// --cpu-gemm when made (the last one made wins; a run makes one). Default automatic.
void set_gemm_policy(GemmPolicy p);
GemmPolicy gemm_policy();
GemmLib gemm_pick(const GemmShape& s);  // under the current policy

// Row-major C = alpha op(A) op(B) + beta C through one library.
void sgemm_with(GemmLib lib, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace shardlab::cpu
