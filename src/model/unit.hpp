// unit.hpp — the model-neutral pieces every family's units are made of.
//
// A Unit is the FSDP wrapping granularity (for GPT-2: the embedding, each transformer block, and
// the head). A unit computes with the tensors a ParamSet hands it, wherever they live (a full
// replica, or a freshly gathered unit), and keeps what backward needs in Saved, allocated from the
// pool as `activations`. Every kernel goes through Backend. A family (family.hpp) makes its units;
// the runner, the strategies and the trainer see only this interface.
#pragma once
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "memory/pool.hpp"
#include "src/backend/backend.hpp"
#include "src/model/spec.hpp"

namespace shardlab {

class Communicator;  // src/comm/communicator.hpp (only a pointer here: the fuzzers build the model alone)
struct CpContext;   // src/model/parallel/cp.hpp
struct EpContext;   // src/model/parallel/ep.hpp
class DeferredWeightGrads;  // src/model/blocks/weight_grad.hpp
class AuxChannel;  // src/model/aux.hpp

// Token ids for one micro-batch, on the backend's device: inputs and targets, (B, T) each.
struct Batch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  int64_t B = 0, T = 0;
  // Every rank's targets of this micro-step in rank order (world x B x T), for a strategy that
  // computes the whole batch's loss on one rank (dp); null when the caller has none.
  const int32_t* global_targets = nullptr;
  int world = 1;
  // Context parallelism (--cp): the B x T tokens are this rank's pieces of longer sequences
  // (src/model/parallel/cp.hpp); null when they are whole sequences.
  CpContext* cp = nullptr;
  bool context_parallel() const;
};

// Activation checkpointing (--activation-checkpointing): what a transformer block keeps from its
// forward for its backward. none: everything. attention: all but the attention probabilities
// (B, H, T, T), recomputed from q and k in backward (Korthikanti et al.'s selective recomputation).
// blocks: only its input (the previous unit's output, which the runner keeps anyway); its forward
// runs again just before its backward, with the parameters backward uses. Kernels are
// deterministic, so either gives bit-identical results.
enum class Checkpointing : uint8_t { none, attention, blocks };
Checkpointing parse_checkpointing(const std::string& s);  // InputError naming the choices otherwise
const char* checkpointing_name(Checkpointing c);
// The settings a model allows, cheapest first: none, and with two blocks or more attention, blocks.
std::vector<Checkpointing> checkpointing_choices(const ModelSpec& spec);

// Tensors by name (views; the owner is elsewhere).
class ParamSet {
 public:
  void set(const std::string& name, Tensor t) { map_[name] = t; }
  Tensor operator()(const std::string& name) const;
  bool has(const std::string& name) const { return map_.count(name) != 0; }
  // The name of the tensor that starts at `data` ("" for none).
  std::string name_at(const void* data) const;
  // A weight as a GEMM takes it: its low-precision storage (the gathered bf16 parameters) when the
  // strategy set one (on a backend with fast low-precision GEMMs), else the f32 view above.
  Tensor gemm(const std::string& name) const;
  // The low-precision views, and the tensors that have no f32 copy here (Unit::gemm_only).
  void set_low(ParamSet low, std::shared_ptr<const std::set<std::string>> gemm_only = nullptr) {
    low_ = std::make_shared<const ParamSet>(std::move(low));
    gemm_only_ = std::move(gemm_only);
  }
  // Gradients handed out as zeros (a fresh f32 workspace, MixedPrecision::compute_grads): the
  // unit's own tensors (`own`), each claimed once, copies of the set sharing the claims.
  // claim_zeroed(name): whether `name` still holds those zeros, so that its producer may write it
  // rather than add to it (a product's bias-gradient epilogue, Backend::gemm_bias_grad); false for
  // any later producer, which adds. A producer that adds without claiming must not run first.
  void set_zeroed(const UnitLayout& own);
  bool claim_zeroed(const std::string& name) const;

 private:
  std::map<std::string, Tensor> map_;
  std::shared_ptr<const ParamSet> low_;
  std::shared_ptr<const std::set<std::string>> gemm_only_;
  std::shared_ptr<std::set<std::string>> zeroed_;  // not claimed yet
};

// A GEMM over f32 activations and a weight `w` as ParamSet::gemm gives it: a bf16 weight goes to
// the GEMM as it is, and the activations are rounded to bf16 to meet it (f32 accumulation).
inline GemmDesc gemm_with(const Tensor& w) {
  GemmDesc d;
  d.b_type = w.dtype();
  d.round_inputs_to = w.dtype();
  return d;
}

