// linear.hpp — nn.Linear's product without bias, forward and backward, as the Llama-shaped
// families (llama, mixtral, qwen3_moe) and the MoE block compute it.
#pragma once
#include <vector>

#include "src/model/unit.hpp"

namespace shardlab::blocks {

// out (N, OC) = inp (N, IC) @ W^T, with W (OC, IC) as nn.Linear stores it.
void linear_forward(Backend& be, Tensor out, Tensor inp, Tensor w, int64_t N);
// dinp (N, IC) = dout (N, OC) @ W (overwritten); dW (OC, IC) += dout^T @ inp (held for the W pass
// under a split backward: blocks/weight_grad.hpp).
void linear_backward(UnitContext& c, Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, int64_t N);
// Tensors that follow one another in memory, each (rows_i, cols), as one (sum rows_i, cols) matrix
// (InternalError when one does not follow the previous one).
Tensor stacked(const std::vector<Tensor>& parts);

}  // namespace shardlab::blocks
