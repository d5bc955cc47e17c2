// loss.hpp — the loss family: softmax cross-entropy, whole and vocabulary-parallel (--tp,
// Megatron's). Conventions: ops/dispatch.hpp.
#pragma once
#include "src/backend/ops/dispatch.hpp"

namespace shardlab::ops {

// losses (N) = -log softmax(logits)[target]; when dlogits is not empty it receives
// (softmax - onehot(target)) * dloss_scale: f32 (it may alias logits), or bf16 (a buffer of its
// own: what a GPU's head products read, each gradient rounded once).
void cross_entropy(Backend& be, Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets,
                   float dloss_scale);

// The vocabulary-parallel cross-entropy: logits (N, Vl) are columns [v0, v0 + Vl) of the whole (N,
// V) logits, the first `valid` of them real (the rest vocabulary padding, never counted). Between
// the three steps the caller reduces over the tensor-parallel group: the row maxima (max), then the
// sums and the target logits (sum); the B*T logits are never gathered. targets are int32 in host
// memory (as for cross_entropy), every one in [0, V).
// mx (N) = the maximum of each row's valid columns (-inf with none).
void vocab_ce_max(Backend& be, Tensor mx, Tensor logits, int64_t valid);
// sumexp (N) = the sum of exp(logit - mx) over each row's valid columns (with the reduced mx);
// tlogit (N) = the target's logit where the target is in [v0, v0 + valid), else 0.
void vocab_ce_sums(Backend& be, Tensor sumexp, Tensor tlogit, Tensor logits, const int32_t* targets, int64_t v0,
                   int64_t valid, Tensor mx);
// With the reduced mx, sumexp and tlogit: losses (N) = log(sumexp) + mx - tlogit; when dlogits
// is not empty it receives (exp(logit - mx) / sumexp - onehot(target)) * dloss_scale in the valid
// columns and 0 in the padding (it may alias logits).
void vocab_ce_finish(Backend& be, Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets, int64_t v0,
                     int64_t valid, Tensor mx, Tensor sumexp, Tensor tlogit, float dloss_scale);

}  // namespace shardlab::ops
