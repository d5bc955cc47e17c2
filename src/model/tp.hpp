// tp.hpp — the communication of Megatron's tensor-parallel regions, shared by every family's units.
//
// A transformer layer under tensor parallelism is two regions: attention (q/k/v column-parallel by
// heads, the output projection row-parallel) and the MLP (first linears column-parallel, the
// second row-parallel). A region's input enters whole on every rank and its output leaves as
// partial sums, one per rank:
//
//                      forward                         backward
//   region input       without SP: nothing             all-reduce the input's gradient
//                      with SP: all-gather the rows    reduce-scatter it
//   region output      without SP: all-reduce          nothing
//                      with SP: reduce-scatter         all-gather the output's gradient
//
// Without sequence parallelism the activations between regions (norms, residuals, the units'
// inputs and outputs) are the whole (N, C) on every rank, N = B*T; with it (--sequence-parallel)
// each rank holds N/T of the token rows, contiguous, in rank order: the same bytes move, as
// all-gathers and reduce-scatters instead of all-reduces, and those activations take 1/T of the
// memory. The vocabulary-parallel embedding leaves as a region output; the head enters as a
// region input.
//
// At degree 1 (no communicator) every call is a copy at most; units keep their tp-1 code paths
// and call these only under tensor parallelism.
//
// --activation-dtype bf16: the regions' rows (and their gradients) cross the group in bf16, as
// Megatron's activations do, staged through bf16 copies of the f32 tensors on either side; sums of
// partial sums are then rounded as the collective rounds them.
#pragma once
#include <string>
#include <vector>

#include "src/model/unit.hpp"

namespace shardlab {

// Token rows this rank holds between regions: N / degree with sequence parallelism, else N.
// InputError when sequence parallelism is on and the degree does not divide N.
int64_t tp_local_rows(const TpContext& tp, int64_t N);

// A unit's token rows between regions (tp_local_rows of the context's group), checking that the
// unit, built for the group `built`, runs in it.
int64_t tp_unit_rows(const UnitContext& c, const TpConfig& built);
// Under sequence parallelism, a workspace for a region's whole (N, C) rows: what an all-gather
// fills, or the partial sums a reduce-scatter reads. Without it nothing: the rows are whole.
Block tp_whole_rows(UnitContext& c, const std::string& what);
// That workspace as (N, C), or `rows` (the rank's rows, whole without sequence parallelism).
Tensor tp_whole_or(const Block& whole, const UnitContext& c, Tensor rows);

// A region's input for its column-parallel GEMMs: `local` itself without SP; with SP its rows from
// every rank all-gathered into `full` (N, C), which is returned.
Tensor tp_region_input(UnitContext& c, Tensor local, Tensor full);
// Its backward: dfull (N, C) holds this rank's partial gradient of the region input. dlocal receives
// the group's sum for this rank's rows: all-reduced (dlocal may be dfull itself) without SP,
// reduce-scattered with it.
void tp_region_input_backward(UnitContext& c, Tensor dfull, Tensor dlocal);
// A region's output: partial (N, C) holds this rank's partial sums. local receives the group's sum
// for this rank's rows: all-reduced (local may be partial itself) without SP, reduce-scattered with it.
void tp_region_output(UnitContext& c, Tensor partial, Tensor local);
// Its backward: the output's gradient for every row: dlocal itself without SP; with SP every rank's
// rows all-gathered into dfull (N, C), which is returned.
Tensor tp_region_output_backward(UnitContext& c, Tensor dlocal, Tensor dfull);
// t summed over the group in place (nothing at degree 1): partial sums every rank needs whole (a
// mixture of experts' routing-weight gradients, from the rank's slices of the experts).
void tp_sum(UnitContext& c, Tensor t);
// t's elementwise maximum over the group in place (nothing at degree 1): the vocabulary-parallel
// loss's row maxima (blocks/loss_head.hpp).
void tp_max(UnitContext& c, Tensor t);

// Gradients of replicated tensors (norm weights and biases, row-parallel biases) that a rank
// computes from its own token rows only (with SP) are partial sums: backward accumulates them
// into zeroed scratch instead (operator()), and reduce() all-reduces the scratch over the group
// and adds it to the gradients in one collective. Without SP every rank computes them from all
// rows alike: operator() is the gradient itself and reduce() does nothing.
//
// by_heads: tensors whose gradient sums over the heads, which the group splits (Qwen3's q/k norm
// weights): partial whenever the group has more than one rank, SP or not.
class TpPartialGrads {
 public:
  TpPartialGrads(UnitContext& c, const ParamSet& g, std::vector<std::string> names, const std::string& what,
                 bool by_heads = false);
  Tensor operator()(const std::string& name) const;
  void reduce();

 private:
  UnitContext& c_;
  ParamSet g_, scratch_;
  std::vector<std::string> names_;
  Block block_;
};

// The bus bytes one rank moves over its tensor-parallel group in one micro-step's forward and
// backward, as the communicator counts them (f = (T-1)/T; an all-reduce of x bytes is 2f x, an
// all-gather or reduce-scatter of a whole x f x), for the units above and the runner's loss, with
// A = the micro-batch's B*T*C activations in the activation dtype (f32, or bf16: above):
//
//                       without SP                      with --sequence-parallel
//   embedding           all-reduce A                    reduce-scatter A; all-gather A backward
//   each layer          2 all-reduces A forward,        2 all-gathers + 2 reduce-scatters A forward;
//                       2 backward                      backward 2 all-gathers of the outputs' gradients,
//                                                       2 re-gathers of the region inputs, 2 reduce-
//                                                       scatters, and an all-reduce of its norms'
//                                                       gradients (a row-parallel bias sums the
//                                                       gathered output gradient: none)
//   head                all-reduce A backward           all-gather A; backward a re-gather, a reduce-
//                                                       scatter and an all-reduce of ln_f's gradients
//   loss                all-reduce of B*T floats (max), then of 2 B*T (sums)
//
// --activation-checkpointing blocks runs each layer's forward (and its collectives) again in
// backward. `layout` is this rank's (family.layout(spec, tp)): the embedding first, the head last.
double tp_micro_step_bus_bytes(const std::vector<UnitLayout>& layout, const ModelSpec& spec, const TpConfig& tp,
                               int64_t B, int64_t T, Checkpointing checkpointing);

// `train --save` under tensor parallelism: the whole model's unit buffers (values[u] in layout
// whole[u], tensor-parallel degree 1) on rank 0 of `tp` from every rank's part of them (parts[u]:
// unit u's buffer in its layout local[u], as Strategy::gather_unit_params gives it); the other
// ranks get nothing. Collective over tp, whose rank r must hold tensor-parallel rank r's part.
std::vector<std::vector<float>> gather_tp_units(Communicator& tp, const std::vector<UnitLayout>& local,
                                                const std::vector<UnitLayout>& whole,
                                                const std::vector<std::vector<float>>& parts);

}  // namespace shardlab
