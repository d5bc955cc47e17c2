// loss_head.hpp — the language-model head's loss in chunks of positions (--loss-chunk K), as fused
// linear-cross-entropy kernels do: the logits of K positions at a time (K, V) and their
// cross-entropy in forward, and in backward the same logits again for their gradient, which goes
// straight into d(x) and d(W): no (N, V) buffer is ever held (Llama 3's V = 128,256 at T 32,768:
// 16 GiB of f32 logits, and as much again for their gradient). The price is the head's product run
// a second time in backward.
//
// With it, the head unit outputs the N per-position losses instead of the logits, and its backward
// takes d(summed loss)/d(each loss), which the runner sets to the loss scale (UnitHooks::loss_rows).
// Under tensor parallelism w holds the rank's vocabulary rows and each chunk's loss is the
// vocabulary-parallel one (its row maxima, sums and target logits reduced over the group, per
// chunk); x is then every position's (gathered under sequence parallelism), and d(x) the rank's
// partial sum, which the head reduces over the group as it does the whole logits' path.
#pragma once
#include "src/model/unit.hpp"

namespace shardlab::blocks {

// Whether the head computes its loss in chunks: --loss-chunk K > 0 (at any tensor-parallel degree).
bool chunked_loss(const ModelSpec& spec, const TpConfig& tp);

// The cross-entropy of logits (rows, the head's rows on this rank) against targets: losses (rows),
// and with dlogits their gradient times scale (it may alias logits). Under tensor parallelism the
// logits are the rank's vocabulary columns (vocab_shard) and this is Megatron's vocabulary-parallel
// loss: the row maxima reduced (max) over the group, then each row's sum of exponentials and its
// target's logit (sum, one collective of 2 x rows), in `stats` (3 x rows floats; unused at degree
// 1); zero in the padding columns of dlogits. The chunked head's, per chunk, and the whole logits'.
void cross_entropy_rows(UnitContext& c, Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets,
                        Tensor stats, float scale);

// losses (N) = cross-entropy of the logits x (N, C) @ w^T (w (V, C), as nn.Linear stores it) against
// c.batch.targets, spec.loss_chunk positions at a time.
void chunked_loss_forward(UnitContext& c, Tensor losses, Tensor x, Tensor w);
// dx (N, C) = dlogits @ w (overwritten), dw (V, C) += dlogits^T @ x, where each chunk's dlogits =
// (softmax - onehot(target)) * dlosses[0]: every position's loss weighs the same (the runner's
// scale), so the scale is read once from dlosses.
void chunked_loss_backward(UnitContext& c, Tensor dx, Tensor dw, Tensor dlosses, Tensor x, Tensor w);

}  // namespace shardlab::blocks
