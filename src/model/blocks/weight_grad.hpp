// weight_grad.hpp — a backward's weight-gradient GEMMs, run at once or held for later (the W pass
// of a zero-bubble pipeline schedule, shard/pipeline/schedules/zb_h1.cpp).
//
// A unit's backward computes every dW += A^T B through weight_gemm. Without a recorder in the
// context it runs there; with one (UnitContext::deferred) the backward computes only the gradient
// of its input and what is cheap beside it (norms, biases, embeddings), and each weight GEMM's two
// operands are copied into the pool (category activations, "<unit> W operand"): the backward's
// buffers are reused before it ends, and the unit's saved tensors are freed with it. run() later
// computes the held GEMMs, in the order they were recorded, into the gradient tensors of the same
// names in a fresh gradient ParamSet (the strategy's views may have moved: mixed precision hands
// out a new f32 buffer after each flush), and frees the copies. A GEMM computed later is the same
// GEMM on the same values: gradients are bit-identical to the unsplit backward's as long as the
// held GEMMs of one tensor run in the same order.
#pragma once
#include <string>
#include <vector>

#include "src/model/unit.hpp"

namespace shardlab {

class DeferredWeightGrads {
 public:
  explicit DeferredWeightGrads(std::string unit = "") : unit_(std::move(unit)) {}
  // The gradient views of the backward that records (its targets' names are resolved there), or
  // none between backwards.
  void set_grads(const ParamSet* g) { g_ = g; }
  // Holds dst += A^T B (`d`: trans_a T, trans_b N, beta 1) with copies of A and B.
  void add(Backend& be, Pool& pool, const GemmDesc& d, Tensor a, Tensor b, Tensor dst);
  // Computes every held GEMM into `g`'s tensors of the recorded names, then frees the copies.
  void run(Backend& be, const ParamSet& g);
  bool empty() const { return gemms_.empty(); }

 private:
  struct Gemm {
    GemmDesc desc;
    Block a, b;
    std::string target;  // the gradient tensor dst starts at
  };
  const ParamSet* g_ = nullptr;  // the recording backward's gradient views
  std::string unit_;
  std::vector<Gemm> gemms_;
};

// dst (m, n) += A^T B, the weight-gradient GEMM `d` of a backward (trans_a T, trans_b N, beta 1,
// A (k, m) with lda, B (k, n) with ldb): computed now, or held in c.deferred when it is set.
void weight_gemm(UnitContext& c, const GemmDesc& d, Tensor a, Tensor b, Tensor dst);

}  // namespace shardlab
