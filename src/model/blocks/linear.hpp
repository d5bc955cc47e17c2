// linear.hpp — nn.Linear's product without bias, forward and backward, as the Llama-shaped
// families (llama, mixtral, qwen3_moe) and the MoE block compute it.
#pragma once
#include <vector>

#include "src/model/unit.hpp"

namespace shardlab::blocks {

// out (N, OC) = inp (N, IC) @ W^T, with W (OC, IC) as nn.Linear stores it; out f32, or bf16
// (rounded once by the product) where its readers take it so. linear_backward's dinp likewise.
// beta 1: the product summed onto what out holds (a residual; f32 out).
void linear_forward(Backend& be, Tensor out, Tensor inp, Tensor w, int64_t N, float beta = 0.f);
// dinp (N, IC) = dout (N, OC) @ W (overwritten); dW (OC, IC) += dout^T @ inp (held for the W pass
// under a split backward: blocks/weight_grad.hpp).
void linear_backward(UnitContext& c, Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, int64_t N);
// out (m, n) = e(op(A) op(B)) as Backend::gemm_epilogue defines it (bias (n), aux (m, n); empty
// where e does not use them): fused where the backend fuses (CUDA: cuBLASLt) and takes the product,
// else the product and then the element-wise passes (add_bias, gelu_forward, gelu_backward), the
// reference the CPU runs.
void gemm_epilogue(Backend& be, const GemmDesc& d, const void* a, const void* b, Tensor out, GemmEpilogue e,
                   Tensor bias, Tensor aux);
// As above into an f32 or a bf16 `out` (d.c_type taken from it; aux then in out's dtype too), a
// bf16 one written by the product's epilogue where the backend fuses it (no rounding pass), else
// composed in f32 workspaces and rounded once: C and bias_gelu's aux (the f32 sum) rounded as the
// fused epilogue rounds them, dgelu's aux widened.
void gemm_epilogue(UnitContext& c, GemmDesc d, const void* a, const void* b, Tensor out, GemmEpilogue e, Tensor bias,
                   Tensor aux);
// x as the products that read it take it: where the backend's products round f32 operands to `to`
// (low_precision_gemm(), a bf16 weight's round_inputs_to), x rounded once into `held` (workspace,
// `what`), so that two products read one copy instead of each rounding x again (the same bits);
// elsewhere x itself. A GemmDesc reading the result takes its dtype as that operand's.
Tensor rounded_once(UnitContext& c, Tensor x, DType to, Block& held, const std::string& what);
// Whether the backend's products round f32 operands to `to` (rounded_once's rule).
bool products_round(const UnitContext& c, DType to);
// Whether a unit's producers write its saved activations in bf16 themselves (a kernel's or a
// product's epilogue rounding as it stores, so the runner's narrowing after the forward and
// widening before the backward find nothing to do): --activation-dtype bf16 on a backend whose
// products round to bf16 (a GPU's; the CPU narrows and widens).
inline bool activations_written_bf16(const UnitContext& c) {
  return c.spec.activation_dtype == DType::bf16 && c.be.low_precision_gemm();
}
// The dtype the products read an operand in that they round to `to`: `to` where they round, else f32.
inline DType product_operand_dtype(const UnitContext& c, DType to) { return products_round(c, to) ? to : DType::f32; }
// Saves `name` (shape) for backward as the products that read it take it. Where they round f32
// operands to `to` and `only_products` says nothing else reads it (and no sequence-parallel
// gather moves it), compute(t) writes an f32 workspace, rounded once into the saved tensor
// (Saved::add_as, kept so under --activation-dtype too), which both the forward's product and the
// weight gradient's read as it is: the same bits as each rounding it, one cast and half the bytes.
// `producer_rounds`: compute writes a `to` tensor itself, rounding as it stores (a norm's kernel):
// no workspace and no rounding pass, the same bits.
// Elsewhere compute writes the saved f32 tensor itself (Saved::add). Returns the saved tensor.
template <class F>
Tensor save_product_operand(UnitContext& c, Saved& s, const std::string& name, std::initializer_list<int64_t> shape,
                            DType to, bool only_products, F compute, bool producer_rounds = false) {
  if (!only_products || c.tp.sequence_parallel() || !products_round(c, to)) {
    Tensor t = s.add(c.pool, name, shape);
    compute(t);
    return t;
  }
  if (producer_rounds) {
    Tensor t = s.add_as(c.pool, name, shape, to);
    compute(t);
    return t;
  }
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Block wide = c.pool.alloc(DType::f32, n, Category::activations, name + " before rounding");
  compute(wide.view(DType::f32, shape));
  Tensor t = s.add_as(c.pool, name, shape, to);
  c.be.cast(t, wide.view(DType::f32, shape));
  return t;
}
// Tensors that follow one another in memory, each (rows_i, cols), as one (sum rows_i, cols) matrix
// (InternalError when one does not follow the previous one).
Tensor stacked(const std::vector<Tensor>& parts);

}  // namespace shardlab::blocks
