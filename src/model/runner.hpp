// runner.hpp — the one forward/loss/backward loop over a model's units, and UnitHooks: where a
// unit's parameters come from and where its gradients go. A full replica (Model) answers the
// hooks with its own buffers; a sharding strategy gathers before a unit runs, reduces after, and
// frees in between. The loop itself never knows which.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "src/model/unit.hpp"

namespace shardlab {

class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  // Unit u's parameters (and those it borrows), valid until after_forward(u) / after_backward(u).
  virtual ParamSet forward_params(size_t u) = 0;
  virtual void after_forward(size_t u) {}
  virtual ParamSet backward_params(size_t u) = 0;
  // Where unit u's backward accumulates its parameter gradients (borrowed tensors included).
  virtual ParamSet grads(size_t u) = 0;
  virtual void after_backward(size_t u) {}
  // A split backward's first part (a zero-bubble schedule's B) is done: its parameters are no
  // longer needed, and what it wrote to the gradients may be flushed; grads(u) is asked again for
  // the W pass, and after_backward(u) follows it.
  virtual void after_input_grad(size_t u) {}
  // Cross-entropy of this rank's logits (N, V): returns the sum of the N losses and writes
  // d(loss)/d(logits) times dlogit_scale over the logits (grad_dtype f32), or into `dlogits`, a block
  // of grad_dtype it allocates (each gradient rounded once: logits_grad_dtype). DP overrides it (the
  // loss lives on rank 0).
  virtual double loss(Backend& be, Pool& pool, Tensor logits, const Batch& batch, float dlogit_scale,
                      DType grad_dtype, Block& dlogits);
  // Forward-only (evaluation): the sum of this rank's share of the N losses; logits are left as
  // they are and no gradient is computed. DP overrides it (rank 0 takes the whole batch's sum).
  virtual double forward_loss(Backend& be, Pool& pool, Tensor logits, const Batch& batch);
  // The chunked loss head (--loss-chunk, blocks/loss_head.hpp) gives the N per-position losses
  // instead of logits: returns their sum and, when `backward`, overwrites them with d(sum)/d(loss) =
  // dloss_scale, what the head's backward reads. DP overrides it (the sum lives on rank 0).
  virtual double loss_rows(Backend& be, Pool& pool, Tensor losses, const Batch& batch, float dloss_scale,
                           bool backward);
  // The model's auxiliary channel of this micro-step (AuxChannel::pack: a mixture of experts'
  // balancing statistics), summed in place over the ranks whose tokens share the auxiliary loss
  // (the data-parallel and context-parallel group). A single replica has nothing to add.
  virtual void reduce_aux(std::span<float> packed) {}
};

struct RunResult {
  double loss_sum = 0;  // over this rank's B*T positions
  int64_t positions = 0;
  // A model with an auxiliary channel (src/model/aux.hpp): its loss of the micro-step times this
  // rank's B*T positions (summed over the data-parallel ranks and divided by the batch's positions,
  // the mean over micro-steps, as loss_sum gives the cross-entropy's), and its statistics
  // (AuxChannel::add_stats: a mixture of experts' drops and choices per expert, every rank's).
  double aux_sum = 0;
  std::vector<double> aux_stats;
};

// Forward through every unit, loss, backward through every unit in reverse. Activations come from
// the pool (category activations) and are freed as backward passes each unit. When logits is
// given, it receives this rank's logits before the loss overwrites them (under tensor
// parallelism: its vocabulary columns, (N, padded V / T)).
//
// With the chunked loss head (spec.loss_chunk > 0) the last unit gives the losses themselves
// (hooks.loss_rows; under tensor parallelism each chunk's vocabulary-parallel loss, the same on
// every rank of the group), and `logits` is left empty.
//
// Otherwise, under tensor parallelism (tp active, units made for tp.config) the loss is the
// vocabulary-parallel cross-entropy over the tp group (vocab_parallel_loss below) instead of
// hooks.loss / hooks.forward_loss; every rank of the group gets the same loss.
RunResult run_forward_backward(const std::vector<std::unique_ptr<Unit>>& units, const ModelSpec& spec, Backend& be,
                               Pool& pool, const Batch& batch, UnitHooks& hooks, float dlogit_scale,
                               std::vector<float>* logits = nullptr, Checkpointing checkpointing = Checkpointing::none,
                               const TpContext& tp = {}, EpContext* ep = nullptr);

