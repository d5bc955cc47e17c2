// norm.hpp — the normalisation family: LayerNorm (GPT-2) and RMSNorm (Llama) over the last
// dimension, forward and backward. Conventions: ops/dispatch.hpp.
#pragma once
#include "src/backend/ops/dispatch.hpp"

namespace shardlab::ops {

// LayerNorm: inp, out (N, C); mean, rstd (N) saved for backward; rstd = 1 / sqrt(variance + eps).
// out f32, or bf16 where its products read it so: computed in f32 and rounded once as stored
// (save_product_operand's bits without its rounding pass).
// inp_bf16 (optional): the input rounded once to bf16 as well, in the same pass (what a backward
// reading a bf16 input saves).
void layernorm_forward(Backend& be, Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias,
                       float eps, Tensor inp_bf16 = {});
// dweight, dbias accumulate; dinp too, or dinp = dinp_from + the input's gradient where dinp_from
// is given (a residual's gradient: no copy first); dinp_bf16 (optional): the result rounded once
// to bf16 as well (its products' operand). inp f32, or bf16 as inp_bf16 saved it.
void layernorm_backward(Backend& be, Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                        Tensor mean, Tensor rstd, Tensor dinp_from = {}, Tensor dinp_bf16 = {});

// RMSNorm, in f32 (HF's LlamaRMSNorm): out = inp * rstd * weight with rstd (N) = 1 / sqrt(mean(inp^2)
// + eps), saved for backward; out f32 or bf16 (rounded once, as LayerNorm's).
// inp_bf16 as LayerNorm's.
void rmsnorm_forward(Backend& be, Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps, Tensor inp_bf16 = {});
// dweight accumulates; dinp, dinp_from, dinp_bf16 and inp's dtype as LayerNorm's backward.
void rmsnorm_backward(Backend& be, Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd,
                      Tensor dinp_from = {}, Tensor dinp_bf16 = {});

// RMSNorm of each head (Qwen3's q_norm and k_norm): the `heads` heads of weight.numel() = hd
// elements at columns [col0, col0 + heads hd) of every row of x (N, W), normalised in place; their
// inputs copied to pre (N, heads hd) and rstd (N, heads) saved for backward.
void head_rmsnorm_forward(Backend& be, Tensor x, Tensor pre, Tensor rstd, Tensor weight, int64_t col0, float eps);
// The same columns of dx, in place: d(normalised) in, d(input) out; dweight accumulates.
void head_rmsnorm_backward(Backend& be, Tensor dx, Tensor dweight, Tensor pre, Tensor weight, Tensor rstd,
                           int64_t col0);

}  // namespace shardlab::ops
