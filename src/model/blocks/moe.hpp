// moe.hpp — the mixture-of-experts MLP of Mixtral and Qwen3-MoE (transformers'
// MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock), forward and backward, and the load-balancing
// statistics behind the auxiliary loss.
//
// Router: logits (N, E) = x Wr^T; probabilities softmax(logits) in f32; each token's k most probable
// experts (ties: the lower index), their probabilities as weights, divided by their sum when
// spec.moe.norm_topk (Mixtral always does). DeepSeek-V3's router (spec.moe.sigmoid): scores
// sigmoid(logits), the choice by score + correction bias within the best groups (MoeSpec), the
// weights the scores over their sum + 1e-20 (norm_topk) times routed_scale; no auxiliary loss. Experts: SwiGLU MLPs, out = sum over the k choices of
// weight x down(silu(gate(x)) * up(x)). Dropless unless --moe-capacity-factor F: then, in training,
// expert e takes at most ceil(F N k / E) of the N tokens' slots, in token order, and a dropped slot
// adds nothing (evaluation and decoding stay dropless).
//
// The routing runs on the host whatever the backend: on CUDA the logits, the routing and the
// router's gradient cross the bus each layer (N x E floats and N k indices, each copy a stream
// synchronisation), a known cost until a device top-k is written.
//
// The routing is decided on the host (the logits are copied there; on the meta backend, which has
// no values, slot (n, j) goes to expert (n k + j) mod E: balanced, as plan and profile assume), and
// the kept slots are sorted by expert into one buffer of N k rows (ops/moe.hpp), so every expert's
// tokens are one contiguous run and its two products are one GEMM each. Every buffer is sized for
// N k rows whatever the routing, so memory does not depend on the data. Under expert parallelism
// (--ep, src/model/parallel/ep.hpp) those rows travel to the ranks holding their experts and back,
// and the expert rows a rank computes follow the group's routing.
//
// Auxiliary-loss-free balancing (DeepSeek-V3, spec.moe.bias_rate γ > 0): for a sigmoid router the
// channel also counts each MoE layer's top-k choices per expert (the loads), summed over the data-parallel and
// context-parallel ranks as the rest, so every rank holds the global batch's; after the optimizer's
// update, layer l's correction bias moves by γ sign(mean_e load - load_e) per expert (bias_steps,
// applied by the Trainer through Strategy::optimizer_step where each rank holds the bias). The loads
// are whole numbers, exact in the f32 sums up to 2^24 per layer and expert over the step (past it,
// rounded alike on every rank), so every rank and every layout moves the bias alike; the bias is a parameter, so checkpoints and exports carry it.
//
// The auxiliary loss is transformers' load_balancing_loss_func: over all layers' router rows R
// together, aux = E sum_e f_e P_e with f_e = (top-k choices of e) / R and P_e = (probabilities of e
// summed) / R; uniform routing gives exactly k. The objective is cross-entropy + aux_coef x aux.
// The statistics are summed over the data-parallel (and context-parallel) ranks before the product,
// so the loss is the global batch's and every layout trains the same model.
#pragma once
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "src/model/aux.hpp"
#include "src/model/unit.hpp"

namespace shardlab {

// One micro-step's balancing statistics over every MoE layer of the model, the model's auxiliary
// channel (src/model/aux.hpp; UnitContext::aux): the layers add during forward, the runner sums
// them over the data-parallel group and calls finish() before any backward.
struct MoeBalance final : AuxChannel {
  explicit MoeBalance(const ModelSpec& spec);
  std::vector<double> counts;     // per expert: top-k choices before any capacity drop
  std::vector<double> prob_sums;  // per expert: router probabilities summed over rows
  double rows = 0;                // router rows (tokens x MoE layers)
  double dropped = 0;             // slots dropped past an expert's capacity
  // A sigmoid router's: the top-k choices per (MoE layer, expert), the layers numbered from the
  // first sparse one; else empty.
  std::vector<double> layer_counts;
  double aux = 0;                 // finish(): E sum_e counts_e prob_sums_e / rows^2
  float prob_grad = 0;            // finish(): d(objective) / d(prob[r, e]) = prob_grad x counts_e

