#include "src/model/blocks/linear.hpp"

#include "src/backend/ops/activation.hpp"
#include "src/model/blocks/weight_grad.hpp"

namespace shardlab::blocks {

void linear_forward(Backend& be, Tensor out, Tensor inp, Tensor w, int64_t N, float beta) {
  const int64_t OC = w.dim(0), IC = w.dim(1);
  GemmDesc d = gemm_with(w);
  d.a_type = inp.dtype();  // f32, or rounded already (save_product_operand)
  d.c_type = out.dtype();  // f32, or bf16 where its readers take it so
  d.beta = beta;
  d.trans_b = Trans::T;
  d.m = N, d.n = OC, d.k = IC;
  d.lda = IC, d.ldb = IC, d.ldc = OC;
  be.gemm(d, inp.data(), w.data(), out.data());
}

void linear_backward(UnitContext& c, Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, int64_t N) {
  const int64_t OC = w.dim(0), IC = w.dim(1);
  Block held;
  const Tensor dy = rounded_once(c, dout, w.dtype(), held, "linear backward rounded dout");
  GemmDesc dx = gemm_with(w);
  dx.a_type = dy.dtype();
  dx.c_type = dinp.dtype();
  dx.m = N, dx.n = IC, dx.k = OC;
  dx.lda = OC, dx.ldb = IC, dx.ldc = IC;
  c.be.gemm(dx, dy.data(), w.data(), dinp.data());
  weight_gemm(c, weight_grad_desc(w.dtype(), OC, IC, N), dy, inp, dw);
}

bool products_round(const UnitContext& c, DType to) { return c.be.low_precision_gemm() && to != DType::f32; }

Tensor rounded_once(UnitContext& c, Tensor x, DType to, Block& held, const std::string& what) {
  if (!products_round(c, to) || x.dtype() != DType::f32) return x;
  held = c.pool.alloc(to, x.numel(), Category::workspace, what);
  const Tensor r = held.flat(to).reshape(x.shape());
  c.be.cast(r, x);
  return r;
}

void gemm_epilogue(Backend& be, const GemmDesc& d, const void* a, const void* b, Tensor out, GemmEpilogue e,
                   Tensor bias, Tensor aux) {
  SHARD_CHECK(out.dtype() == DType::f32 && d.c_type == DType::f32 && (!aux.data() || aux.dtype() == DType::f32) &&
                  e != GemmEpilogue::bias_grad,
              "gemm with a {} epilogue into a {} C on {}: the f32 form (a bf16 C takes the UnitContext one; a bias "
              "gradient, weight_gemm_bias_grad)",
              gemm_epilogue_name(e), dtype_name(out.dtype()), be.describe());
  if (be.fuses_gemm_epilogue(d) && be.gemm_epilogue(d, a, b, out.data(), e, bias.data() ? bias.ptr<float>() : nullptr,
                                                     aux.data()))
    return;
  switch (e) {
    case GemmEpilogue::bias:
      be.gemm(d, a, b, out.data());
      be.add_bias(out, bias);
      return;
    case GemmEpilogue::bias_gelu:
      be.gemm(d, a, b, aux.data());
      be.add_bias(aux, bias);
      ops::gelu_forward(be, out, aux);
      return;
    case GemmEpilogue::dgelu:
      be.gemm(d, a, b, out.data());
      ops::gelu_backward(be, out, aux, out);
      return;
    case GemmEpilogue::bias_grad: return;  // refused above
  }
}

void gemm_epilogue(UnitContext& c, GemmDesc d, const void* a, const void* b, Tensor out, GemmEpilogue e, Tensor bias,
                   Tensor aux) {
  d.c_type = out.dtype();
  if (out.dtype() == DType::f32) return gemm_epilogue(c.be, d, a, b, out, e, bias, aux);
  SHARD_CHECK(d.beta == 0.f, "gemm with a {} epilogue summing into a bf16 C", gemm_epilogue_name(e));
  SHARD_CHECK(out.dtype() == DType::bf16 && (!aux.data() || aux.dtype() == DType::bf16),
              "gemm with a {} epilogue: C {} and aux {} (bf16 C: bf16 aux)", gemm_epilogue_name(e),
              dtype_name(out.dtype()), aux.data() ? dtype_name(aux.dtype()) : "none");
  if (c.be.fuses_gemm_epilogue(d) &&
      c.be.gemm_epilogue(d, a, b, out.data(), e, bias.data() ? bias.ptr<float>() : nullptr, aux.data()))
    return;
  d.c_type = DType::f32;
  Block wide = c.pool.alloc(DType::f32, out.numel(), Category::workspace, "gemm epilogue f32 C");
  Block wide_aux;
  if (aux.data()) {
    wide_aux = c.pool.alloc(DType::f32, aux.numel(), Category::workspace, "gemm epilogue f32 aux");
    if (e == GemmEpilogue::dgelu) c.be.cast(wide_aux.flat(DType::f32), aux);
  }
  const Tensor w = wide.flat(DType::f32).reshape(out.shape());
  const Tensor wa = aux.data() ? wide_aux.flat(DType::f32).reshape(aux.shape()) : Tensor();
  gemm_epilogue(c.be, d, a, b, w, e, bias, wa);
  c.be.cast(out, w);
  if (e == GemmEpilogue::bias_gelu) c.be.cast(aux, wa);
}

Tensor stacked(const std::vector<Tensor>& parts) {
  const Tensor& first = parts.front();
  const int64_t cols = first.dim(1);
  const char* next = static_cast<const char*>(first.data());
  int64_t rows = 0;
  for (const Tensor& t : parts) {
    SHARD_CHECK(t.data() == next && t.dtype() == first.dtype() && t.ndim() == 2 && t.dim(1) == cols,
                "stacked weights: a {} {} tensor at {} does not follow the previous one (expected at {})",
                dtype_name(t.dtype()), t.shape_str(), t.data(), static_cast<const void*>(next));
    next += t.bytes();
    rows += t.dim(0);
  }
  return Tensor(first.data(), first.dtype(), {rows, cols}, first.device());
}

}  // namespace shardlab::blocks
