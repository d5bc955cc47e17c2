// weight_grad.hpp — a backward's weight-gradient GEMMs, run at once or held for later (the W pass
// of a zero-bubble pipeline schedule, shard/pipeline/schedules/zb_h1.cpp).
//
// A unit's backward computes every dW += A^T B through weight_gemm. Without a recorder in the
// context it runs there; with one (UnitContext::deferred) the backward computes only the gradient
// of its input and what is cheap beside it (norms, biases, embeddings), and holds each weight
// GEMM's two operands: an operand that is a whole block the backward would free at its end (a
// saved activation, its output, the incoming gradient: set_sources) is kept as it is, with no copy
// (backward_unit hands the blocks over: wanted(), adopt()); any other (a workspace the backward
// reuses) is copied into the pool (category activations, "<unit> W operand"). run() later
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
  // The blocks the recording backward may hand over rather than have copied (their data pointers).
  void set_sources(std::vector<const void*> sources) { sources_ = std::move(sources); }
  void add_source(const void* data) { sources_.push_back(data); }
  // Holds dst += A^T B (`d`: trans_a T, trans_b N, beta 1): A and B kept or copied.
  void add(Backend& be, Pool& pool, const GemmDesc& d, Tensor a, Tensor b, Tensor dst);
  // The sources an operand is kept from, each once, in the order first held; adopt() takes those
  // blocks (the backward's owner moves them in before it frees the rest).
  std::vector<const void*> wanted() const { return wanted_; }
  void adopt(Block b) { kept_.push_back(std::move(b)); }
  // Computes every held GEMM into `g`'s tensors of the recorded names, then frees the copies.
  void run(Backend& be, const ParamSet& g);
  bool empty() const { return gemms_.empty(); }

 private:
  struct Gemm {
    GemmDesc desc;
    const void* a;
    const void* b;
    std::string target;  // the gradient tensor dst starts at
  };
  // An operand: kept (its source block, when it starts one) or a copy's data, the copy owned here.
  const void* hold(Backend& be, Pool& pool, Tensor t, int64_t elems);
  const ParamSet* g_ = nullptr;  // the recording backward's gradient views
  std::string unit_;
  std::vector<Gemm> gemms_;
  std::vector<const void*> sources_, wanted_;
  std::vector<Block> kept_;  // copies and adopted sources, freed after run()
};

// Within its scope the context's weight-gradient GEMMs run at once, held or not: the head's, whose
// operand d(logits) is N x V (Llama 3's vocabulary: 1.96 GiB per micro-batch of 4096 tokens, about
// twice what a Llama 3 8B layer holds for its W), so that the last stage, which owes a zero-bubble
// schedule's most W passes, does not hold one per micro-batch owed; its B computes that GEMM instead.
class WeightGradsNow {
 public:
  explicit WeightGradsNow(UnitContext& c) : c_(c), held_(c.deferred) { c.deferred = nullptr; }
  ~WeightGradsNow() { c_.deferred = held_; }
  WeightGradsNow(const WeightGradsNow&) = delete;
  WeightGradsNow& operator=(const WeightGradsNow&) = delete;

 private:
  UnitContext& c_;
  DeferredWeightGrads* held_;
};

// dst (m, n) += A^T B, the weight-gradient GEMM `d` of a backward (trans_a T, trans_b N, beta 1,
// A (k, m) with lda, B (k, n) with ldb): computed now, or held in c.deferred when it is set.
void weight_gemm(UnitContext& c, const GemmDesc& d, Tensor a, Tensor b, Tensor dst);
// As weight_gemm, with dbias (n floats, holding zeros) = the sums over k of B as the product reads
// it, in one product (Backend::gemm_bias_grad), where it runs now and the backend fuses it; false
// where not (nothing done): the caller runs weight_gemm and sums the bias gradient itself.
bool weight_gemm_bias_grad(UnitContext& c, const GemmDesc& d, Tensor a, Tensor b, Tensor dst, Tensor dbias);
// The descriptor of dW (m, n) += A^T B for A (k, m) and B (k, n), contiguous: f32 operands rounded as
// the weight (of dtype `weight`) is; weight_gemm sets the operands' dtypes from its tensors (one
// rounded already, blocks::rounded_once or save_product_operand, is read as it is).
inline GemmDesc weight_grad_desc(DType weight, int64_t m, int64_t n, int64_t k) {
  GemmDesc d;
  d.round_inputs_to = weight;
  d.trans_a = Trans::T;
  d.m = m, d.n = n, d.k = k;
  d.lda = m, d.ldb = n, d.ldc = n;
  d.beta = 1.f;
  return d;
}

}  // namespace shardlab
