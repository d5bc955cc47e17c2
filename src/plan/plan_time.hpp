// plan_time.hpp — the time model of `plan` at scale (issue 26): one training step of a TP x PP x DP
// layout on a GPU cluster, predicted from the model's shape and the device's rates. It is a model,
// checked against published runs by `shardlab bench-plan-validation` (docs/planning.md).
//
// Notation: b micro-batch, s sequence, h hidden, a heads (g of K/V), d = h/a, f MLP width, V vocab,
// L layers; t tp, p pp, v virtual stages, dp replicas, M = B / (b dp) micro-batches; n = b s tokens.
// Every size below is one tensor-parallel rank's share, for one micro-batch.
//
// GEMM time, each product (m x k) . (k x n), `count` of them (attention: b a / t per micro-batch):
//   t = count x max(2 m n k / (peak x eff), bytes / (hbm x memory)),  bytes = act (m k + k n + m n)
//   eff = gemm x sat(m) sat(n) sat(k),  sat(x) = x / (x + knee)       (Achievable: gemm, knee)
// Products of a layer (forward; backward is each one's two products, the input's gradient
// (m, k, n) and the weight's (k, n, m), the same FLOPs):
//   QKV (n, h, (a + 2g) d / t)   scores b a/t x (s, s, d)   context b a/t x (s, d, s)
//   out (n, h / t, h)            up (n, h, f / t; x2 for a gated MLP)     down (n, f / t, h)
//   flash attention instead: scores and context at GEMM efficiency with no s x s traffic;
//   backward 2.5x forward (it recomputes the scores).
// Element-wise work at memory bandwidth (hbm x memory), act bytes per element access, forward; the
// counts are the family's LayerCosts (src/model/family.hpp; gpt2 / llama):
//   per token and hidden element (n / t of them under sequence parallelism, else n): 11 / 10
//     (layer norms and bias-dropout-residuals / RMS norms and residual adds)
//   per token and MLP element (f / t): 2 (GeLU) / 3 (SwiGLU); RoPE 0 / 2 per q/k element
//   per attention score (b a / t x s x s, not under flash): 4.5 / 2 (softmax, dropout);
//   backward 5.5 / 3
//   backward of the rest: 2x forward. Head: (n, h, V / t), cross-entropy 20 bytes per logit.
// Recomputation: blocks (full) runs each layer's forward again (its TP collectives too);
//   attention (selective) the scores, softmax, dropout and context only.
// TP: per layer 2 all-reduces forward, 2 backward, 2 more under full recomputation, each of
//   n h act bytes (sequence parallelism: a reduce-scatter and an all-gather instead: the same bus
//   bytes); bus bytes 2 (t - 1) / t of it over the intra-node link (tp <= a node) x intra
//   fraction; not overlapped. Vocab-parallel embedding: one more all-reduce forward on stage 0.
// Stage time per micro-batch T_stage: the slowest stage's layers (ceil(L / (p v)) per chunk, v
//   chunks) forward + recompute + backward + TP, the head on the last stage.
// Pipeline: compute etc. = M x the stage's parts; bubble = the schedule's bubble_stages x T_stage
//   ((p - 1) / v for the 1F1B family: (p - 1)(t_f + t_b) over v chunks); p2p = M x v x 2 messages (activation forward,
//   gradient backward) of b s h act bytes (/ t with sequence parallelism or Megatron's
//   scatter-gather) over the inter-node link (intra when the whole layout is one node).
// DP over the inter-node link unless tp x dp ranks fit a node (intra): the largest stage's
//   parameters per rank, gradients in grad bytes:
//   ddp    all-reduce 2 (dp - 1) / dp x grads, overlappable with the last micro-batch's backward
//   zero1/2 reduce-scatter (dp - 1) / dp x grads (overlappable, the same window) and the parameters'
//          all-gather after the optimizer (exposed)
//   zero3  per micro-batch an all-gather forward, backward (and recompute) and a reduce-scatter,
//          overlappable with the whole step's compute
//   hidden = min(dp_overlap x overlappable, window); the rest is exposed (the last bucket's tail
//   is why dp_overlap < 1). The bytes are shard/strategy_formulas.hpp's step_traffic (the same
//   table compare's theory uses): hybrid sharding (dp_shard S < dp) reduces within groups of S
//   (NVLink when S x tp ranks fit a node) and all-reduces a 1/S shard across the dp / S groups.
//   zero2 and zero3 repeat theirs every micro-batch without a pipeline, once per step with one
//   (the pipelined strategies keep the gradients, and zero3 the gathered parameters, until the
//   flush).
// Offload: step_traffic's host-link bytes (gradient shards down, parameter shards up, and with
//   params each gather's upload) at the host link, exposed; the optimizer then runs on the host.
// Optimizer: the rank's parameters (/ S under ZeRO) at the device's AdamW rate (presets: hbm x
//   memory / optimizer_bytes per parameter: AdamW with fp32 master, m, v, the gradient's fp32 copy
//   and the bf16 copy out, 36), or the host's under offload.
// Calibrated rates (`plan --calibrate`, Achievable::whole_step): the FLOP rate is a whole measured
//   step's, so every GEMM runs at it (no shape efficiency, no memory term) and element-wise work
//   costs nothing apart (it is inside that rate).
// Context parallelism (cp C, between dp and tp in rank order): every size above with n = b s / C
//   tokens per rank and the attention core's products on s / C query rows (causal work balanced
//   head-tail); per layer G = b s 2 (g / t) d act bytes of K/V (cp::micro_step_bus_bytes) over the
//   intra-node link when C x t ranks fit a node: allgather exposes its all-gathers ((C - 1) / C G,
//   forward and backward) and the reduce-scatter (the same); ring hides its C - 1 K/V hops of G / C
//   behind the attention core (forward and backward) and exposes the C hops of dK/dV. Gradients
//   reduce over dp x C ranks, ZeRO shards over S x C; pipeline messages carry b s h / C.
// Expert parallelism (ep E, part of dp, between dp_shard and cp in rank order; a mixture of experts):
//   each rank holds X / E of the X experts, each over E x (its share of the n k slots) rows (balanced
//   routing); per layer and micro-batch four all-to-alls of (E - 1) / E x n k h act bytes (dispatch
//   and combine, forward and backward; two more under full recomputation), exposed, over the
//   intra-node link when E x cp x t ranks fit a node. The strategy reduces over dp / E x cp ranks and
//   ZeRO shards over S x cp (S the shard group without ep); the dense gradients are all-reduced over
//   the ep group once per step (2 (E - 1) / E of the rank's dense share), exposed.
// total = compute + recompute + exposed tp + cp + ep + bubble + pp_p2p + exposed dp + offload +
//   optimizer (TimeSplit keys the exposed parts by axis).
//
// FLOPs as Megatron counts them (Narayanan et al. 2021, eq. 3, GPT): every GEMM's 2 m n k, the
// attention's full s x s, the layers 4 passes under full recomputation (forward, recompute,
// backward = 2) and the head 3:  F = 96 B s L h^2 (1 + s / (6 h) + V / (16 L h)). Table 1's
// TFLOP/s are F / (N x step): `hardware_tflops_per_device`. Model FLOPs (no recomputation, 3
// passes) are 72 B s L h^2 (1 + s / (6 h) + V / (12 L h)): `model_tflops_per_device` and MFU
// against the dense peak. Llama counts its own GEMMs the same way.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "shard/strategy.hpp"
#include "src/comm/axes.hpp"
#include "src/core/device_peaks.hpp"
#include "src/model/parallel/cp.hpp"
#include "src/model/spec.hpp"
#include "src/model/unit.hpp"
#include "shard/pipeline/schedule.hpp"

