// attention.cpp — the attention family's checks and dispatch (attention.hpp).
#include "src/backend/ops/attention.hpp"

#include <array>
#include <vector>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::ops {
namespace {

// {B, T, hd, vd}.
std::array<int64_t, 4> attention_shape(const Tensor& qkv, const Tensor& out, const Tensor& att, int64_t H, int64_t KV,
                                       int64_t v, const char* op) {
  const auto [hd, vd] = packed_head_dims(qkv, H, KV, v, op);
  const int64_t B = qkv.dim(0), T = qkv.dim(1);
  SHARD_CHECK(out.numel() == B * T * H * vd && att.numel() == B * H * T * T, "{}: qkv {} out {} att {} H={} KV={} vd={}",
              op, qkv.shape_str(), out.shape_str(), att.shape_str(), H, KV, vd);
  return {B, T, hd, vd};
}

// The naive attention's operands: all f32, or (a GPU whose products round) qkv, the probabilities
// and the output gradient bf16 (bf16 products on the tensor cores, f32 sums, the softmax in f32).
// `other` (the output, or the output's gradient): f32, or bf16 beside bf16 operands (cuBLAS writes
// no bf16 product of f32 operands). dqkv: attention_backward's own check.
void check_dtypes(const Tensor& qkv, const Tensor& att, const Tensor& other, const char* op) {
  const DType t = qkv.dtype();
  SHARD_CHECK((t == DType::f32 || t == DType::bf16) && att.dtype() == t,
              "{}: qkv {} and probabilities {}: expected both f32 or both bf16", op, dtype_name(t),
              dtype_name(att.dtype()));
  SHARD_CHECK(other.dtype() == DType::f32 || (other.dtype() == DType::bf16 && t == DType::bf16),
              "{}: a {} output or gradient beside {} qkv: f32, or bf16 beside bf16", op, dtype_name(other.dtype()),
              dtype_name(t));
}

// The naive attention's cost, as two operations: its products (score and output products forward;
// backward twice as many) on full T x T scores, priced as products of (T x hd) . (hd x T) (the others
// have the same shape's efficiency), on the tensor cores where the operands are bf16 on a GPU; and
// the softmax kernels, which read and write the scores (forward; backward they read the
// probabilities and rewrite the scores' gradient). The products' bytes: qkv and the output (or its
// gradient) read or written once, the scores written by one product and read by the next.
// `library`: the cuBLAS calls.
void charge_naive(Backend& be, const char* products, const char* softmax, int64_t B, int64_t T, int64_t hd, int64_t vd,
                  int64_t H, const Tensor& qkv, const Tensor& out, const Tensor& att, int passes,
                  const cuda::Launches& kernels, int64_t library, int64_t times) {
  const CostLedger* l = be.cost_ledger();
  if (l == nullptr || l->paused()) return;
  const double scores = static_cast<double>(B) * H * T * T, att_bytes = static_cast<double>(att.bytes());
  const double flops = passes * 2.0 * scores * static_cast<double>(hd + vd);
  const bool tensor = l->target() == Device::cuda && qkv.dtype() != DType::f32;
  OpCost p{.name = products,
           .flops = tensor ? 0 : flops,
           .tensor_flops = tensor ? flops : 0,
           .bytes = passes * (static_cast<double>(qkv.bytes() + out.bytes()) + 2.0 * att_bytes)};
  p.m = T, p.n = T, p.k = hd, p.batch = B * H;
  charge(be, p, [] { return cuda::Launches{}; }, library);
  charge(be, OpCost{.name = softmax, .flops = passes * 5.0 * scores, .bytes = passes * 2.0 * att_bytes},
         [&] { return kernels; }, 0, times);
}

}  // namespace

PackedHeads packed_head_dims(const Tensor& qkv, int64_t H, int64_t KV, int64_t vd, const char* op) {
  SHARD_CHECK(H > 0 && KV > 0 && H % KV == 0, "{}: {} query heads do not share {} K/V heads evenly", op, H, KV);
  SHARD_CHECK(vd >= 0 && qkv.ndim() == 3, "{}: qkv {} must be (B, T, (H + KV) hd + KV vd), vd={}", op, qkv.shape_str(),
              vd);
  const int64_t W = qkv.dim(2), rest = W - KV * vd, per = vd > 0 ? H + KV : H + 2 * KV;
  SHARD_CHECK(rest > 0 && rest % per == 0, "{}: qkv {} must be (B, T, (H + KV) hd + KV vd), H={} KV={} vd={}", op,
              qkv.shape_str(), H, KV, vd);
  const int64_t hd = rest / per;
  return {hd, vd > 0 ? vd : hd};
}

