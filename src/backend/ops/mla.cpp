// mla.cpp — the latent attention family's checks and dispatch (mla.hpp).
#include "src/backend/ops/mla.hpp"

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::ops {
namespace {

// {B, T}, every operand checked against the heads.
std::array<int64_t, 2> mla_shape(const Tensor& qkv, const Tensor& q, const Tensor& kv, const Tensor& kva,
                                 const MlaHeads& m, const RopeFreqs& freqs, const char* op) {
  SHARD_CHECK(m.heads > 0 && m.nope > 0 && m.rope > 0 && m.rope % 2 == 0 && m.v > 0 && m.kv_rank > 0 &&
                  freqs.half == m.rope / 2,
              "{}: heads {} nope {} rope {} (even) v {} kv_rank {}, all positive; freqs for {} pairs", op, m.heads,
              m.nope, m.rope, m.v, m.kv_rank, freqs.half);
  SHARD_CHECK(qkv.ndim() == 3 && qkv.dim(2) == m.width(), "{}: qkv {} must be (B, T, {})", op, qkv.shape_str(),
              m.width());
  const int64_t N = qkv.dim(0) * qkv.dim(1);
  SHARD_CHECK(q.numel() == N * m.heads * m.qk() && kv.numel() == N * m.heads * (m.nope + m.v) &&
                  kva.numel() == N * (m.kv_rank + m.rope),
              "{}: q {} kv {} kva {} for {} rows of {} heads ({} + {} / {}) and a latent of {}", op, q.shape_str(),
              kv.shape_str(), kva.shape_str(), N, m.heads, m.nope, m.rope, m.v, m.kv_rank);
  for (const Tensor* t : {&qkv, &q, &kv, &kva})
    SHARD_CHECK(t->dtype() == DType::f32, "{}: f32 tensors expected, got {}", op, dtype_name(t->dtype()));
  return {qkv.dim(0), qkv.dim(1)};
}

// A copy of every packed element, the rotations' products on the rope channels (6 a pair).
OpCost mla_cost(const char* name, int64_t N, const MlaHeads& m) {
  return {.name = name, .flops = 6.0 * N * (2 * m.heads) * (m.rope / 2), .bytes = pass_bytes(N * m.width(), 1, 1)};
}

}  // namespace

void mla_qkv_forward(Backend& be, Tensor qkv, Tensor q, Tensor kv, Tensor kva, const MlaHeads& m,
                     const RopeFreqs& freqs, int64_t pos0) {
  const auto [B, T] = mla_shape(qkv, q, kv, kva, m, freqs, "mla_qkv_forward");
  switch (be.device()) {
    case Device::cpu:
      return cpu::mla_qkv_forward(qkv.ptr<float>(), q.ptr<float>(), kv.ptr<float>(), kva.ptr<float>(), B, T, m, freqs,
                                  pos0);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::mla_qkv_forward(be, qkv, q, kv, kva, m, freqs, pos0, B, T);
      return;
    case Device::meta:
      return charge(be, mla_cost("mla_qkv_forward", B * T, m), [&] { return cuda::mla_qkv_forward_launches(m, B, T); });
  }
}

void mla_qkv_backward(Backend& be, Tensor dq, Tensor dkv, Tensor dkva, Tensor dqkv, const MlaHeads& m,
                      const RopeFreqs& freqs, int64_t pos0) {
  const auto [B, T] = mla_shape(dqkv, dq, dkv, dkva, m, freqs, "mla_qkv_backward");
  switch (be.device()) {
    case Device::cpu:
      return cpu::mla_qkv_backward(dq.ptr<float>(), dkv.ptr<float>(), dkva.ptr<float>(), dqkv.ptr<float>(), B, T, m,
                                   freqs, pos0);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::mla_qkv_backward(be, dq, dkv, dkva, dqkv, m, freqs, pos0, B, T);
      return;
    case Device::meta:
      return charge(be, mla_cost("mla_qkv_backward", B * T, m),
                    [&] { return cuda::mla_qkv_backward_launches(m, B, T); });
  }
}

}  // namespace shardlab::ops
