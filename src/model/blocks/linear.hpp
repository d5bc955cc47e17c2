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
// out (m, n) = e(op(A) op(B)) as Backend::gemm_epilogue defines it (bias (n), aux (m, n); empty
// where e does not use them): fused where the backend fuses (CUDA: cuBLASLt) and takes the product,
// else the product and then the element-wise passes (add_bias, gelu_forward, gelu_backward), the
// reference the CPU runs.
void gemm_epilogue(Backend& be, const GemmDesc& d, const void* a, const void* b, Tensor out, GemmEpilogue e,
                   Tensor bias, Tensor aux);
// x as the products that read it take it: where the backend's products round f32 operands to `to`
// (low_precision_gemm(), a bf16 weight's round_inputs_to), x rounded once into `held` (workspace,
// `what`), so that two products read one copy instead of each rounding x again (the same bits);
// elsewhere x itself. A GemmDesc reading the result takes its dtype as that operand's.
Tensor rounded_once(UnitContext& c, Tensor x, DType to, Block& held, const std::string& what);
// Tensors that follow one another in memory, each (rows_i, cols), as one (sum rows_i, cols) matrix
// (InternalError when one does not follow the previous one).
Tensor stacked(const std::vector<Tensor>& parts);

}  // namespace shardlab::blocks
