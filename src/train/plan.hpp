// plan.hpp — `shardlab plan`: every configuration of strategy, shard group, activation
// checkpointing, offload and micro-batch for a model on N ranks, each with its predicted peak per
// memory tier (the estimator: the real step on the meta backend, exact to the byte) and its
// predicted step time (a model of compute, communication, host copies and the optimizer over
// stated rates), ranked fastest first; optionally the top K measured.
//
// The time model, per rank and step (tokens = micro-batch x accum x T):
//   compute   tokens x (6 Psi + 6 L C T + recomputation) / rates.flops
//             recomputation: blocks one more forward (2 Psi + 2 L C T), attention Q K^T again (L C T)
//   comm      the bus bytes of each collective (the strategy's pattern, accumulation included)
//             over the link it crosses: within a node (intra) when its ranks share one, else inter;
//             rates.overlap of it hides behind compute (NCCL on a comm stream), the rest adds
//   offload   gradient shards down and parameters up over rates.host_link (params: each gather's
//             upload too), and AdamW at rates.host_adamw elements/s; without offload AdamW runs at
//             rates.device_adamw
// It is a model: its error is measured by --measure-top (README: "Planning").
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "src/core/device_peaks.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {

// Share of the device's dense peak that a whole training step achieves (the default rates, and
// --device-tflops): kernels outside GEMMs, launch gaps, imperfect tiles.
inline constexpr double kStepPeakShare = 0.45;
std::string default_rates_source();  // "defaults: one H100 per rank, ..." (device_peaks.hpp)

struct PlanRates {
  double flops = kH100.dense_bf16_tflops * 1e12 * kStepPeakShare;  // model FLOP/s a whole step achieves per rank
  double link_intra = kH100.intra_node_gbs * 1e9;   // bus bytes/s between ranks of one node (NVLink)
  double link_inter = kH100.inter_node_gbs * 1e9;   // bus bytes/s between nodes (InfiniBand)
  double host_link = kH100.host_link_gbs * 1e9;     // bytes/s device <-> host (PCIe, achieved)
  double host_adamw = 1.5e9;       // elements/s of the host optimizer (per rank)
  double device_adamw = 1e11;      // elements/s of the device optimizer (HBM3: 28 bytes each)
  double overlap = 0.9;            // share of overlappable communication hidden behind compute
  std::string source = default_rates_source();
};

struct PlanConfig {
  TrainConfig train;        // model, dtypes, optimizer (strategy, levers and batch are enumerated)
  int world = 8;
  int ranks_per_node = 8;
  uint64_t device_memory = 0;  // per rank; required
  uint64_t host_memory = 0;    // per rank; 0 = unlimited
  int64_t global_batch = 0;    // sequences per step; 0 = 8 per rank
  int dp_shard = -1;           // the shard groups tried: -1 = the world and a node; 0 = the world; S = S
  PlanRates rates;
  void validate() const;
};

struct PlanEntry {
  StrategyConfig strategy;   // kind, dims (dp_shard 0 = the world), offload
  Checkpointing checkpointing = Checkpointing::none;
  int64_t micro_batch = 0, accum = 0;
  bool fits = false;
  std::string why;           // when it does not fit: which tier, by how much
  uint64_t peak = 0, host_peak = 0;
  double step_ms = 0, tokens_per_s = 0;
  double compute_ms = 0, comm_ms = 0, exposed_comm_ms = 0, offload_ms = 0, optimizer_ms = 0;
  std::optional<double> measured_step_ms;
  std::optional<uint64_t> measured_peak;
  TrainConfig config(const PlanConfig& p) const;  // the run this entry describes
};

// Every configuration, fitting ones first (fastest first), then the rest (fastest first).
std::vector<PlanEntry> make_plan(const PlanConfig& cfg);
void print_plan(const PlanConfig& cfg, const std::vector<PlanEntry>& plan, size_t show, std::FILE* out);
std::string plan_json(const PlanConfig& cfg, const std::vector<PlanEntry>& plan);  // schema shardlab.plan/1
// One self-contained page (no scripts, no network): the rates and the ranked table with each
// configuration's time split (compute, exposed communication, offload, optimizer).
std::string plan_html(const PlanConfig& cfg, const std::vector<PlanEntry>& plan);

}  // namespace shardlab
