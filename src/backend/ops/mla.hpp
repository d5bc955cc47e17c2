// mla.hpp — the multi-head latent attention family (DeepSeek's; src/model/deepseek/): the packed
// [q | k | v] rows the attention core reads (model/blocks/attention.hpp, values of their own head
// dimension), assembled from the latent attention's projections with the rotary embedding on their
// decoupled channels, and the gradients taken back apart. Conventions: ops/dispatch.hpp.
#pragma once
#include "src/backend/ops/dispatch.hpp"
#include "src/backend/ops/mla_heads.hpp"
#include "src/backend/ops/rope.hpp"

namespace shardlab::ops {

// qkv (B, T, H qk + H qk + H v) from q (B T, H qk: head h [q_nope | q_rope]), kv (B T, H (nope +
// v): head h [k_nope | v]) and kva (B T, kv_rank + rope: [latent | k_rope]): query head h is q's,
// key head h [k_nope_h | k_rope], value head h v_h, and the rope channels of every query and key
// head rotated by freqs (rope / 2 pairs) for position pos0 + t, t the row's position in its sequence
// (angle, cos and sin in f32, as ops::rope).
void mla_qkv_forward(Backend& be, Tensor qkv, Tensor q, Tensor kv, Tensor kva, const MlaHeads& m,
                     const RopeFreqs& freqs, int64_t pos0);
// Its gradients from dqkv (like qkv): dq and dkv overwritten; dkva's k_rope columns overwritten with
// the sum over heads of their keys' rope gradients (heads in order), rotated back; dkva's latent
// columns untouched.
void mla_qkv_backward(Backend& be, Tensor dq, Tensor dkv, Tensor dkva, Tensor dqkv, const MlaHeads& m,
                      const RopeFreqs& freqs, int64_t pos0);

}  // namespace shardlab::ops
