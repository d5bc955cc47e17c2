// attention.hpp — the attention family: causal self-attention with grouped-query heads, forward and
// backward (the naive kernels: probabilities materialised). Conventions: ops/dispatch.hpp.
#pragma once
#include "src/backend/ops/dispatch.hpp"

namespace shardlab::ops {

// The head dimensions of a packed [q | k | v] buffer (B, T, (H + KV) hd + KV vd): queries and keys
// of hd channels a head, values of vd (given, > 0; or 0: as many as hd, the row (H + 2 KV) hd).
// Checked against the row's width.
struct PackedHeads {
  int64_t hd = 0, vd = 0;
};
PackedHeads packed_head_dims(const Tensor& qkv, int64_t H, int64_t KV, int64_t vd, const char* op);

// Scores scaled by 1/sqrt(hd): qkv (B, T, (H + KV) hd + KV vd) is laid out [q (H heads) | k (KV
// heads) | v (KV heads)] in each row, and query head h reads K/V head h / (H / KV). KV == H is
// multi-head attention over GPT-2's [q | k | v] of 3C. vd: the value head dimension (0: hd; DeepSeek's
// latent attention has its own). out (B, T, H vd); att (B, H, T, T) softmax probabilities (zero above
// the diagonal), saved for backward.
// dtypes: qkv and att both f32, or both bf16 (a GPU whose products round, as Megatron's: the
// products on the tensor cores with f32 sums, the scores written in bf16, the softmax computed in
// f32 and its probabilities stored in bf16); out f32 or bf16. Backward: dout of qkv's dtype; dqkv
// f32, or bf16 beside bf16 qkv when KV == H (no K/V head sums over a group); scratch f32 (bf16: the
// scores' gradient kept in bf16 in its first half). The CPU computes in f32 on widened copies.
void attention_forward(Backend& be, Tensor out, Tensor att, Tensor qkv, int64_t H, int64_t KV, int64_t vd = 0);
// dqkv (like qkv) is overwritten; scratch holds attention_scratch_elems(T, H) floats.
void attention_backward(Backend& be, Tensor dqkv, Tensor dout, Tensor qkv, Tensor att, int64_t H, int64_t KV,
                        Tensor scratch, int64_t vd = 0);

}  // namespace shardlab::ops

namespace shardlab {
// Floats of scratch attention_backward needs: one batch entry's attention gradient (H, T, T).
inline int64_t attention_scratch_elems(int64_t T, int64_t H) { return H * T * T; }
}  // namespace shardlab
