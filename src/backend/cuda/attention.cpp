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
// Storage (ops/attention.hpp): f32 throughout, or bf16 qkv, probabilities and dout where the
// products round (the scores' gradient then bf16 in the scratch), f32 sums; each product's output is
// written in its tensor's dtype.
#include <cmath>

#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::cuda {
namespace {

// A tensor's elements as bytes, to step through at element offsets of its dtype.
struct Elems {
  char* p;
  size_t size;
  DType t;
  char* at(int64_t i) const { return p + static_cast<size_t>(i) * size; }
};
Elems elems(const Tensor& x) { return {static_cast<char*>(x.data()), dtype_size(x.dtype()), x.dtype()}; }

// `d` with its operands' and output's storage: a and b of the products' dtype, c as given.
GemmDesc typed(GemmDesc d, DType ab, DType c) {
  d.a_type = d.b_type = ab;
  d.c_type = c;
  return d;
}

// Issues `d` (batched over the KV groups) once per group member g in [0, G), with the operands
// advanced g steps (elements of their dtypes); `sum` makes members after the first accumulate into C
// (its step is then 0).
void for_each_group_member(Backend& be, GemmDesc d, int64_t G, Elems a, int64_t a_step, Elems b, int64_t b_step,
                           Elems c, int64_t c_step, bool sum) {
  d = typed(d, a.t, c.t);
  SHARD_CHECK(a.t == b.t, "cuda attention: product of {} by {}", dtype_name(a.t), dtype_name(b.t));
  for (int64_t g = 0; g < G; ++g) {
    if (sum && g > 0) d.beta = 1.f;
    be.gemm(d, a.at(g * a_step), b.at(g * b_step), c.at(g * c_step));
  }
}

Elems offset(Elems x, int64_t i) { return {x.at(i), x.size, x.t}; }

}  // namespace

void attention_forward(Backend& be, Tensor out, Tensor att, Tensor qkv, int64_t H, int64_t KV, int64_t B, int64_t T,
                       int64_t hd, int64_t vd) {
  CudaBackend& cb = CudaBackend::of(be);
  const int64_t C = H * hd, Co = H * vd, G = H / KV, R = qkv.dim(2), TT = T * T;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  const Elems Q = elems(qkv), A = elems(att), O = elems(out);
  for (int64_t b = 0; b < B; ++b) {  // scores, scaled: att = scale * q k^T
    const Elems q = offset(Q, b * T * R);
    for_each_group_member(be,
                          {.trans_b = Trans::T, .m = T, .n = T, .k = hd, .alpha = scale, .lda = R, .ldb = R, .ldc = T,
                           .batch = KV, .stride_a = G * hd, .stride_b = hd, .stride_c = G * TT},
                          G, q, hd, offset(q, C), 0, offset(A, b * H * TT), TT, false);
  }
  CUDA_CHECK(launch_causal_softmax(att.data(), att.dtype(), H, KV, B, T, C, cb.compute_stream()));
  for (int64_t b = 0; b < B; ++b) {  // out_h = att_h v
    const Elems v = offset(Q, b * T * R + C + KV * hd);
    for_each_group_member(be,
                          {.m = T, .n = vd, .k = T, .lda = T, .ldb = R, .ldc = Co, .batch = KV, .stride_a = G * TT,
                           .stride_b = vd, .stride_c = G * vd},
                          G, offset(A, b * H * TT), TT, v, 0, offset(O, b * T * Co), vd, false);
  }
}

void attention_backward(Backend& be, Tensor dqkv, Tensor dout, Tensor qkv, Tensor att, int64_t H, int64_t KV,
                        Tensor scratch, int64_t B, int64_t T, int64_t hd, int64_t vd) {
  CudaBackend& cb = CudaBackend::of(be);
  const int64_t C = H * hd, Co = H * vd, G = H / KV, R = qkv.dim(2), TT = T * T, KVd = KV * hd;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  // d(att), (H, T, T) in the probabilities' dtype, reused by every batch entry (stream order)
  const Elems datt{static_cast<char*>(scratch.data()), dtype_size(att.dtype()), att.dtype()};
  const Elems Q = elems(qkv), dQ = elems(dqkv), A = elems(att), dO = elems(dout);
  for (int64_t b = 0; b < B; ++b) {
    const Elems q = offset(Q, b * T * R), dq = offset(dQ, b * T * R);  // k at q + C, v at q + C + KVd; dqkv alike
    const Elems a = offset(A, b * H * TT), dh = offset(dO, b * T * Co);
    for_each_group_member(be,
                          {.trans_b = Trans::T, .m = T, .n = T, .k = vd, .lda = Co, .ldb = R, .ldc = T, .batch = KV,
                           .stride_a = G * vd, .stride_b = vd, .stride_c = G * TT},
                          G, dh, vd, offset(q, C + KVd), 0, datt, TT, false);  // d(att) = dh v^T
    for_each_group_member(be,
                          {.trans_a = Trans::T, .m = T, .n = vd, .k = T, .lda = T, .ldb = Co, .ldc = R, .batch = KV,
                           .stride_a = G * TT, .stride_b = G * vd, .stride_c = vd},
                          G, a, TT, dh, vd, offset(dq, C + KVd), 0, true);  // dv = sum over the group of att^T dh
    CUDA_CHECK(launch_causal_softmax_backward(datt.p, a.p, att.dtype(), H, KV, B, T, C, scale, cb.compute_stream()));
    for_each_group_member(be,
                          {.m = T, .n = hd, .k = T, .lda = T, .ldb = R, .ldc = R, .batch = KV, .stride_a = G * TT,
                           .stride_b = hd, .stride_c = G * hd},
                          G, datt, TT, offset(q, C), 0, dq, hd, false);  // dq = dpre k
    for_each_group_member(be,
                          {.trans_a = Trans::T, .m = T, .n = hd, .k = T, .lda = T, .ldb = R, .ldc = R, .batch = KV,
                           .stride_a = G * TT, .stride_b = G * hd, .stride_c = hd},
                          G, datt, TT, q, hd, offset(dq, C), 0, true);  // dk = sum over the group of dpre^T q
  }
}

}  // namespace shardlab::cuda
