// weight_grad.cpp — weight-gradient GEMMs now or later (weight_grad.hpp).
#include "src/model/blocks/weight_grad.hpp"

#include <algorithm>

namespace shardlab {
namespace {

void require_weight_gemm(const GemmDesc& d) {
  SHARD_CHECK(d.trans_a == Trans::T && d.trans_b == Trans::N && d.beta == 1.f && d.m > 0 && d.n > 0 && d.k > 0 &&
                  d.lda >= d.m && d.ldb >= d.n,
              "a weight-gradient GEMM is dW (m, n) += A^T B with beta 1; got m {} n {} k {} lda {} ldb {} beta {}",
              d.m, d.n, d.k, d.lda, d.ldb, d.beta);
}

}  // namespace

const void* DeferredWeightGrads::hold(Backend& be, Pool& pool, Tensor t, int64_t elems) {
  SHARD_CHECK(t.numel() >= elems, "{}: a W operand {} {} for {} elements", unit_, dtype_name(t.dtype()),
              t.shape_str(), elems);
  const void* data = t.data();
  if (std::find(sources_.begin(), sources_.end(), data) != sources_.end()) {
    if (std::find(wanted_.begin(), wanted_.end(), data) == wanted_.end()) wanted_.push_back(data);
    return data;
  }
  Block copy = pool.alloc(t.dtype(), elems, Category::activations, unit_ + " W operand");
  be.copy(copy.flat(t.dtype()), t.slice(0, elems));
  kept_.push_back(std::move(copy));
  return kept_.back().data();
}

void DeferredWeightGrads::add(Backend& be, Pool& pool, const GemmDesc& d, Tensor a, Tensor b, Tensor dst) {
  require_weight_gemm(d);
  SHARD_CHECK(g_, "{}: a weight gradient held outside a recording backward", unit_);
  const std::string target = g_->name_at(dst.data());
  SHARD_CHECK(!target.empty(), "{}: a weight gradient at {} is none of the unit's gradient tensors", unit_, dst.data());
  const void* ka = hold(be, pool, a, (d.k - 1) * d.lda + d.m);
  const void* kb = hold(be, pool, b, (d.k - 1) * d.ldb + d.n);
  gemms_.push_back({d, ka, kb, target});
}

void DeferredWeightGrads::run(Backend& be, const ParamSet& g) {
  for (const Gemm& x : gemms_) be.gemm(x.desc, x.a, x.b, g(x.target).data());
  gemms_.clear();
  kept_.clear();
  sources_.clear();
  wanted_.clear();
}

void weight_gemm(UnitContext& c, const GemmDesc& desc, Tensor a, Tensor b, Tensor dst) {
  GemmDesc d = desc;
  d.a_type = a.dtype(), d.b_type = b.dtype();  // an operand rounded already (blocks::rounded_once) as it is
  if (c.deferred) return c.deferred->add(c.be, c.pool, d, a, b, dst);
  c.be.gemm(d, a.data(), b.data(), dst.data());
}

bool weight_gemm_bias_grad(UnitContext& c, const GemmDesc& desc, Tensor a, Tensor b, Tensor dst, Tensor dbias) {
  GemmDesc d = desc;
  d.a_type = a.dtype(), d.b_type = b.dtype();
  require_weight_gemm(d);
  SHARD_CHECK(dbias.dtype() == DType::f32 && dbias.numel() == d.n, "a bias gradient of {} {} for a product of n {}",
              dtype_name(dbias.dtype()), dbias.shape_str(), d.n);
  if (c.deferred || !c.be.fuses_gemm_epilogue(d)) return false;
  return c.be.gemm_bias_grad(d, a.data(), b.data(), dst.data(), dbias.ptr<float>());
}

}  // namespace shardlab