void attention_forward(Backend& be, Tensor out, Tensor att, Tensor qkv, int64_t H, int64_t KV, int64_t v) {
  const auto [B, T, hd, vd] = attention_shape(qkv, out, att, H, KV, v, "attention_forward");
  check_dtypes(qkv, att, out, "attention_forward");
  const int64_t C = H * hd;
  switch (be.device()) {
    case Device::cpu: {
      if (qkv.dtype() == DType::f32 && out.dtype() == DType::f32)
        return cpu::attention_forward(out.ptr<float>(), att.ptr<float>(), qkv.ptr<float>(), B, T, H, KV, hd, vd);
      std::vector<float> o(static_cast<size_t>(out.numel())), a(static_cast<size_t>(att.numel()));
      cpu::attention_forward(o.data(), a.data(), cpu_widened(qkv).data(), B, T, H, KV, hd, vd);
      cpu_store(out, o);
      return cpu_store(att, a);
    }
    case Device::cuda:
      if constexpr (kWithCuda) cuda::attention_forward(be, out, att, qkv, H, KV, B, T, hd, vd);
      return;
    case Device::meta:  // B G score products, B G output products (cuBLAS)
      return charge_naive(be, "attention_products", "attention_softmax", B, T, hd, vd, H, qkv, out, att, 1,
                          cuda::attention_forward_launches(H, KV, B, T, C), 2 * B * (H / KV), 1);
  }
}

void attention_backward(Backend& be, Tensor dqkv, Tensor dout, Tensor qkv, Tensor att, int64_t H, int64_t KV,
                        Tensor scratch, int64_t v) {
  const auto [B, T, hd, vd] = attention_shape(qkv, dout, att, H, KV, v, "attention_backward");
  const int64_t C = H * hd;
  check_same_numel(dqkv, qkv, "attention_backward");
  check_dtypes(qkv, att, dout, "attention_backward");
  // dqkv: f32, or bf16 beside bf16 operands where no K/V head sums over query heads (KV == H)
  const bool bf16_dqkv = dqkv.dtype() == DType::bf16 && qkv.dtype() == DType::bf16 && KV == H;
  SHARD_CHECK(dout.dtype() == qkv.dtype() && (dqkv.dtype() == DType::f32 || bf16_dqkv),
              "attention_backward: dout {} beside qkv {}, dqkv {} (H={} KV={}): dout is qkv's dtype, dqkv f32 (bf16 "
              "only beside bf16 qkv without grouped heads)", dtype_name(dout.dtype()), dtype_name(qkv.dtype()),
              dtype_name(dqkv.dtype()), H, KV);
  SHARD_CHECK(scratch.numel() >= attention_scratch_elems(T, H) && scratch.dtype() == DType::f32,
              "attention_backward: scratch of {} {} < {} floats", scratch.numel(), dtype_name(scratch.dtype()),
              attention_scratch_elems(T, H));
  switch (be.device()) {
    case Device::cpu:
      if (qkv.dtype() == DType::f32)
        return cpu::attention_backward(dqkv.ptr<float>(), scratch.ptr<float>(), dout.ptr<float>(), qkv.ptr<float>(),
                                       att.ptr<float>(), B, T, H, KV, hd, vd);
    {
      std::vector<float> d(static_cast<size_t>(dqkv.numel()));
      cpu::attention_backward(d.data(), scratch.ptr<float>(), cpu_widened(dout).data(), cpu_widened(qkv).data(),
                              cpu_widened(att).data(), B, T, H, KV, hd, vd);
      return cpu_store(dqkv, d);
    }
    case Device::cuda:
      if constexpr (kWithCuda) cuda::attention_backward(be, dqkv, dout, qkv, att, H, KV, scratch, B, T, hd, vd);
      return;
    case Device::meta:  // per batch entry: its softmax backward, and 4 G products (cuBLAS)
      return charge_naive(be, "attention_products", "attention_softmax_backward", B, T, hd, vd, H, qkv, dout, att, 2,
                          cuda::attention_backward_launches(H, KV, B, T, C), 4 * B * (H / KV), B);
  }
}

}  // namespace shardlab::ops
