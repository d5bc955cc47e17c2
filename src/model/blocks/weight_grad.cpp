// weight_grad.cpp — weight-gradient GEMMs now or later (weight_grad.hpp).
#include "src/model/blocks/weight_grad.hpp"

namespace shardlab {
namespace {

void require_weight_gemm(const GemmDesc& d) {
  SHARD_CHECK(d.trans_a == Trans::T && d.trans_b == Trans::N && d.beta == 1.f && d.m > 0 && d.n > 0 && d.k > 0 &&
                  d.lda >= d.m && d.ldb >= d.n,
              "a weight-gradient GEMM is dW (m, n) += A^T B with beta 1; got m {} n {} k {} lda {} ldb {} beta {}",
              d.m, d.n, d.k, d.lda, d.ldb, d.beta);
}

// The first `n` elements of t (f32), copied into a new block of the pool.
Block copy_of(Backend& be, Pool& pool, Tensor t, int64_t n, const std::string& name) {
  SHARD_CHECK(t.dtype() == DType::f32 && t.numel() >= n, "W operand {}: {} {} for {} elements", name,
              dtype_name(t.dtype()), t.shape_str(), n);
  Block b = pool.alloc(DType::f32, n, Category::activations, name);
  be.copy(b.flat(DType::f32), t.slice(0, n));
  return b;
}

}  // namespace

void DeferredWeightGrads::add(Backend& be, Pool& pool, const GemmDesc& d, Tensor a, Tensor b, Tensor dst) {
  require_weight_gemm(d);
  SHARD_CHECK(g_, "{}: a weight gradient held outside a recording backward", unit_);
  const std::string target = g_->name_at(dst.data());
  SHARD_CHECK(!target.empty(), "{}: a weight gradient at {} is none of the unit's gradient tensors", unit_, dst.data());
  Gemm g{d, copy_of(be, pool, a, (d.k - 1) * d.lda + d.m, unit_ + " W operand"),
         copy_of(be, pool, b, (d.k - 1) * d.ldb + d.n, unit_ + " W operand"), target};
  gemms_.push_back(std::move(g));
}

void DeferredWeightGrads::run(Backend& be, const ParamSet& g) {
  for (Gemm& x : gemms_) {
    const Tensor dst = g(x.target);
    be.gemm(x.desc, x.a.data(), x.b.data(), dst.data());
    x.a.reset();
    x.b.reset();
  }
  gemms_.clear();
}

void weight_gemm(UnitContext& c, const GemmDesc& d, Tensor a, Tensor b, Tensor dst) {
  if (c.deferred) return c.deferred->add(c.be, c.pool, d, a, b, dst);
  c.be.gemm(d, a.data(), b.data(), dst.data());
}

}  // namespace shardlab
