#include "src/compare/compare.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "src/compare/memory_row.hpp"
#include "src/core/stats.hpp"
#include "shard/strategy_formulas.hpp"
#include "shard/zeropp.hpp"
#include "src/core/units.hpp"
#include "src/model/family.hpp"
#include "src/model/parallel/cp_attention.hpp"
#include "src/model/tp.hpp"
#include "src/train/predict.hpp"

namespace shardlab {
namespace {

// The textbook traffic of the strategy's pattern (shard/strategy_formulas.hpp) for this run.
StepTraffic traffic(StrategyKind s, double params, int world, const TrainConfig& c) {
  const int shard = c.layout.dims.dp_shard * c.layout.dims.cp;  // the shard group: dp_shard x cp
  return step_traffic(s, TrafficInputs{params, world, c.layout.dims.hybrid() ? shard : 0, c.strategy.precision.param_dtype,
                                       c.strategy.precision.reduce_dtype, c.batch, c.spec.seq, c.spec.vocab});
}

// Rank 0's traffic on the pp axis in one step (it is the first stage: pipeline rank 0): its
// chunks send their activations (B x T x C elements of the activation dtype) forward and receive
// their gradients back, once
// per micro-batch at each chunk boundary they touch with another rank (both ends count a message:
// send and recv, S each); unless the head is on rank 0 too (a V), the tied token embedding's gradient
// (its vocabulary rows on this tensor-parallel rank)
// is all-reduced over the first and the last stage's ranks (2 x dp x cp of them); the loss and the
// norm's stage sums are one float all-reduced over the pipeline each.
double pp_theory(const TrainConfig& c, int dp, int tp, int cp) {
  const int P = c.layout.dims.pp, V = c.layout.pipeline.virtual_stages, chunks = P * V;
  const bool v = c.layout.pipeline.schedule->v_shape;  // a V's turn and its loss stay on one rank
  const double B = static_cast<double>(c.batch / dp / c.accum), T = static_cast<double>(c.spec.seq / cp);
  int boundaries = 0;
  const auto remote = [&](int chunk) { return chunk >= 0 && chunk < chunks && chunk_rank(chunk, P, v) != 0; };
  for (int chunk = 0; chunk < chunks; ++chunk)
    if (chunk_rank(chunk, P, v) == 0) boundaries += remote(chunk - 1) + remote(chunk + 1);
  double bytes = 2.0 * boundaries * static_cast<double>(c.accum) * B * T * static_cast<double>(c.spec.dim) *
                 static_cast<double>(dtype_size(c.spec.activation_dtype));
  if (c.spec.tied_head && chunk_rank(chunks - 1, P, v) != 0) {
    const double n = 2.0 * dp * cp;  // the tied group: the end stages' data- and context-parallel ranks
    bytes += 2.0 * (n - 1) / n * static_cast<double>(c.spec.vocab) / tp * static_cast<double>(c.spec.dim) * sizeof(float);
  }
  return bytes + 2 * 2.0 * (P - 1) / P * sizeof(float);
}

// The trainer for one strategy, or null with r.error set when it does not fit the budget. A step
// that runs out of memory half-way cannot be skipped by every rank together (they are in
// different collectives by then), so the prediction, exact for these steps, decides first.
std::unique_ptr<Trainer> admit(Backend& be, Pool& pool, Communicator& comm, const TrainConfig& tc, uint64_t budget,
                               uint64_t host_budget, StrategyResult& r) {
  if (budget || host_budget) {
    const int64_t micro = tc.batch / tc.layout.dims.resolved(comm.world_size()).dp() / tc.accum;
    Estimate e = predict_step(tc, comm.world_size(), comm.rank(), micro, false);
    if (host_budget && e.host.peak > host_budget)
      r.error = fmt::format("out of memory on the host tier: a step needs {} per rank, the host budget is {}",
                            format_bytes(double(e.host.peak)), format_bytes(double(host_budget)));
    else if (budget && e.peak > budget)
      r.error = fmt::format("out of memory: a step needs {} per rank at its peak ({}), the budget is {}",
                            format_bytes(double(e.peak)),
                            phase_label(e.peak_phase, family_of(tc.spec).unit_names(tc.spec)),
                            format_bytes(double(budget)));
    // Every rank learns the verdict before any builds a trainer: its mesh splits communicators,
    // which is collective, so a rank that stopped here would leave the others waiting.
    if (comm.all_max(r.error.empty() ? 0 : 1)) {
      if (r.error.empty()) r.error = "out of memory on another rank";
      return nullptr;
    }
  }
  try {
    return std::make_unique<Trainer>(be, pool, comm, tc);
  } catch (const OutOfMemory& e) {
    r.error = e.what();
    return nullptr;
  }
}

// Rank 0 learns every rank's peak per category, its total, its host tier's total and the
// composition at its total's peak: its own, and the largest of the others (the composition: that of
// the other rank whose total is the largest).
constexpr int kTotal = kNumCategories, kHost = kNumCategories + 1, kAtPeak = kNumCategories + 2;
using Peaks = std::array<uint64_t, 2 * kNumCategories + 2>;
void collect_peaks(Communicator& comm, const Peaks& peak, StrategyResult& r) {
  std::vector<uint64_t> all = comm.gather_u64(peak);
  if (all.empty()) return;  // not rank 0
  for (int c = 0; c < kNumCategories; ++c) r.peak0[c] = all[c], r.at_peak0[c] = all[kAtPeak + c];
  r.total0 = all[kTotal];
  r.host0 = all[kHost];
  for (int q = 1; q < comm.world_size(); ++q) {
    const uint64_t* p = all.data() + static_cast<size_t>(q) * peak.size();
    for (int c = 0; c < kNumCategories; ++c) r.peak_other[c] = std::max(r.peak_other[c], p[c]);
    if (p[kTotal] > r.total_other || q == 1)
      for (int c = 0; c < kNumCategories; ++c) r.at_peak_other[c] = p[kAtPeak + c];
    r.total_other = std::max(r.total_other, p[kTotal]);
    r.host_other = std::max(r.host_other, p[kHost]);
  }
}

// The last step's bus bytes on each axis the run used, and the theory's for each (StrategyResult).
void count_axes(StrategyResult& r, Trainer& trainer, const TrainConfig& tc, StrategyKind kind) {
  // The data-parallel axes move this rank's part of the model among its data-parallel group.
  double part = 0;
  for (const auto& u : trainer.units()) part += static_cast<double>(u->layout().numel);
  // Under --cp the strategy's group holds the cp ranks too (dp x cp), and its shard group dp_shard x cp;
  // under --ep it leaves the ep ranks out (edp_cp: those holding the same experts).
  const int cp = tc.layout.dims.cp;
  StepTraffic theory = traffic(kind, part, trainer.mesh().size(CommAxis::edp_cp), tc);
  // Under --pp ZeRO-3 keeps a stage's units gathered over the step: one gather of the parameters,
  // not one for the forward and one for the backward.
  if (tc.layout.dims.pp > 1 && kind == StrategyKind::zero3) theory.group_overlapped -= theory.p;
  r.comm_theory = theory.total_bus();
  if (kind == StrategyKind::zero3 && tc.strategy.zeropp.any()) {  // ZeRO++'s collectives instead of zero3's three
    const int S = trainer.mesh().size(CommAxis::dp_shard_cp);
    const int L = tc.strategy.zeropp.hierarchical() ? trainer.mesh().size(CommAxis::dp_shard_node) : S;
    const auto& pr = tc.strategy.precision;
    r.comm_theory += zeropp_step_bytes(tc.strategy.zeropp, part, S, L, double(dtype_size(pr.param_dtype)),
                                       double(dtype_size(pr.reduce_dtype))).total() -
                     theory.fs() * theory.group_overlapped;
  }
  // Muon: its exchanges within the shard group (ZeRO) and its tp gathers (docs/muon.md).
  const bool muon_on = tc.optim.kind == OptimizerKind::muon;
  std::vector<UnitLayout> layouts;
  for (const auto& u : trainer.units())
    if (muon_on) layouts.push_back(u->layout());
  const double muon = muon_exchange_bytes(kind, layouts, trainer.mesh().size(CommAxis::dp_shard_cp));
  r.comm_theory += muon;
  if (tc.layout.dims.hybrid()) {
    r.dp_shard = tc.layout.dims.dp_shard * cp;
    const auto& axis = trainer.mesh().last_step_bytes();
    r.comm_intra = axis[static_cast<int>(cp > 1 ? CommAxis::dp_shard_cp : CommAxis::dp_shard)];
    r.comm_inter = axis[static_cast<int>(CommAxis::dp_replicate)];
    r.theory_intra = theory.intra_bus() + muon;
    r.theory_inter = theory.across_bus();
  }
  // The whole step's theory: the data-parallel axes' and each model-parallel axis's.
  auto add_axis = [&](CommAxis a, int degree, double theory_bytes) {
    r.axes.push_back({a, degree, trainer.mesh().last_step_bytes()[static_cast<int>(a)], theory_bytes});
    r.comm_theory += theory_bytes;
  };
  if (tc.layout.dims.tp > 1) {
    const double muon_tp = muon_tp_bytes(kind, layouts, trainer.mesh().size(CommAxis::dp_shard_cp),
                                         trainer.mesh().rank(CommAxis::dp_shard_cp), tc.layout.dims.tp);
    const TpConfig tp{tc.layout.dims.tp, trainer.mesh().rank(CommAxis::tp), tc.layout.sequence_parallel};
    const int64_t micro = tc.batch / trainer.mesh().dp_size() / tc.accum;
    add_axis(CommAxis::tp, tp.degree,
             static_cast<double>(tc.accum) * tp_micro_step_bus_bytes(family_of(tc.spec).layout(tc.spec, tp), tc.spec,
                                                                     tp, micro, tc.spec.seq / cp, tc.checkpointing) +
                 2.0 * (tp.degree - 1) / tp.degree * sizeof(float) + muon_tp);
  }
  if (tc.layout.dims.pp > 1)
    add_axis(CommAxis::pp, tc.layout.dims.pp, pp_theory(tc, trainer.mesh().dp_size(), tc.layout.dims.tp, cp));
  r.ranks_per_node = tc.layout.ranks_per_node;
  r.axis_bytes = trainer.mesh().last_step_bytes();
  const Mesh::LinkBytes link = trainer.mesh().last_step_bytes_by_link();
  r.node_intra = link.intra, r.node_inter = link.inter;
  if (cp > 1) {
    int layers = 0;  // this rank's (its stage's under --pp)
    for (const auto& u : trainer.units()) layers += u->recomputable() ? 1 : 0;
    add_axis(CommAxis::cp, cp,
             static_cast<double>(tc.accum) * cp::micro_step_bus_bytes(tc.spec, tc.layout.cp.method, layers,
                                                                      tc.layout.dims.tp, cp,
                                                                      tc.batch / trainer.mesh().dp_size() / tc.accum,
                                                                      tc.checkpointing));
  }
}

// levers: with ZeRO++'s levers (zero3 only); without, plain.
StrategyResult run_one(Backend& be, const ProcessGroup& group, const CompareConfig& cfg, StrategyKind kind,
                       bool levers) {
  StrategyResult r;
  r.kind = kind;
  TrainConfig tc = cfg.train;
  tc.use_strategy(kind);  // --offload and hybrid sharding as far as the strategy allows
  if (!levers) tc.strategy.zeropp = ZeroPP{};
  r.quantized = tc.strategy.zeropp.weight_bits > 0 || tc.strategy.zeropp.grad_bits > 0;
  r.name = tc.label();
  Pool pool(be, PoolConfig{cfg.budget, cfg.host_budget});
  auto comm = group.connect(pool);
  tc.log_path.clear();
  tc.save_path.clear();
  tc.record_step = true;
  std::unique_ptr<Trainer> trainer = admit(be, pool, *comm, tc, cfg.budget, cfg.host_budget, r);
  if (comm->all_max(trainer ? 0 : 1)) {  // every rank skips together: none is left waiting in a collective
    r.oom = true;
    if (r.error.empty()) r.error = "out of memory on another rank";
    return r;
  }
  std::vector<double> ms;
  Peaks peak{};
  for (int64_t t = 0; t < tc.steps; ++t) {
    StepStats s = trainer->step(t);
    r.losses.push_back(s.loss);
    if (t > 0 || tc.steps == 1) ms.push_back(s.ms);
    r.comm_bytes = s.comm_bytes;
    const auto& cat = pool.ledger().peak_by_category();
    for (int c = 0; c < kNumCategories; ++c) peak[c] = std::max(peak[c], cat[c]);
    if (pool.ledger().peak_total() > peak[kTotal] || t == 0)
      for (int c = 0; c < kNumCategories; ++c) peak[kAtPeak + c] = pool.ledger().composition_at_peak()[c];
    peak[kTotal] = std::max<uint64_t>(peak[kTotal], pool.ledger().peak_total());
    peak[kHost] = std::max<uint64_t>(peak[kHost], s.host_peak_bytes);

    if (trainer->has_validation() && tc.validates_after(t)) {
      r.val_steps.push_back(t + 1);
      r.val_losses.push_back(trainer->evaluate());
      s.val_loss = r.val_losses.back();
    }
    r.steps.push_back(s);
  }
  r.memory = memory_row(*trainer, r.name);
  r.ms_per_step = median(ms);
  r.tokens_per_s = static_cast<double>(tc.batch * tc.spec.seq) / (r.ms_per_step / 1e3);
  count_axes(r, *trainer, tc, kind);
  collect_peaks(*comm, peak, r);
  return r;
}

std::string mib(double bytes) { return fmt::format("{:.2f}", bytes / (1 << 20)); }

// The per-axis traffic tables: hybrid sharding's groups, the tp, cp and pp axes, where a run used them.
// compare's table for each model-parallel axis, in the order printed: title, column, what the theory counts.
struct AxisTable {
  CommAxis axis;
  const char* title;
  const char* column;
  const char* note;
};
constexpr AxisTable kAxisTables[] = {
    {CommAxis::tp, "tensor parallelism: bus bytes per rank in the last step over the tp group", "tp axis",
     "(per layer and micro-step 2 all-reduces of B*T*C forward and 2 backward, or with --sequence-parallel the "
     "same as all-gathers and reduce-scatters plus the backward re-gathers; the embedding, the head, the "
     "vocabulary-parallel loss's 3 B*T floats and the gradient norm: src/model/tp.hpp)"},
    {CommAxis::cp, "context parallelism: bus bytes per rank in the last step over the cp group", "cp axis",
     "(per layer and micro-step, G = B*T*2*KV*hd floats: allgather, an all-gather of the group's K/V rows in "
     "forward and again in backward and a reduce-scatter of their gradients, (C-1)/C x G each; ring, a send "
     "and a receive of G/C per hop, C-1 hops of K/V forward and backward and C of dK/dV; forward twice under "
     "--activation-checkpointing blocks: src/model/parallel/cp_attention.hpp)"},
    {CommAxis::pp, "pipeline parallelism: bus bytes of rank 0 (the first stage) in the last step over the pp axis",
     "pp axis",
     "(per micro-batch and chunk boundary an activation of B*T*C floats forward and its gradient back; the tied "
     "embedding's gradient all-reduced over the first and last stages; the loss and the norm: one float each). "
     "Under --pp the theory's Psi is rank 0's stage, and zero3's 2Psi(N-1)/N: a stage stays gathered over the "
     "step"},
};

void print_axis_tables(const CompareResult& res, std::FILE* out) {
  bool hybrid = false;
  for (const auto& r : res.runs) hybrid |= !r.oom && r.dp_shard > 0;
  if (hybrid) {
    std::fprintf(out, "\nhybrid sharding: bus bytes per rank in the last step, within the shard group and across groups\n");
    std::fprintf(out, "%-19s %14s %14s %14s %14s\n", "strategy", "intra-group", "theory", "inter-group", "theory");
    for (const auto& r : res.runs)
      if (!r.oom && r.dp_shard > 0)
        std::fprintf(out, "%-19s %14s %14s %14s %14s\n", r.name.c_str(), format_bytes(r.comm_intra).c_str(),
                     format_bytes(r.theory_intra).c_str(), format_bytes(r.comm_inter).c_str(),
                     format_bytes(r.theory_inter).c_str());
    std::fprintf(out, "(intra: the group's reduce-scatter and all-gathers, (S-1)/S each, plus the gradient norm; inter: "
                 "an all-reduce of each rank's shard, 2(G-1)/G x Psi/S; the world's loss all-reduce is in neither)\n");
  }
  // By link: what stays inside a node and what crosses one (--ranks-per-node), against plain zero3's.
  const StrategyResult* zero3 = nullptr;
  for (const auto& r : res.runs)
    if (!r.oom && r.kind == StrategyKind::zero3 && !zero3) zero3 = &r;
  if (!res.runs.empty() && res.runs.front().ranks_per_node > 0) {
    std::fprintf(out, "\nbus bytes per rank in the last step by link, %d ranks per node (--ranks-per-node)\n"
                 "%-19s %14s %14s %12s\n",
                 res.runs.front().ranks_per_node, "strategy", "intra-node", "inter-node", "inter/zero3");
    for (const auto& r : res.runs)
      if (!r.oom)
        std::fprintf(out, "%-19s %14s %14s %12s\n", r.name.c_str(), format_bytes(r.node_intra).c_str(),
                     format_bytes(r.node_inter).c_str(),
                     zero3 && zero3->node_inter > 0 ? fmt::format("{:.3f}", r.node_inter / zero3->node_inter).c_str() : "-");
    std::fprintf(out, "(a group's bytes are inter-node when its ranks span nodes; ZeRO++'s formulas: shard/zeropp.hpp)\n");
  }
  // One table per model-parallel axis a run used: measured and theory, then what the theory counts.
  for (const AxisTable& t : kAxisTables) {
    bool used = false;
    for (const auto& r : res.runs) used |= !r.oom && r.traffic_on(t.axis);
    if (!used) continue;
    std::fprintf(out, "\n%s\n%-19s %14s %14s\n", t.title, "strategy", t.column, "theory");
    for (const auto& r : res.runs)
      if (const AxisTraffic* a = r.oom ? nullptr : r.traffic_on(t.axis))
        std::fprintf(out, "%-19s %14s %14s\n", r.name.c_str(), format_bytes(a->bytes).c_str(),
                     format_bytes(a->theory).c_str());
    std::fprintf(out, "%s\n", t.note);
  }
}

// Memory: rank 0 (and, for dp, the other ranks) at the peak of the run, MiB: each category's bytes at
// that moment, so a row adds up to its peak (the HTML's bars show the same composition).
void print_memory_peaks(const CompareResult& res, int world, std::FILE* out) {
  std::fprintf(out, "\npeak memory per rank (MiB): each category's bytes at the moment of the peak, so a row adds up "
               "to its peak (the JSON's by-category fields: each category's own maximum over the run); host peak: the "
               "host tier (--offload)\n%-19s", "strategy");
  for (int k = 0; k < kNumCategories; ++k) std::fprintf(out, " %*s", static_cast<int>(std::max<size_t>(9, kCategoryNames[k].size())), std::string(kCategoryNames[k]).c_str());
  std::fprintf(out, " %9s %8s %8s %9s\n", "peak", "vs ddp", "vs dp", "host peak");
  uint64_t ddp_total = 0, dp_total = 0;
  for (const auto& r : res.runs) {
    if (r.kind == StrategyKind::ddp && !r.oom) ddp_total = std::max(r.total0, r.total_other);
    if (r.kind == StrategyKind::dp && !r.oom) dp_total = std::max(r.total0, r.total_other);
  }
  auto row = [&](const std::string& label, const std::array<uint64_t, kNumCategories>& p, uint64_t total,
                 uint64_t host) {
    std::fprintf(out, "%-19s", label.c_str());
    for (int k = 0; k < kNumCategories; ++k)
      std::fprintf(out, " %*s", static_cast<int>(std::max<size_t>(9, kCategoryNames[k].size())), mib(double(p[k])).c_str());
    auto saving = [&](uint64_t base) {
      return base ? fmt::format("{:+.0f}%", 100.0 * (double(total) - double(base)) / double(base)) : std::string("-");
    };
    std::fprintf(out, " %9s %8s %8s %9s\n", mib(double(total)).c_str(), saving(ddp_total).c_str(),
                 saving(dp_total).c_str(), mib(double(host)).c_str());
  };
  for (const auto& r : res.runs) {
    if (r.oom) continue;
    if (r.kind == StrategyKind::dp && world > 1) {
      row("dp rank 0", r.at_peak0, r.total0, r.host0);
      row("dp others", r.at_peak_other, r.total_other, r.host_other);
    } else {  // the row of the rank with the larger peak (the ranks are alike but for rounding of shards)
      const bool other = r.total_other > r.total0;
      row(r.name, other ? r.at_peak_other : r.at_peak0, std::max(r.total0, r.total_other), std::max(r.host0, r.host_other));
    }
  }
}

void print_tables(const CompareConfig& cfg, const CompareResult& res, int world, std::FILE* out) {
  const TrainConfig& c = cfg.train;
  std::fprintf(out, "\nshardlab compare: %s, %d ranks, global batch %lld x %lld tokens, %lld steps, %s\n",
               c.spec.describe().c_str(), world, static_cast<long long>(c.batch), static_cast<long long>(c.spec.seq),
               static_cast<long long>(c.steps), cfg.budget ? ("budget " + format_bytes(double(cfg.budget)) + "/rank").c_str() : "no budget");
  const bool val = c.has_validation();
  std::fprintf(out, "\n%-19s %11s %12s%s %9s %9s %14s %14s %8s %8s\n", "strategy", "final loss", "max loss dev",
               val ? "    val loss" : "", "ms/step", "tok/s", "comm/rank/step", "theory", "÷theory", "÷ddp");
  double ddp_comm = 0;
  for (const auto& r : res.runs)
    if (r.kind == StrategyKind::ddp) ddp_comm = r.comm_bytes;
  for (const auto& r : res.runs) {
    if (r.oom) {
      std::fprintf(out, "%-19s  did not fit: %s\n", r.name.c_str(), r.error.substr(0, r.error.find('\n')).c_str());
      continue;
    }
    std::fprintf(out, "%-19s %11.5f %12.2e%s %9.1f %9.0f %14s %14s %8s %8s\n", r.name.c_str(), r.losses.back(),
                 r.max_rel_dev, val && !r.val_losses.empty() ? fmt::format(" {:11.5f}", r.val_losses.back()).c_str() : "",
                 r.ms_per_step, r.tokens_per_s, format_bytes(r.comm_bytes).c_str(),
                 format_bytes(r.comm_theory).c_str(),
                 r.comm_theory > 0 ? fmt::format("{:.3f}", r.comm_bytes / r.comm_theory).c_str() : "-",
                 ddp_comm > 0 ? fmt::format("{:.2f}", r.comm_bytes / ddp_comm).c_str() : "-");
  }
  print_axis_tables(res, out);
  print_memory_peaks(res, world, out);
  std::fprintf(out,
               "\ncomm: bus bytes per rank in the last step (all-reduce 2(N-1)/N, all-gather/reduce-scatter/gather/"
               "scatter (N-1)/N, broadcast/reduce 1 x size).\ntheory: 2Psi(N-1)/N elements for ddp, zero1 and zero2, "
               "3Psi(N-1)/N for zero3 (measured is higher: the tied embedding is gathered once more\nfor the lm head), "
               "dp: broadcast + reduce of the parameters and gather + scatter of the logits. vs ddp / vs dp: change "
               "of the peak per rank\n(dp: its largest rank).\n");
  if (cfg.train.optim.kind == OptimizerKind::muon)
    std::fprintf(out, "--optimizer muon: zero1-3's theory adds Muon's exchange, an all-gather and a reduce-scatter of "
                 "each unit with matrices in f32 over the shard group, and the tp axis's the gathers of the split "
                 "matrices a rank iterates (docs/muon.md).\n");
  if (const int ep = cfg.train.layout.dims.ep; ep > 1)
    std::fprintf(out, "--ep %d: the theory is the strategy's traffic over the ranks holding the same experts; the "
                 "measured bytes add the ep group's all-to-alls (they follow the routing) and the dense gradients' "
                 "all-reduce over it.\n", ep);
  const bool quantized = std::any_of(res.runs.begin(), res.runs.end(), [](const auto& r) { return r.quantized; });
  std::fprintf(out, "%s\n", res.agree ? fmt::format("losses agree: every strategy within {:.0e} of {} at every step{}",
                                                       cfg.tolerance, res.runs.front().name,
                                                       quantized ? fmt::format(" (ZeRO++'s quantized rows: the last loss within {:.0e})",
                                                                               std::max(cfg.tolerance, kQuantizedTolerance))
                                                                 : "").c_str()
                                        : ("LOSSES DISAGREE: " + res.disagreement).c_str());
  std::fflush(out);
}

}  // namespace

const AxisTraffic* StrategyResult::traffic_on(CommAxis a) const {
  for (const AxisTraffic& t : axes)
    if (t.axis == a) return &t;
  return nullptr;
}

void check_agreement(CompareResult& res, double tolerance) {
  const StrategyResult* first = nullptr;
  for (const auto& r : res.runs)
    if (!r.oom && !first) first = &r;
  res.agree = true;
  res.disagreement.clear();
  for (auto& r : res.runs) {
    if (r.oom || !first) continue;
    r.max_rel_dev = 0;
    // ZeRO++'s quantized rows: their last losses, training and validation, within kQuantizedTolerance.
    const double tol = r.quantized ? std::max(tolerance, kQuantizedTolerance) : tolerance;
    auto check = [&](const std::vector<float>& mine, const std::vector<float>& theirs, const auto& step_of,
                     const char* what) {
      const size_t n = std::min(mine.size(), theirs.size());
      for (size_t i = 0; i < n; ++i) {
        const double dev = std::fabs(mine[i] - theirs[i]) / std::max(1e-12, double(std::fabs(theirs[i])));
        if (!(dev <= r.max_rel_dev)) r.max_rel_dev = dev;  // NaN counts as the largest deviation
        if ((!r.quantized || i + 1 == n) && !(dev <= tol) && res.agree) {
          res.agree = false;
          res.disagreement = fmt::format("{} step {}: {} {:.7f}, {} has {:.7f} (relative difference {:.2e} > {:.0e})",
                                         r.name, step_of(i), what, mine[i], first->name, theirs[i], dev, tol);
        }
      }
    };
    check(r.losses, first->losses, [](size_t i) { return int64_t(i) + 1; }, "loss");
    check(r.val_losses, first->val_losses, [&r](size_t i) { return r.val_steps[i]; }, "validation loss");
  }
}

CompareResult run_compare(Backend& be, const ProcessGroup& group, const CompareConfig& cfg, std::FILE* out) {
  SHARD_REQUIRE(!cfg.strategies.empty(), "--strategies: name at least one strategy");
  CompareResult res;
  for (StrategyKind s : cfg.strategies) {
    if (group.rank == 0) {
      std::fprintf(out, "running %s (%lld steps)...\n", strategy_name(s), static_cast<long long>(cfg.train.steps));
      std::fflush(out);
    }
    res.runs.push_back(run_one(be, group, cfg, s, false));
    // ZeRO++: zero3 with its levers beside plain zero3, the row it is measured against.
    if (s == StrategyKind::zero3 && cfg.train.strategy.zeropp.any()) {
      if (group.rank == 0) {
        std::fprintf(out, "running zero3 %s (%lld steps)...\n", cfg.train.strategy.zeropp.label().c_str(),
                     static_cast<long long>(cfg.train.steps));
        std::fflush(out);
      }
      res.runs.push_back(run_one(be, group, cfg, s, true));
    }
  }
  check_agreement(res, cfg.tolerance);
  if (group.rank == 0) print_tables(cfg, res, group.size, out);
  return res;
}

std::string compare_json(const CompareConfig& cfg, const CompareResult& r, int world) {
  const TrainConfig& c = cfg.train;
  nlohmann::json j;
  j["schema"] = "shardlab.compare/1";
  j["model"] = spec_to_json(c.spec);
  j["world"] = world;
  j["config"] = {{"batch", c.batch}, {"accum", c.accum}, {"steps", c.steps}, {"seed", c.seed},
                 {"lr", c.schedule.lr}, {"optimizer", optimizer_name(c.optim.kind)}, {"data", c.data}, {"budget_bytes", cfg.budget},
                 {"tolerance", cfg.tolerance}, {"shuffle", c.shuffle}, {"val_every", c.val_every},
                 {"val_batches", c.val_batches}, {"host_budget_bytes", cfg.host_budget},
                 {"activation_checkpointing", checkpointing_name(c.checkpointing)},
                 {"offload", offload_name(c.strategy.offload)}};
  if (!c.val_data.empty()) j["config"]["val_data"] = c.val_data;
  if (c.val_fraction != 0) j["config"]["val_fraction"] = c.val_fraction;
  j["losses_agree"] = r.agree;
  if (!r.agree) j["disagreement"] = r.disagreement;
  auto cats = [](const std::array<uint64_t, kNumCategories>& p, uint64_t total) {
    nlohmann::json o;
    for (int k = 0; k < kNumCategories; ++k) o[std::string(kCategoryNames[k])] = p[k];
    o["peak_total"] = total;
    return o;
  };
  for (const auto& s : r.runs) {
    nlohmann::json o = {{"name", s.name}, {"fits", !s.oom}};
    if (s.oom) {
      o["error"] = s.error;
    } else {
      o["losses"] = s.losses;
      if (!s.val_losses.empty()) {
        o["val_loss"] = s.val_losses.back();  // at the last step
        for (size_t i = 0; i < s.val_losses.size(); ++i)
          o["val_losses"].push_back({{"step", s.val_steps[i]}, {"val_loss", s.val_losses[i]}});
      }
      o["max_loss_rel_dev"] = s.max_rel_dev;
      o["ms_per_step"] = s.ms_per_step;
      o["tokens_per_s"] = s.tokens_per_s;
      o["comm_bytes_per_rank_per_step"] = s.comm_bytes;
      o["comm_theory_bytes"] = s.comm_theory;
      if (s.dp_shard > 0)
        o["hybrid"] = {{"dp_shard", s.dp_shard},           {"intra_bytes", s.comm_intra},
                       {"intra_theory_bytes", s.theory_intra}, {"inter_bytes", s.comm_inter},
                       {"inter_theory_bytes", s.theory_inter}};
      for (const AxisTraffic& a : s.axes)
        o[comm_axis_name(a.axis)] = {{"degree", a.degree}, {"bytes", a.bytes}, {"theory_bytes", a.theory}};
      nlohmann::json axes = nlohmann::json::object();
      for (int a = 0; a < kNumCommAxes; ++a)
        if (s.axis_bytes[a] > 0) axes[comm_axis_name(static_cast<CommAxis>(a))] = s.axis_bytes[a];
      o["links"] = {{"ranks_per_node", s.ranks_per_node}, {"intra_node_bytes", s.node_intra},
                    {"inter_node_bytes", s.node_inter}, {"axes", axes}};
      o["peak_bytes_rank0"] = cats(s.peak0, s.total0);
      o["peak_bytes_rank0"]["at_peak"] = cats(s.at_peak0, s.total0);
      o["host_peak_bytes_rank0"] = s.host0;
      if (world > 1) o["peak_bytes_other_ranks_max"] = cats(s.peak_other, s.total_other);
      if (world > 1) o["host_peak_bytes_other_ranks_max"] = s.host_other;
    }
    j["strategies"].push_back(o);
  }
  return j.dump(2);
}

}  // namespace shardlab
