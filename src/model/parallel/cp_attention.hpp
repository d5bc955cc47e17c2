// cp_attention.hpp — attention under context parallelism (cp.hpp): the fused kernel on this
// rank's pieces of each sequence, with the keys and values of every piece of the cp group. Called
// by blocks/attention when the batch is context-parallel; same saved names as the fused core ("qkv"
// by the caller, "atty", "lse").
#pragma once
#include "src/model/blocks/attention.hpp"
#include "src/model/parallel/cp.hpp"

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

// Bus bytes one rank moves on the cp axis in one micro-step of B sequences, per layer it holds
// (KV: this rank's K/V heads, / tp; G = B T 2 KV hd floats, the group's K/V rows). allgather: an
// all-gather in forward, another in backward and a reduce-scatter of the gradients, (C - 1) / C G
// each. ring: per hop a send and a receive of the rank's rows, G / C each: C - 1 hops of K/V in
// forward, C - 1 in backward and C of dK/dV. --activation-checkpointing blocks runs forward again.
double micro_step_bus_bytes(const ModelSpec& spec, CpMethod method, int layers, int tp, int cp, int64_t B,
                            Checkpointing ck);

}  // namespace shardlab::cp
