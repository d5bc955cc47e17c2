// activation.hpp — the activation family: GELU (GPT-2's MLP) and SwiGLU (Llama's), forward and
// backward. Conventions: ops/dispatch.hpp.
#pragma once
#include "src/backend/ops/dispatch.hpp"

namespace shardlab::ops {

// GELU, tanh approximation; backward: dinp = gelu'(inp) * dout (overwrites dinp)
void gelu_forward(Backend& be, Tensor out, Tensor inp);
void gelu_backward(Backend& be, Tensor dinp, Tensor inp, Tensor dout);
// SwiGLU: gate_up (N, 2F) holds [gate | up] in each row; out (N, F) = silu(gate) * up. gate_up, out
// and dgate_up f32 or bf16 (where products write or read them so): read widened, computed in f32,
// rounded once as stored; dout f32. Backward
// overwrites dgate_up (N, 2F) from dout (N, F) and the saved gate_up.
void swiglu_forward(Backend& be, Tensor out, Tensor gate_up);
void swiglu_backward(Backend& be, Tensor dgate_up, Tensor gate_up, Tensor dout);

}  // namespace shardlab::ops
