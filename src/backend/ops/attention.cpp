// attention.cpp — the attention family's checks and dispatch (attention.hpp).
#include "src/backend/ops/attention.hpp"

#include <array>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::ops {
namespace {

// {B, T, C} with C = H hd, the output's channels.
std::array<int64_t, 3> attention_shape(const Tensor& qkv, const Tensor& out, const Tensor& att, int64_t H, int64_t KV,
                                       const char* op) {
  SHARD_CHECK(H > 0 && KV > 0 && H % KV == 0, "{}: {} query heads do not share {} K/V heads evenly", op, H, KV);
  SHARD_CHECK(qkv.ndim() == 3 && qkv.dim(2) % (H + 2 * KV) == 0, "{}: qkv {} must be (B, T, (H + 2 KV) hd), H={} KV={}",
              op, qkv.shape_str(), H, KV);
  const int64_t B = qkv.dim(0), T = qkv.dim(1), hd = qkv.dim(2) / (H + 2 * KV), C = H * hd;
  SHARD_CHECK(hd > 0 && out.numel() == B * T * C && att.numel() == B * H * T * T, "{}: qkv {} out {} att {} H={} KV={}",
              op, qkv.shape_str(), out.shape_str(), att.shape_str(), H, KV);
  return {B, T, C};
}

}  // namespace

void attention_forward(Backend& be, Tensor out, Tensor att, Tensor qkv, int64_t H, int64_t KV) {
  const auto [B, T, C] = attention_shape(qkv, out, att, H, KV, "attention_forward");
  switch (be.device()) {
    case Device::cpu:
      return cpu::attention_forward(out.ptr<float>(), att.ptr<float>(), qkv.ptr<float>(), B, T, C, H, KV);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::attention_forward(be, out, att, qkv, H, KV, B, T, C);
      return;
    case Device::meta: return;
  }
}

void attention_backward(Backend& be, Tensor dqkv, Tensor dout, Tensor qkv, Tensor att, int64_t H, int64_t KV,
                        Tensor scratch) {
  const auto [B, T, C] = attention_shape(qkv, dout, att, H, KV, "attention_backward");
  check_same_numel(dqkv, qkv, "attention_backward");
  SHARD_CHECK(scratch.numel() >= attention_scratch_elems(T, H), "attention_backward: scratch of {} < {} floats",
              scratch.numel(), attention_scratch_elems(T, H));
  switch (be.device()) {
    case Device::cpu:
      return cpu::attention_backward(dqkv.ptr<float>(), scratch.ptr<float>(), dout.ptr<float>(), qkv.ptr<float>(),
                                     att.ptr<float>(), B, T, C, H, KV);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::attention_backward(be, dqkv, dout, qkv, att, H, KV, scratch, B, T, C);
      return;
    case Device::meta: return;
  }
}

}  // namespace shardlab::ops
