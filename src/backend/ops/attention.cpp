// attention.cpp — the attention family's checks and dispatch (attention.hpp).
#include "src/backend/ops/attention.hpp"

#include <array>

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

// The naive attention's cost: its products on full T x T scores in f32 (the CUDA backend's GEMMs
// here take f32 operands: no tensor cores), priced as products of (T x hd) . (hd x T) (the other,
// (T x T) . (T x hd), has the same shape's efficiency), and the scores written by one product,
// read and written by the softmax and read by the next (forward; backward `passes` 2: twice the
// products and the scores' traffic).
OpCost naive_cost(const char* name, int64_t B, int64_t T, int64_t hd, int64_t vd, int64_t H, const Tensor& qkv,
                  const Tensor& out, const Tensor& att, int passes) {
  const double scores = static_cast<double>(B) * H * T * T;
  OpCost c{.name = name,
           .flops = passes * (2.0 * scores * static_cast<double>(hd + vd) + 5.0 * scores),
           .bytes = passes * (static_cast<double>(qkv.bytes() + out.bytes()) + 4.0 * static_cast<double>(att.bytes()))};
  c.m = T, c.n = T, c.k = hd, c.batch = B * H;
  return c;
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
  const int64_t C = H * hd;
  switch (be.device()) {
    case Device::cpu:
      return cpu::attention_forward(out.ptr<float>(), att.ptr<float>(), qkv.ptr<float>(), B, T, H, KV, hd, vd);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::attention_forward(be, out, att, qkv, H, KV, B, T, hd, vd);
      return;
    case Device::meta:
      return charge(
          be, naive_cost("attention_forward", B, T, hd, vd, H, qkv, out, att, 1),
          [&] { return cuda::attention_forward_launches(H, KV, B, T, C); },
          2 * B * (H / KV));  // B G score products, B G output products (cuBLAS)
  }
}

void attention_backward(Backend& be, Tensor dqkv, Tensor dout, Tensor qkv, Tensor att, int64_t H, int64_t KV,
                        Tensor scratch, int64_t v) {
  const auto [B, T, hd, vd] = attention_shape(qkv, dout, att, H, KV, v, "attention_backward");
  const int64_t C = H * hd;
  check_same_numel(dqkv, qkv, "attention_backward");
  SHARD_CHECK(scratch.numel() >= attention_scratch_elems(T, H), "attention_backward: scratch of {} < {} floats",
              scratch.numel(), attention_scratch_elems(T, H));
  switch (be.device()) {
    case Device::cpu:
      return cpu::attention_backward(dqkv.ptr<float>(), scratch.ptr<float>(), dout.ptr<float>(), qkv.ptr<float>(),
                                     att.ptr<float>(), B, T, H, KV, hd, vd);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::attention_backward(be, dqkv, dout, qkv, att, H, KV, scratch, B, T, hd, vd);
      return;
    case Device::meta:
      // Per batch entry: its softmax backward, and 4 G products (cuBLAS).
      return charge(
          be, naive_cost("attention_backward", B, T, hd, vd, H, qkv, dout, att, 2),
          [&] { return cuda::attention_backward_launches(H, KV, B, T, C); }, 4 * B * (H / KV), B);
  }
}

}  // namespace shardlab::ops