// Forward through every unit and the loss, no backward (evaluation): returns this rank's loss sum.
// after_forward(u) follows each unit's forward as in training; hooks that keep a unit for a
// backward must know from their own state that none follows (Strategy::begin_eval).
RunResult run_forward(const std::vector<std::unique_ptr<Unit>>& units, const ModelSpec& spec, Backend& be, Pool& pool,
                      const Batch& batch, UnitHooks& hooks, std::vector<float>* logits = nullptr,
                      const TpContext& tp = {}, EpContext* ep = nullptr);

// The loss of the last unit's output `out` (N rows): the chunked head's losses summed
// (blocks::chunked_loss), else the vocabulary-parallel loss over `tp` when it is active, else the
// cross-entropy of the logits; with `backward`, out is left holding its gradient (logits: d(loss)/d(logits) times
// dlogit_scale; chunked: dlogit_scale per position), or, grad_dtype not f32 (the cross-entropy's
// only: logits_grad_dtype), *dlogits receives a block of that dtype holding it. The loop's and the
// pipeline executor's.
double head_loss(UnitHooks& hooks, Backend& be, Pool& pool, const TpContext& tp, const ModelSpec& spec, Tensor out,
                 const Batch& batch, float dlogit_scale, bool backward, DType grad_dtype = DType::f32,
                 Block* dlogits = nullptr);
// The dtype the cross-entropy writes the logits' gradient in for `head`'s backward: the head's own
// (Unit::output_grad_dtype: bf16 on a GPU whose products round), each gradient rounded once as its
// products would round it, in a block of its own (the f32 logits then freed); f32 (in place) under
// the chunked or the vocabulary-parallel loss, or without a backward.
DType logits_grad_dtype(const Unit& head, const TpContext& tp, const ModelSpec& spec, bool backward);
// That block: n elements of `t` (activations, "dlogits (bf16)"), UnitHooks::loss's and DP's.
Block logits_grad_block(Pool& pool, DType t, int64_t n);

// One unit's forward step, the loop's and the pipeline executor's (so both run the same
// operations in the same order): its output allocated, the unit run on the hooks' forward
// parameters, after_forward(u); `saved` kept only for a backward that reads it (`train`, and not
// a block that checkpointing recomputes); `release` (evaluation: the input, once read) freed last.
// The ledger phase names u. Returns the output.
Block forward_unit(Unit& unit, size_t u, UnitContext& ctx, UnitHooks& hooks, Tensor in, Saved& saved,
                   bool train, Block* release = nullptr);
// One unit's backward step: d(input) allocated when din_elems > 0; a block checkpointing dropped
// recomputed first (into `out`, or a scratch buffer when `out` is gone: a pipeline chunk's last
// output was sent away); the backward from `dout`; `saved` and `out` freed; `grad`, which held
// d(output), replaced by d(input) (empty for none); after_backward(u). The ledger phase names u.
// With `deferred` (a zero-bubble schedule's B pass) the weight-gradient GEMMs are held there
// (blocks/weight_grad.hpp) and after_backward(u) is left to weight_unit.
void backward_unit(Unit& unit, size_t u, UnitContext& ctx, UnitHooks& hooks, Tensor in, Block& out,
                   Saved& saved, Tensor dout, int64_t din_elems, Block& grad,
                   DeferredWeightGrads* deferred = nullptr);
// The W pass of unit u: the GEMMs its split backward held, into hooks.grads(u), then
// after_backward(u). The ledger phase names u.
void weight_unit(Unit& unit, size_t u, UnitContext& ctx, UnitHooks& hooks, DeferredWeightGrads& held);

// Megatron's vocabulary-parallel cross-entropy: logits (N, rows) are this rank's vocabulary rows
// of the head (vocab_shard). The row maxima are all-reduced (max) over the tp group, then each
// row's sum of exponentials and its target's logit (sum, one collective of 2N): 3N floats in all,
// and the (N, V) logits are never gathered (blocks::cross_entropy_rows over the N rows). Returns the
// sum of the N losses, the same on every rank; with dlogits (may alias logits) also their gradient
// times scale, zero in padding columns.
double vocab_parallel_loss(Backend& be, Pool& pool, const TpContext& tp, const ModelSpec& spec, Tensor logits,
                           const Batch& batch, Tensor dlogits, float scale);

// Views of every tensor of `unit` inside a flat f32 buffer laid out as the unit's layout says.
void add_unit_views(ParamSet& set, const UnitLayout& unit, Tensor flat);

}  // namespace shardlab