  int64_t packed_size() const override {
    return 2 * static_cast<int64_t>(counts.size()) + 2 + static_cast<int64_t>(layer_counts.size());
  }
  std::vector<float> pack() const override;
  void unpack(std::span<const float> packed) override;
  // This micro-step's share of the objective is its tokens (every rank's: rows / layers) over the
  // batch's positions.
  void finish(float dlogit_scale) override;
  double loss() const override { return aux; }
  // [dropped, counts per expert, layer_counts]: MoeRouting reads them.
  int64_t stats_size() const override {
    return 1 + static_cast<int64_t>(counts.size() + layer_counts.size());
  }
  void add_stats(std::vector<double>& totals) const override;

 private:
  double aux_coef_ = 0, layers_ = 1;
};

// The sigmoid router's correction bias among a layer's tensors (HF's name ends so:
// "model.layers.L.mlp.gate.e_score_correction_bias"), and the layer L of such a tensor.
inline constexpr std::string_view kCorrectionBias = "mlp.gate.e_score_correction_bias";
int64_t correction_bias_layer(const TensorDecl& t);

// A step's routing as the channel's statistics (AuxChannel::add_stats, summed) say it.
struct MoeRouting {
  double dropped = 0;           // slots dropped past capacity, every layer, micro-step and rank
  std::vector<double> counts;   // top-k choices per expert, the same
  std::vector<double> layer_counts;  // per (MoE layer, expert) for a sigmoid router, else empty
  MoeRouting(std::span<const double> stats, int64_t experts);
  std::optional<double> imbalance() const;  // max / mean choices per expert (none when no choice was made)
  // A sigmoid router's: the largest max / mean load of any MoE layer (none otherwise).
  std::optional<double> worst_layer_imbalance() const;
  // γ sign(mean load - load) per (MoE layer, expert), as f32 (what each bias element adds); zeros
  // for a layer that routed nothing.
  std::vector<float> bias_steps(double rate) const;
};

namespace blocks {

// Each expert's MLP width on this rank: the whole width, or under tensor parallelism (--tp) the
// rank's slice of it (gate and up split by rows, down by columns, as the dense MLP).
inline int64_t moe_local_width(const UnitContext& c) { return c.spec.moe.ffn_dim / c.tp.config.degree; }

// Rows [r0, r0 + n) of a (rows, cols) tensor: one expert's run of the buffers sorted by expert.
inline Tensor row_range(Tensor t, int64_t r0, int64_t n) {
  const int64_t cols = t.dim(1), shape[] = {n, cols};
  return t.slice(r0 * cols, n * cols).reshape(shape);
}

// f(i, r0, n) for each expert i (of `experts`) with n = count(i) > 0 rows, r0 its first row in the
// buffers sorted by expert (one GEMM per expert over them).
template <class Count, class F>
void for_each_expert(int64_t experts, Count count, F f) {
  for (int64_t i = 0, r0 = 0; i < experts; r0 += count(i), ++i)
    if (const int64_t n = count(i); n > 0) f(i, r0, n);
}

// ceil(factor x tokens x k / experts): the slots an expert takes under --moe-capacity-factor.
int64_t moe_capacity(double factor, int64_t tokens, int64_t k, int64_t experts);

// The layer's parameters (or gradients): the router (E, C) and, per expert, the stacked (gate; up)
// (2F, C) and down (C, F), as ParamSet::gemm hands them for parameters.
// Under expert parallelism the experts are this rank's block (EpConfig).
struct MoeWeights {
  Tensor router;
  std::vector<Tensor> gate_up, down;
  Tensor bias;  // the sigmoid router's correction bias (E): it moves the choice, not the weights; else empty
  int64_t sparse_layer = -1;  // with a bias: the layer's place among the MoE layers (its loads' row)
};

// out (N, C) = the MoE MLP of x (N, C); what backward needs saved in s (prefix-free names "moe_*").
// Under tensor parallelism every rank routes the same N rows (the router is whole on each) and its
// experts' slices give a partial sum of out, which the caller reduces over the group as the dense
// MLP's.
void moe_forward(UnitContext& c, Saved& s, Tensor x, Tensor out, const MoeWeights& w);
// dx (N, C) = d(out)/d(x) dout (overwritten), the router's and experts' gradients accumulated into g,
// the auxiliary loss's gradient included (c.moe's prob_grad). Under tensor parallelism dx is this
// rank's partial sum, the router's part on the group's rank 0 only (every rank computes it whole
// and its weight's gradient), so the group's reduction counts it once.
void moe_backward(UnitContext& c, Saved& s, Tensor dx, Tensor dout, Tensor x, const MoeWeights& w,
                  const MoeWeights& g);

}  // namespace blocks
}  // namespace shardlab
