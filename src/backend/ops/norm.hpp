// norm.hpp — the normalisation family: LayerNorm (GPT-2) and RMSNorm (Llama) over the last
// dimension, forward and backward. Conventions: ops/dispatch.hpp.
#pragma once
#include "src/backend/ops/dispatch.hpp"

namespace shardlab::ops {

// LayerNorm: inp, out (N, C); mean, rstd (N) saved for backward; rstd = 1 / sqrt(variance + eps).
void layernorm_forward(Backend& be, Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias,
                       float eps);
// dinp, dweight, dbias accumulate
void layernorm_backward(Backend& be, Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                        Tensor mean, Tensor rstd);

// RMSNorm, in f32 (HF's LlamaRMSNorm): out = inp * rstd * weight with rstd (N) = 1 / sqrt(mean(inp^2)
// + eps), saved for backward.
void rmsnorm_forward(Backend& be, Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps);
// dinp and dweight accumulate
void rmsnorm_backward(Backend& be, Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd);

}  // namespace shardlab::ops