namespace shardlab {

// A rate and where it came from ("a100-80gb: NVIDIA A100 datasheet ..." or "given").
struct Rate {
  double value = 0;
  std::string from;
};

// The device's peak rates (datasheet figures; the achievable fractions below apply to them).
struct DeviceRates {
  Rate flops;  // dense bf16 FLOP/s per GPU
  Rate hbm;    // HBM bytes/s
  Rate intra;  // NVLink bytes/s per GPU and direction
  Rate inter;  // InfiniBand bytes/s per GPU (its NIC share)
  Rate host;   // device <-> host bytes/s (PCIe, achieved): --offload's copies
  Rate adamw;       // device AdamW elements/s; 0 = hbm x memory / optimizer_bytes
  Rate host_adamw;  // host AdamW elements/s (--offload)
  // Calibrated whole-step rates by micro-batch (ascending; empty: `flops` at every micro-batch). A
  // layout takes the rate of the largest measured micro-batch not above its own (the smallest
  // measured one below them all): a CPU's kernels run slower on smaller products.
  std::vector<std::pair<int64_t, double>> flops_by_micro_batch;
  double flops_at(int64_t micro_batch) const;
  // Seconds a rank loses at each data-parallel collective it waits for inside the backward or
  // forward (zero2's reduce-scatters, zero3's gathers and reduce-scatters, one per unit): the
  // ranks arrive apart, the earlier waits. 0 unless calibrated (GPUs' streams absorb it).
  Rate sync;
  int ranks_per_node = 8;
  std::string describe() const;  // one line per rate with its source
  std::string by_micro_batch_line() const;
};
DeviceRates device_rates(const DevicePeaks& d);

// The model's constants: what share of a peak real kernels and collectives reach. Calibrated once
// against Narayanan et al. 2021's Table 1 on A100 (docs/planning.md), never per run.
struct Achievable {
  double gemm = 0.70;   // of the dense peak, by a large GEMM
  double knee = 48;     // sat(x) = x / (x + knee): a GEMM dimension of 48 halves it
  double memory = 0.80; // of HBM bandwidth, by element-wise kernels and memory-bound GEMMs
  double intra = 0.80;  // of NVLink per direction, as NCCL bus bandwidth
  double inter = 0.90;  // of the NIC, as NCCL bus bandwidth
  // Calibrated on this machine: `flops` is a whole step's measured rate (plan_time.hpp's top).
  bool whole_step = false;
  std::string describe() const;
};

struct TimeLayout {
  int tp = 1, pp = 1, virtual_stages = 1, dp = 1;
  int cp = 1;  // context-parallel ranks (each sequence split over them); dp counts sequences' ranks only
  int ep = 1;  // expert-parallel ranks, part of dp (a mixture of experts' experts split over them)
  CpMethod cp_method = CpMethod::allgather;
  PpSchedule schedule;  // the default unless given
  int64_t micro_batch = 1;   // b
  int64_t global_batch = 1;  // B sequences per step: M = B / (b dp)
  Checkpointing recompute = Checkpointing::none;
  bool sequence_parallel = false;
  bool pp_scatter_gather = false;  // Megatron 2021: each TP rank sends 1/t of a boundary
  bool flash_attention = true;
  StrategyKind dp_strategy = StrategyKind::ddp;  // dp (plain) is ddp's traffic without buckets
  int dp_shard = 0;               // ZeRO's shard group S (0 = dp); replicas dp / S
  Offload offload = Offload::none;
  // zero3's ZeRO++ levers (shard/zeropp.hpp): the forward gather in int8 records (qwZ), the
  // backward gather inside the node (hpZ), the gradients as quantized all-to-alls in and across
  // nodes (qgZ), the node being the device's ranks_per_node.
  ZeroPP zeropp;
  double dp_overlap = 0.9;        // share of overlappable DP traffic hidden (0: after the flush)
  int act_bytes = 2, grad_bytes = 2, param_bytes = 2;  // bf16 activations, gradients, parameters
  double optimizer_bytes = 36;    // per parameter the optimizer step touches
  int64_t micro_batches() const;  // M
  void validate(const ModelSpec& m) const;  // InputError naming the values
};

// Seconds per step on the critical path. Each parallel group's exposed communication is keyed by
// its axis (src/comm/axes.hpp): tp, cp, dp always, ep under --ep (its all-to-alls and its
// all-reduce of the dense gradients); a new axis adds an entry, not a field.
struct TimeSplit {
  double compute = 0, recompute = 0, bubble = 0, pp_p2p = 0, offload = 0, optimizer = 0, total = 0;
  std::map<CommAxis, double> exposed;
  double exposed_on(CommAxis a) const;  // 0 when the axis has no entry
};

struct TimePrediction {
  TimeSplit split;
  double stage_s = 0;          // T_stage: the slowest stage, one micro-batch (all parts)
  double tokens_per_s = 0;
  double hardware_flops = 0;   // F per step, Megatron's count with recomputation (eq. 3 under full)
  double model_flops = 0;      // per step without recomputation
  double hardware_tflops_per_device = 0, model_tflops_per_device = 0, mfu = 0;
};

// GEMM FLOPs of one step as Megatron counts them: forward, backward (2x), and the layers'
// forward once more when `recompute` is blocks (selective: the attention's score products).
double megatron_flops(const ModelSpec& m, int64_t global_batch, Checkpointing recompute);

// One GEMM's seconds under the roofline above (`count` independent products of m x n x k).
double gemm_seconds(double m, double n, double k, double count, int act_bytes, const DeviceRates& r,
                    const Achievable& a);

TimePrediction predict_step_time(const ModelSpec& m, const TimeLayout& l, const DeviceRates& r,
                                 const Achievable& a = {});

}  // namespace shardlab
