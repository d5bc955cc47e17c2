// attention.cpp — the CUDA causal self-attention (ops/attention.hpp): cuBLAS products around the
// softmax kernels of attention.cu.
//
// Per batch entry, cuBLAS strided-batched GEMMs read q, k and v in place in the (T, R) rows, R =
// (H + KV) hd + KV vd (leading dimension R; query and key heads hd apart, value heads vd), and write
// the output to columns [h vd, (h+1) vd) of (T, Co), Co = H vd, as on the CPU (vd == hd but for
// DeepSeek's latent attention).
//
// Grouped-query heads: query head h = kv G + g (G = H / KV) reads K/V head kv. A strided batch has
// one stride per operand, and the query heads of a batch must all reach their K/V head by that
// stride: so each product is issued once per member g of the groups, batched over the KV groups
// (query-side strides G hd and G T^2, K/V-side stride hd), its query-side operands offset by g
// heads. The shared K/V heads are read in place, never gathered into copies of H heads. MHA is
// G = 1: one GEMM batched over the H heads per product, the same calls as before grouped heads.
// dK and dV sum over a group's query heads: the first member overwrites, the others add (beta = 1)
// in g order, so the result is deterministic. The products go through CudaBackend::gemm, whose
// launches are gemm_launches'; attention_*_launches (launches.hpp) list the softmax kernels only.
#include <cmath>

#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::cuda {
namespace {

// Issues `d` (batched over the KV groups) once per group member g in [0, G), with the operands
// advanced g steps; `sum` makes members after the first accumulate into C (its step is then 0).
void for_each_group_member(Backend& be, GemmDesc d, int64_t G, const float* a, int64_t a_step, const float* b,
                           int64_t b_step, float* c, int64_t c_step, bool sum) {
  for (int64_t g = 0; g < G; ++g) {
    if (sum && g > 0) d.beta = 1.f;
    be.gemm(d, a + g * a_step, b + g * b_step, c + g * c_step);
  }
}

}  // namespace

void attention_forward(Backend& be, Tensor out, Tensor att, Tensor qkv, int64_t H, int64_t KV, int64_t B, int64_t T,
                       int64_t hd, int64_t vd) {
  CudaBackend& cb = CudaBackend::of(be);
  const int64_t C = H * hd, Co = H * vd, G = H / KV, R = qkv.dim(2), TT = T * T;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  for (int64_t b = 0; b < B; ++b) {  // scores, scaled: att = scale * q k^T
    const float* q = qkv.ptr<float>() + b * T * R;
    for_each_group_member(be,
                          {.trans_b = Trans::T, .m = T, .n = T, .k = hd, .alpha = scale, .lda = R, .ldb = R, .ldc = T,
                           .batch = KV, .stride_a = G * hd, .stride_b = hd, .stride_c = G * TT},
                          G, q, hd, q + C, 0, att.ptr<float>() + b * H * TT, TT, false);
  }
  CUDA_CHECK(launch_causal_softmax(att.ptr<float>(), H, KV, B, T, C, cb.compute_stream()));
  for (int64_t b = 0; b < B; ++b) {  // out_h = att_h v
    const float* v = qkv.ptr<float>() + b * T * R + C + KV * hd;
    for_each_group_member(be,
                          {.m = T, .n = vd, .k = T, .lda = T, .ldb = R, .ldc = Co, .batch = KV, .stride_a = G * TT,
                           .stride_b = vd, .stride_c = G * vd},
                          G, att.ptr<float>() + b * H * TT, TT, v, 0, out.ptr<float>() + b * T * Co, vd, false);
  }
}

void attention_backward(Backend& be, Tensor dqkv, Tensor dout, Tensor qkv, Tensor att, int64_t H, int64_t KV,
                        Tensor scratch, int64_t B, int64_t T, int64_t hd, int64_t vd) {
  CudaBackend& cb = CudaBackend::of(be);
  const int64_t C = H * hd, Co = H * vd, G = H / KV, R = qkv.dim(2), TT = T * T, KVd = KV * hd;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  float* datt = scratch.ptr<float>();  // (H, T, T), reused by every batch entry (stream order)
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv.ptr<float>() + b * T * R;  // k at q + C, v at q + C + KVd; dqkv alike
    float* dq = dqkv.ptr<float>() + b * T * R;
    const float* a = att.ptr<float>() + b * H * TT;
    const float* dh = dout.ptr<float>() + b * T * Co;
    for_each_group_member(be,
                          {.trans_b = Trans::T, .m = T, .n = T, .k = vd, .lda = Co, .ldb = R, .ldc = T, .batch = KV,
                           .stride_a = G * vd, .stride_b = vd, .stride_c = G * TT},
                          G, dh, vd, q + C + KVd, 0, datt, TT, false);  // d(att) = dh v^T
    for_each_group_member(be,
                          {.trans_a = Trans::T, .m = T, .n = vd, .k = T, .lda = T, .ldb = Co, .ldc = R, .batch = KV,
                           .stride_a = G * TT, .stride_b = G * vd, .stride_c = vd},
                          G, a, TT, dh, vd, dq + C + KVd, 0, true);  // dv = sum over the group of att^T dh
    CUDA_CHECK(launch_causal_softmax_backward(datt, a, H, KV, B, T, C, scale, cb.compute_stream()));
    for_each_group_member(be,
                          {.m = T, .n = hd, .k = T, .lda = T, .ldb = R, .ldc = R, .batch = KV, .stride_a = G * TT,
                           .stride_b = hd, .stride_c = G * hd},
                          G, datt, TT, q + C, 0, dq, hd, false);  // dq = dpre k
    for_each_group_member(be,
                          {.trans_a = Trans::T, .m = T, .n = hd, .k = T, .lda = T, .ldb = R, .ldc = R, .batch = KV,
                           .stride_a = G * TT, .stride_b = G * hd, .stride_c = hd},
                          G, datt, TT, q, hd, dq + C, 0, true);  // dk = sum over the group of dpre^T q
  }
}

}  // namespace shardlab::cuda
