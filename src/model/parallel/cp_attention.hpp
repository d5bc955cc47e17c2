// cp_attention.hpp — attention under context parallelism (cp.hpp): the fused kernel on this
// rank's pieces of each sequence, with the keys and values of every piece of the cp group. Called
// by blocks/attention when the batch is context-parallel; same saved names as the fused core ("qkv"
// by the caller, "atty", "lse").
#pragma once
#include "src/model/blocks/attention.hpp"

namespace shardlab::cp {

// atty (B * Tl, H hd) from qkv (B, Tl, (H + 2 KV) hd) holding this rank's Tl rows of each sequence;
// a.T is Tl. Saves "atty" and "lse" (the pieces' log-sum-exps, piece after piece).
Tensor attention_forward(UnitContext& c, Saved& s, Tensor qkv, const blocks::AttentionShape& a);
// Floats of the fused kernel's backward tiles for the largest piece (the caller allocates them
// with its other workspace, as for the whole-sequence core).
int64_t attention_scratch_elems(const UnitContext& c, const blocks::AttentionShape& a);
// dqkv (like qkv) = the gradient from datty; the group's K/V are gathered again and their gradients
// reduce-scattered back to the ranks that hold them.
void attention_backward(UnitContext& c, Saved& s, Tensor dqkv, Tensor datty, Tensor scratch,
                        const blocks::AttentionShape& a);

// Bus bytes one rank moves on the cp axis in one micro-step of B sequences (allgather): per layer
// it holds, an all-gather of the group's K/V rows in forward, the same again in backward and a
// reduce-scatter of their gradients, each (C - 1) / C x B T 2 KV hd floats (KV: this rank's K/V
// heads, / tp), plus one more gather where --activation-checkpointing blocks runs forward again.
double micro_step_bus_bytes(const ModelSpec& spec, int layers, int tp, int cp, int64_t B, Checkpointing ck);

}  // namespace shardlab::cp