// What a unit's forward keeps for its backward; freed (back to the pool) by clear().
//
// --activation-dtype bf16 (ModelSpec::activation_dtype): a unit computes its forward in f32 (but
// for what crosses the tensor-parallel group, src/model/tp.hpp, and a GPU's naive attention,
// blocks/attention.hpp), then the runner narrows what it saved to bf16 (narrow(), right after the
// forward) and widens it again just before the backward (widen()), so between the two every unit's
// saved tensors take half the memory, Megatron's 2 bytes an activation. On a GPU with bf16 products
// GPT-2's and the Llama-shaped families' producers write their saved tensors in bf16 themselves
// (add_as; blocks::activations_written_bf16), which narrow() and widen() leave as they are.
// Statistics and indices (the norms' mean and rstd, attention's lse, a router's probabilities,
// weights and routing) stay f32: add_f32.
class Saved {
 public:
  Tensor add(Pool& pool, const std::string& name, std::initializer_list<int64_t> shape);
  // As add, kept in f32 whatever the activation dtype (statistics; int32 data in an f32 block).
  Tensor add_f32(Pool& pool, const std::string& name, std::initializer_list<int64_t> shape) {
    return add_as(pool, name, shape, DType::f32);
  }
  // In `dtype`, kept so: narrow() and widen() leave it (a products' operand saved rounded, as
  // blocks::save_product_operand keeps one).
  Tensor add_as(Pool& pool, const std::string& name, std::initializer_list<int64_t> shape, DType dtype);
  // Every tensor add() made, now f32, moved to a new `to` block (rounded to nearest even) and its
  // f32 block freed; widen() moves them back (exactly: f32 holds every bf16 value). Other views of
  // the old blocks are stale after either.
  void narrow(Backend& be, Pool& pool, DType to);
  void widen(Backend& be, Pool& pool);
  // The tensor `name` moved to a `to` block now (rounded once) and kept so; returns it.
  Tensor round(Backend& be, Pool& pool, const std::string& name, DType to);
  Tensor operator()(const std::string& name) const;
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  bool empty() const { return tensors_.empty(); }
  void drop(const std::string& name);  // frees one saved tensor now
  // The block of the saved tensor that starts at `data`, moved out (empty when none does): a split
  // backward keeps it for its weight pass (blocks/weight_grad.hpp).
  Block take(const void* data);
  std::vector<const void*> block_starts() const;  // each saved block's data
  void clear() {
    tensors_.clear();
    blocks_.clear();
    as_stored_.clear();
  }

 private:
  void move_to(Backend& be, Pool& pool, DType from, DType to);
  void move_one(Backend& be, Pool& pool, const std::string& name, Tensor& t, DType to);

  std::vector<Block> blocks_;
  std::map<std::string, Tensor> tensors_;
  std::set<std::string> as_stored_;  // add_as's (add_f32's)
};

// The tensor-parallel group a rank's units compute in (--tp): its degree and rank, whether
// sequence parallelism splits the activations between the regions, and the group's communicator
// (null at degree 1). src/model/tp.hpp has the regions' communication.
struct TpContext {
  TpConfig config;
  Communicator* comm = nullptr;
  bool active() const { return config.degree > 1; }
  bool sequence_parallel() const { return active() && config.sequence_parallel; }
};

struct UnitContext {
  Backend& be;
  Pool& pool;
  const ModelSpec& spec;
  Batch batch;
  Checkpointing checkpointing = Checkpointing::none;
  TpContext tp;
  // Expert parallelism (--ep): the group a mixture of experts' layers send their tokens over
  // (src/model/parallel/ep.hpp); null when the experts are all on this rank.
  EpContext* ep = nullptr;
  bool expert_parallel() const;
  // Set while a split backward (a zero-bubble schedule's B) runs: weight-gradient GEMMs are held
  // there for the W pass instead of computed (blocks/weight_grad.hpp).
  DeferredWeightGrads* deferred = nullptr;
  // The model's auxiliary channel for this micro-batch (src/model/aux.hpp: a mixture of experts'
  // balancing statistics), added to by the units' forwards and read by their backwards; null: none
  // kept (evaluation, decoding, a model without one).
  AuxChannel* aux = nullptr;
  // Set while checkpointing runs a unit's forward again before its backward.
  bool recomputing = false;
};

