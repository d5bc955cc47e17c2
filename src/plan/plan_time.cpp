// plan_time.cpp — the time model stated in plan_time.hpp.
#include "src/plan/plan_time.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "shard/strategy_formulas.hpp"
#include "shard/zeropp.hpp"
#include "src/core/check.hpp"
#include "src/model/family.hpp"

namespace shardlab {

std::string DeviceRates::describe() const {
  const std::string peak = flops.value >= 1e12 ? fmt::format("{:8.1f} TFLOP/s", flops.value / 1e12)
                                               : fmt::format("{:8.2f} GFLOP/s", flops.value / 1e9);
  return fmt::format("  peak     {} dense    ({})\n"
                     "  HBM      {:8.0f} GB/s          ({})\n"
                     "  NVLink   {:8.1f} GB/s          ({}; per direction)\n"
                     "  network  {:8.1f} GB/s          ({}; per device)\n"
                     "  host     {:8.1f} GB/s          ({})\n"
                     "  AdamW    {:>8} elements/s on the device ({}), {:.3g} on the host ({})\n"
                     "  {} ranks per node\n",
                     peak, flops.from, hbm.value / 1e9, hbm.from, intra.value / 1e9, intra.from,
                     inter.value / 1e9, inter.from, host.value / 1e9, host.from,
                     adamw.value > 0 ? fmt::format("{:.3g}", adamw.value) : std::string("HBM"), adamw.from,
                     host_adamw.value, host_adamw.from, ranks_per_node) +
         (flops_by_micro_batch.size() > 1 ? by_micro_batch_line() : std::string()) +
         (sync.value > 0 ? fmt::format("  sync     {:8.2f} ms per data-parallel wait inside a pass ({})\n",
                                       sync.value * 1e3, sync.from)
                         : std::string());
}

std::string DeviceRates::by_micro_batch_line() const {
  std::string s = "  whole steps by micro-batch:";
  for (auto [b, f] : flops_by_micro_batch) s += fmt::format(" {} at {:.2f} GFLOP/s;", b, f / 1e9);
  s.back() = '\n';
  return s;
}

DeviceRates device_rates(const DevicePeaks& d) {
  const std::string src = fmt::format("{}: {}", d.name, d.source);
  DeviceRates r;
  r.flops = {d.dense_bf16_tflops * 1e12, src};
  r.hbm = {d.hbm_gbs * 1e9, src};
  r.intra = {d.nvlink_gbs * 1e9, src};
  // The node's NICs shared by its GPUs (one each on DGX/HGX).
  const double per_gpu = d.nic_gbits / 8 * 1e9 * d.nics_per_node / d.gpus_per_node;
  r.inter = {per_gpu, fmt::format("{}: {} x {:g} Gb/s per node", d.name, d.nics_per_node, d.nic_gbits)};
  r.host = {d.host_link_gbs * 1e9, fmt::format("{}: PCIe achieved", d.name)};
  r.adamw = {0, "36 bytes per parameter at the HBM share"};
  r.host_adamw = {1.5e9, "assumed: a host AdamW over one socket's share"};
  r.sync = {0, "not modelled for a preset (only --calibrate measures it)"};
  r.ranks_per_node = d.gpus_per_node;
  return r;
}

std::string Achievable::describe() const {
  if (whole_step)
    return fmt::format("  achievable: every GEMM at the calibrated whole-step rate (element-wise work inside it); "
                       "NCCL bus {:.0f}% of the intra link, {:.0f}% of the network\n", 100 * intra, 100 * inter);
  return fmt::format("  achievable: GEMM {:.0f}% of peak x sat(m) sat(n) sat(k), sat(x) = x / (x + {:g}); "
                     "memory {:.0f}% of HBM; NCCL bus {:.0f}% of NVLink, {:.0f}% of the network\n",
                     100 * gemm, knee, 100 * memory, 100 * intra, 100 * inter);
}

int64_t TimeLayout::micro_batches() const { return global_batch / (micro_batch * dp); }

void TimeLayout::validate(const ModelSpec& m) const {
  SHARD_REQUIRE(tp >= 1 && pp >= 1 && dp >= 1 && virtual_stages >= 1,
                "tp {} pp {} dp {} virtual stages {}: expected at least 1 each", tp, pp, dp, virtual_stages);
  SHARD_REQUIRE(m.layers >= 1 && m.dim >= 1 && m.heads >= 1 && m.seq >= 1 && m.vocab >= 1,
                "model L={} h={} heads={} s={} V={}: expected positive sizes", m.layers, m.dim, m.heads, m.seq,
                m.vocab);
  SHARD_REQUIRE(m.head_dim > 0 || m.dim % m.heads == 0, "hidden {} is not divisible by heads {}", m.dim, m.heads);
  if (auto why = tp_split_problem(m, tp)) throw InputError(*why);  // the trainer's rule
  SHARD_REQUIRE(m.layers >= int64_t{pp} * virtual_stages, "{} layers cannot fill pp {} x {} virtual stages",
                m.layers, pp, virtual_stages);
  SHARD_REQUIRE(cp >= 1 && (cp == 1 || flash_attention), "cp {} needs the fused attention (--attention flash)", cp);
  if (cp > 1) check_cp_seq(m.seq, cp, CpBalance::head_tail);
  SHARD_REQUIRE(micro_batch >= 1 && global_batch % (micro_batch * dp) == 0,
                "global batch {} is not a multiple of micro-batch {} x dp {}", global_batch, micro_batch, dp);
  require_pp_schedule(schedule, pp, virtual_stages, micro_batches());
  SHARD_REQUIRE(dp_strategy != StrategyKind::dp, "the time model covers ddp and zero1-3, not dp (rank 0's copy)");
  SHARD_REQUIRE(dp_shard >= 0 && (dp_shard == 0 || dp % dp_shard == 0), "dp shard group {} does not divide dp {}",
                dp_shard, dp);
  SHARD_REQUIRE(ep >= 1 && dp % ep == 0 && (dp_shard == 0 || (dp / ep) % dp_shard == 0),
                "ep {} with dp {} and shard group {}: ep must divide dp, and the shard group dp / ep", ep, dp, dp_shard);
  SHARD_REQUIRE(ep == 1 || (m.moe.enabled() && m.moe.experts % ep == 0), "ep {} must divide the experts ({}) of {}",
                ep, m.moe.experts, m.name);
  SHARD_REQUIRE(offload == Offload::none || zero_stage(dp_strategy) > 0, "offload {} needs a ZeRO strategy, not {}",
                offload_name(offload), strategy_name(dp_strategy));
  SHARD_REQUIRE(dp_overlap >= 0 && dp_overlap <= 1, "dp overlap {}: expected 0 to 1", dp_overlap);
  SHARD_REQUIRE(act_bytes > 0 && grad_bytes > 0 && param_bytes > 0 && optimizer_bytes >= 0,
                "element sizes act {} grad {} param {} optimizer {}: expected positive", act_bytes, grad_bytes,
                param_bytes, optimizer_bytes);
}

double gemm_seconds(double m, double n, double k, double count, int act_bytes, const DeviceRates& r,
                    const Achievable& a) {
  if (a.whole_step) return count * 2 * m * n * k / r.flops.value;
  auto sat = [&](double x) { return x / (x + a.knee); };
  const double eff = a.gemm * sat(m) * sat(n) * sat(k);
  const double compute = 2 * m * n * k / (r.flops.value * eff);
  const double memory = act_bytes * (m * k + k * n + m * n) / (r.hbm.value * a.memory);
  return count * std::max(compute, memory);
}

namespace {

struct Gemm {
  double m, n, k, count = 1;
  double flops() const { return 2 * m * n * k * count; }
};

// One layer's forward products on one TP rank for one micro-batch: the dense ones (projections
// and MLP) and the attention core (scores and context), apart because recomputation and flash
// attention treat them differently.
struct LayerGemms {
  std::vector<Gemm> dense, core;
};

LayerGemms layer_gemms(const ModelSpec& m, double b, double t, double cp = 1, double ep = 1) {
  const double s = double(m.seq), h = double(m.dim), a = double(m.heads), g = double(m.num_kv_heads());
  const double d = double(m.head_size()), f = double(m.ffn_hidden());
  const double n = b * s / cp, q = s / cp;  // cp: the rank's rows
  const double up = family_of(m).layer_costs().mlp_in_products;  // SwiGLU's gate and up in one product
  LayerGemms l;
  l.dense = {{n, (a + 2 * g) * d / t, h}, {n, h, a * d / t}};
  if (m.moe.enabled()) {  // the router, then each expert's pair over its share of the n k slots (balanced)
    // Under ep the rank's X / ep experts take every ep rank's share: ep times the rows each; under
    // tp each expert is split as the dense MLP.
    const double E = double(m.moe.experts), rows = n * double(m.moe.top_k) / E * ep, fe = double(m.moe.ffn_dim) / t;
    l.dense.insert(l.dense.end(), {{n, E, h}, {rows, up * fe, h, E / ep}, {rows, h, fe, E / ep}});
  } else {
    l.dense.insert(l.dense.end(), {{n, up * f / t, h}, {n, h, f / t}});
  }
  l.core = {{q, s, d, b * a / t}, {q, d, s, b * a / t}};
  return l;
}

double forward_seconds(const std::vector<Gemm>& gs, int act, const DeviceRates& r, const Achievable& a) {
  double sec = 0;
  for (const Gemm& g : gs) sec += gemm_seconds(g.m, g.n, g.k, g.count, act, r, a);
  return sec;
}

// The input's gradient (m x n) . (n x k) and the weight's (k x m) . (m x n) of each product.
double backward_seconds(const std::vector<Gemm>& gs, int act, const DeviceRates& r, const Achievable& a) {
  double sec = 0;
  for (const Gemm& g : gs)
    sec += gemm_seconds(g.m, g.k, g.n, g.count, act, r, a) + gemm_seconds(g.k, g.n, g.m, g.count, act, r, a);
  return sec;
}

// Bytes per second of element-wise work: none apart under a calibrated whole-step rate.
double memory_rate(const DeviceRates& r, const Achievable& a) {
  return a.whole_step ? std::numeric_limits<double>::infinity() : r.hbm.value * a.memory;
}

// Bytes per second of a group whose members lie within `span` consecutive ranks: the intra-node
// link when those fit a node, else the network.
double link_rate(int64_t span, const DeviceRates& r, const Achievable& a) {
  return span <= r.ranks_per_node ? r.intra.value * a.intra : r.inter.value * a.inter;
}

// The ep group's: its ranks are cp x tp apart (ep x cp x tp consecutive ranks).
double ep_link(const TimeLayout& l, const DeviceRates& r, const Achievable& a) {
  return link_rate(int64_t{l.ep} * l.cp * l.tp, r, a);
}

// One layer on one TP rank for one micro-batch, in seconds.
struct LayerTime {
  double fwd = 0, bwd = 0;     // everything but the attention core
  double core_fwd = 0, core_bwd = 0;
  double tp_collective = 0;    // one all-reduce (or reduce-scatter + all-gather) of n h
  double cp_fwd = 0, cp_bwd = 0;  // the cp group's exposed exchanges (plan_time.hpp)
  double ep_exchange = 0;         // one of the ep group's row all-to-alls (plan_time.hpp)
};

LayerTime layer_time(const ModelSpec& m, const TimeLayout& l, const DeviceRates& r, const Achievable& a) {
  const double b = double(l.micro_batch), t = double(l.tp), s = double(m.seq), h = double(m.dim), C = l.cp;
  const double heads = double(m.heads), g = double(m.num_kv_heads()), n = b * s / C;
  // MLP elements per token: k experts' under a mixture of experts
  const double f = m.moe.enabled() ? double(m.moe.top_k * m.moe.ffn_dim) : double(m.ffn_hidden());
  const double hd = double(m.head_size());
  const LayerCosts c = family_of(m).layer_costs();
  const double mem = memory_rate(r, a), act = l.act_bytes;
  const LayerGemms gs = layer_gemms(m, b, t, C, l.ep);
  LayerTime lt;
  // Element accesses (plan_time.hpp): per token x hidden, per token x MLP, RoPE, per score.
  const double rows = l.sequence_parallel ? n / t : n;
  double elem = rows * h * c.hidden_accesses + n * f / t * c.mlp_accesses;
  if (c.rope_accesses > 0) elem += c.rope_accesses * n * (heads + g) * hd / t;
  lt.fwd = forward_seconds(gs.dense, l.act_bytes, r, a) + elem * act / mem;
  lt.bwd = backward_seconds(gs.dense, l.act_bytes, r, a) + 2 * elem * act / mem;
  if (l.flash_attention) {
    double flops = 0, eff = 0;
    for (const Gemm& core : gs.core) flops += core.flops();
    const double q = s / C;  // query rows here
    eff = a.whole_step ? 1 : a.gemm * (q / (q + a.knee)) * (s / (s + a.knee)) * (hd / (hd + a.knee));
    lt.core_fwd = flops / (r.flops.value * eff);
    lt.core_bwd = 2.5 * lt.core_fwd;
  } else {
    const double scores = b * heads / t * s * s;
    lt.core_fwd = forward_seconds(gs.core, l.act_bytes, r, a) + scores * c.score_accesses * act / mem;
    lt.core_bwd = backward_seconds(gs.core, l.act_bytes, r, a) + scores * c.score_accesses_bwd * act / mem;
  }
  if (l.tp > 1) {
    const double link = link_rate(l.tp, r, a);
    lt.tp_collective = 2 * (t - 1) / t * n * h * act / link;
  }
  if (l.ep > 1) {
    const double link = ep_link(l, r, a), E = l.ep;
    lt.ep_exchange = (E - 1) / E * n * double(m.moe.top_k) * h * act / link;
  }
  if (l.cp > 1) {
    const double link = link_rate(int64_t{l.cp} * l.tp, r, a);
    const double G = b * s * 2 * (g / t) * hd * act;  // the group's K/V rows
    if (l.cp_method == CpMethod::ring) {
      const double hop = G / C / link;
      lt.cp_fwd = std::max(0.0, (C - 1) * hop - lt.core_fwd);
      lt.cp_bwd = std::max(0.0, (C - 1) * hop - lt.core_bwd) + C * hop;
    } else {
      lt.cp_fwd = (C - 1) / C * G / link;
      lt.cp_bwd = 2 * lt.cp_fwd;
    }
  }
  return lt;
}

// One stage's parts for one micro-batch.
struct StageTime {
  double compute = 0, recompute = 0, tp = 0, cp = 0, ep = 0;
  double backward = 0;  // its backward (and recomputation): the window DP reductions hide in
  double params = 0;    // parameters on one rank of the stage
  double expert_params = 0;  // of them, its experts'
  double total() const { return compute + recompute + tp + cp + ep; }
};

StageTime stage_time(const ModelSpec& m, const TimeLayout& l, const DeviceRates& r, const Achievable& a,
                     bool first, bool last) {
  const LayerTime lt = layer_time(m, l, r, a);
  const double per_chunk = std::ceil(double(m.layers) / (l.pp * l.virtual_stages));
  const double layers = per_chunk * l.virtual_stages, t = double(l.tp);
  const double n = double(l.micro_batch * m.seq) / l.cp, h = double(m.dim), V = double(m.vocab);
  const double heads = double(m.heads), d = double(m.head_size()), g = double(m.num_kv_heads());
  const double f = double(m.ffn_hidden());
  const LayerCosts c = family_of(m).layer_costs();
  StageTime st;
  st.compute = layers * (lt.fwd + lt.bwd + lt.core_fwd + lt.core_bwd);
  if (l.recompute == Checkpointing::blocks) st.recompute = layers * (lt.fwd + lt.core_fwd);
  if (l.recompute == Checkpointing::attention) st.recompute = layers * lt.core_fwd;
  st.tp = layers * lt.tp_collective * (l.recompute == Checkpointing::blocks ? 6 : 4);
  st.cp = layers * (lt.cp_fwd * (l.recompute == Checkpointing::blocks ? 2 : 1) + lt.cp_bwd);
  st.ep = layers * lt.ep_exchange * (l.recompute == Checkpointing::blocks ? 6 : 4);
  st.backward = (lt.bwd + lt.core_bwd) * layers + st.recompute;
  // A mixture of experts: the router and the rank's experts (X / ep of them).
  const double expert = (c.mlp_in_products + 1) * h * double(m.moe.ffn_dim) * double(m.moe.experts) / l.ep;
  const double mlp_params = m.moe.enabled() ? double(m.moe.experts) * h + expert : (c.mlp_in_products + 1) * h * f;
  const double layer_params = h * (heads + 2 * g) * d + h * heads * d + mlp_params;
  st.params = layers * layer_params / t;
  st.expert_params = m.moe.enabled() ? layers * expert / t : 0;
  const double mem = memory_rate(r, a);
  if (first) {  // the embedding lookup (and a position table) and its vocab-parallel all-reduce
    st.compute += n * h * c.embed_accesses * l.act_bytes / mem;
    st.tp += lt.tp_collective;
    st.params += V * h / t + (c.learned_positions ? double(m.seq) * h : 0);
  }
  if (last) {  // the head and the cross-entropy (20 bytes per logit: fp32 softmax and its gradient)
    const double head_bwd = backward_seconds({{n, V / t, h}}, l.act_bytes, r, a) + n * V / t * 8 / mem;
    st.compute += forward_seconds({{n, V / t, h}}, l.act_bytes, r, a) + n * V / t * 12 / mem + head_bwd;
    st.backward += head_bwd;
    if (!first || !m.tied_head) st.params += V * h / t;
  }
  return st;
}

}  // namespace

double megatron_flops(const ModelSpec& m, int64_t global_batch, Checkpointing recompute) {
  const LayerGemms gs = layer_gemms(m, double(global_batch), 1);
  double dense = 0, core = 0;
  for (const Gemm& g : gs.dense) dense += g.flops();
  for (const Gemm& g : gs.core) core += g.flops();
  const double head = 2.0 * double(global_batch * m.seq) * double(m.dim) * double(m.vocab);
  const double passes = recompute == Checkpointing::blocks ? 4 : 3;
  const double core_passes = recompute == Checkpointing::none ? 3 : 4;
  return double(m.layers) * (passes * dense + core_passes * core) + 3 * head;
}

namespace {
// ZeRO++'s zero3 traffic of one micro-step (shard/zeropp.hpp), each collective on its link: the
// forward all-gather (int8 records under qwZ) on the shard group's, the backward one inside the
// node from the secondary shards (hpZ), the gradients as quantized all-to-alls inside the node and
// across the N nodes (qgZ). L: the shard group's ranks on a node (its ranks are tp apart).
double zeropp_seconds(const TimeLayout& l, double params, int S, const DeviceRates& r,
                      const Achievable& a, double bw_s) {
  const int L = static_cast<int>(std::clamp<int64_t>(r.ranks_per_node / l.tp, 1, S));
  const ZeroPPBytes b = zeropp_step_bytes(l.zeropp, params, S, L, l.param_bytes, l.grad_bytes);
  const double bw_node = r.intra.value * a.intra, bw_cross = r.inter.value * a.inter;
  const bool regather = l.pp == 1 && l.recompute == Checkpointing::blocks;  // the recomputed forward gathers again
  return ((regather ? 2 : 1) * b.gather + b.back_shard + b.grads_shard) / bw_s + (b.back_node + b.grads_node) / bw_node +
         b.grads_cross / bw_cross;
}

// The data-parallel collectives a rank of the slowest stage waits for inside one micro-step's
// passes, one per unit (its blocks, and the embedding and the head where it holds them): zero2's
// reduce-scatters in the backward; zero3's as well, and its gathers for the forward, the backward
// and a recomputed forward. ddp and zero1 wait once, after the backward.
double dp_waits(const ModelSpec& m, const TimeLayout& l) {
  const double units = std::ceil(double(m.layers) / (l.pp * l.virtual_stages)) * l.virtual_stages + (l.pp == 1 ? 2 : 1);
  if (l.dp_strategy == StrategyKind::zero2) return units;
  if (l.dp_strategy != StrategyKind::zero3) return 0;
  return units * (l.pp == 1 && l.recompute == Checkpointing::blocks ? 4 : 3);  // as zeropp_seconds' regather
}
}  // namespace

double TimeSplit::exposed_on(CommAxis a) const {
  auto it = exposed.find(a);
  return it == exposed.end() ? 0.0 : it->second;
}

double DeviceRates::flops_at(int64_t micro_batch) const {
  double rate = flops.value;
  for (size_t i = 0; i < flops_by_micro_batch.size(); ++i)
    if (i == 0 || flops_by_micro_batch[i].first <= micro_batch) rate = flops_by_micro_batch[i].second;
  return rate;
}

TimePrediction predict_step_time(const ModelSpec& m, const TimeLayout& l, const DeviceRates& rates, const Achievable& a) {
  l.validate(m);
  DeviceRates r = rates;
  r.flops.value = rates.flops_at(l.micro_batch);
  const double M = double(l.micro_batches()), p = l.pp, v = l.virtual_stages;
  // The slowest stage: with one stage it holds both ends; else the first or the last.
  StageTime st = stage_time(m, l, r, a, true, l.pp == 1);
  if (l.pp > 1) {
    StageTime last = stage_time(m, l, r, a, false, true);
    if (last.total() > st.total()) st = last;
  }
  TimePrediction out;
  TimeSplit& sp = out.split;
  sp.compute = M * st.compute;
  sp.recompute = M * st.recompute;
  sp.exposed[CommAxis::tp] = M * st.tp;
  sp.exposed[CommAxis::cp] = M * st.cp;
  sp.exposed[CommAxis::dp] = 0;
  if (l.ep > 1) sp.exposed[CommAxis::ep] = M * st.ep;
  out.stage_s = st.total();
  sp.bubble = l.schedule->bubble_stages(p, v, M) * out.stage_s;
  if (l.pp > 1) {
    const double link = link_rate(int64_t{l.tp} * l.cp * l.dp * l.pp, r, a);  // intra when the whole layout is one node
    const double bytes = double(l.micro_batch * m.seq * m.dim) * l.act_bytes /
                         (l.sequence_parallel || l.pp_scatter_gather ? l.tp : 1) / l.cp;
    sp.pp_p2p = M * v * 2 * bytes / link;
  }
  // Data parallelism: step_traffic's volumes of the largest stage's parameters on one rank.
  // Under cp the gradients reduce over dp x cp ranks and ZeRO shards over S x cp; under ep the
  // strategy's group leaves the ep ranks out.
  const int S = (l.dp_shard > 0 ? l.dp_shard : l.dp / l.ep) * l.cp, D = l.dp / l.ep * l.cp;
  if (l.ep > 1) {  // the dense gradients' all-reduce over the ep group, once per step
    const double dense = (st.params - st.expert_params) / (zero_stage(l.dp_strategy) > 0 ? S : 1);
    sp.exposed[CommAxis::ep] += 2.0 * (l.ep - 1) / l.ep * dense * l.grad_bytes / ep_link(l, r, a);
  }
  const StepTraffic tr = step_traffic(
      l.dp_strategy, TrafficInputs{st.params, D, S, l.param_bytes == 2 ? DType::bf16 : DType::f32,
                                   l.grad_bytes == 2 ? DType::bf16 : DType::f32});
  const double repeats = tr.per_micro && l.pp == 1 ? M : 1;
  if (D > 1) {
    // dp ranks are tp apart (tp innermost; cp x tp under cp): a group of S spans S x tp ranks, the whole D x tp.
    const double bw_s = link_rate(int64_t{S} * l.tp, r, a), bw_all = link_rate(int64_t{D} * l.tp, r, a);
    double group = tr.group_overlapped_bus();
    if (l.dp_strategy == StrategyKind::zero3 && l.pp == 1 && l.recompute == Checkpointing::blocks)
      group += tr.fs() * tr.p;  // the recomputed forward gathers again
    const double group_s = l.dp_strategy == StrategyKind::zero3 && l.zeropp.any()
                               ? zeropp_seconds(l, st.params, S, r, a, bw_s)
                               : group / bw_s;
    const double overlappable = repeats * (group_s + tr.across_bus() / bw_all) + tr.world_bus() / bw_all;
    const double exposed = tr.group_exposed_bus() / bw_s;
    const double window = l.dp_strategy == StrategyKind::zero3 ? M * st.compute : st.backward;
    double& dp = sp.exposed[CommAxis::dp];
    dp = overlappable - std::min(l.dp_overlap * overlappable, window) + exposed;
    dp += repeats * dp_waits(m, l) * r.sync.value;
  }
  const double updated = zero_stage(l.dp_strategy) > 0 ? st.params / S : st.params;
  if (l.offload != Offload::none) {
    sp.offload = tr.host_link(l.offload, repeats) / r.host.value;
    sp.optimizer = updated / r.host_adamw.value;
  } else {
    sp.optimizer = r.adamw.value > 0 ? updated / r.adamw.value
                                     : updated * l.optimizer_bytes / (r.hbm.value * a.memory);
  }
  sp.total = sp.compute + sp.recompute + sp.exposed_on(CommAxis::tp) + sp.exposed_on(CommAxis::cp) +
             sp.exposed_on(CommAxis::ep) + sp.bubble + sp.pp_p2p + sp.exposed_on(CommAxis::dp) + sp.offload +
             sp.optimizer;
  const double devices = double(l.tp) * l.pp * l.dp * l.cp;
  out.tokens_per_s = double(l.global_batch * m.seq) / sp.total;
  out.hardware_flops = megatron_flops(m, l.global_batch, l.recompute);
  out.model_flops = megatron_flops(m, l.global_batch, Checkpointing::none);
  out.hardware_tflops_per_device = out.hardware_flops / devices / sp.total / 1e12;
  out.model_tflops_per_device = out.model_flops / devices / sp.total / 1e12;
  out.mfu = out.model_tflops_per_device * 1e12 / r.flops.value;
  return out;
}

}  // namespace shardlab