class Unit {
 public:
  explicit Unit(UnitLayout layout) : layout_(std::move(layout)) {}
  virtual ~Unit() = default;
  const UnitLayout& layout() const { return layout_; }
  const std::string& name() const { return layout_.name; }
  // Tensors of other units this unit computes with (a tied head borrows the token embedding).
  virtual std::vector<std::string> borrowed() const { return {}; }
  // Whether it reads `tensor` (its own or borrowed) only as its GEMMs take it (ParamSet::gemm): on a
  // backend with low-precision GEMMs under mixed precision, no f32 copy of it is made for this unit
  // (Strategy::compute_views), and reading one (ParamSet's operator()) is an internal error.
  virtual bool gemm_only(const std::string& /*tensor*/) const { return false; }
  // Whether its backward reads its parameters at all (an embedding's does not): where not, no f32
  // copy is made for it (as for gemm_only's tensors).
  virtual bool backward_reads_params() const { return true; }
  // Pipeline parallelism: a borrowed tensor whose owner is on another stage becomes this unit's
  // own, appended to its layout as a tied copy (TensorDecl::tied_copy); borrowed_tensors() then
  // finds it here. `owner` is the owner's declaration.
  void adopt_tied_copy(const TensorDecl& owner);
  // Whether --activation-checkpointing applies: its forward can run again before its backward.
  virtual bool recomputable() const { return false; }
  // Elements (f32) of this unit's output for a (B, T) batch; the runner allocates it.
  virtual int64_t out_elems(const ModelSpec& s, int64_t B, int64_t T) const { return B * T * s.dim; }
  // Elements its training forward keeps in `saved` for a (B, T) batch under `ck`, at least (T the
  // rank's positions: under context parallelism its pieces'), each of 2 bytes at least (f32, or
  // bf16: --activation-dtype, a GPU's products' operands): plan rules layouts out with it before
  // predicting them, and checks each prediction's peak against it. 0 unless written.
  virtual int64_t saved_elems_at_least(const ModelSpec&, int64_t /*B*/, int64_t /*T*/, Checkpointing /*ck*/,
                                       bool /*context_parallel*/) const {
    return 0;
  }

  // in: the previous unit's output (empty for the embedding); out: out_elems floats.
  virtual void forward(UnitContext& ctx, const ParamSet& p, Tensor in, Tensor out, Saved& saved) = 0;
  // dout: gradient of out; din: receives the gradient of in (overwritten; empty for the
  // embedding). Parameter gradients in g accumulate.
  virtual void backward(UnitContext& ctx, const ParamSet& p, const ParamSet& g, Saved& saved, Tensor in,
                        Tensor dout, Tensor din) = 0;

  // The dtype this unit's backward reads its output's gradient in, as its last forward found it:
  // f32, or a head's products' dtype where they round (bf16 on a GPU: blocks::products_round), in
  // which the loss writes the logits' gradient where it writes the whole of it (runner.hpp's
  // logits_grad_dtype: not the chunked or the vocabulary-parallel loss), each rounded once.
  DType output_grad_dtype() const { return output_grad_dtype_; }

  // Incremental decoding (sample's KV cache, decode.hpp): whether forward_cached is written.
  virtual bool decodes() const { return false; }
  // forward() of positions [pos0, pos0 + batch.T) of batch.B sequences whose earlier positions
  // this unit has seen through `cache` in earlier calls (pos0 = 0 starts afresh): a unit whose
  // output depends on other positions keeps there what it needs of them (a layer's keys and
  // values, for spec.seq positions), allocating it on the first call. out as forward's. The
  // default refuses: a unit that decodes overrides both.
  virtual void forward_cached(UnitContext& ctx, const ParamSet& p, Tensor in, Tensor out, Saved& cache, int64_t pos0);

 protected:
  DType output_grad_dtype_ = DType::f32;  // output_grad_dtype(): a head's forward sets it

 private:
  UnitLayout layout_;
};

// The tensors unit u borrows from other units (tied weights), with the index of their owner;
// none that the unit holds itself (a tied copy).
struct BorrowedTensor {
  size_t owner;
  const TensorDecl* decl;
};
std::vector<BorrowedTensor> borrowed_tensors(const std::vector<std::unique_ptr<Unit>>& units, size_t u);

}  // namespace shardlab
