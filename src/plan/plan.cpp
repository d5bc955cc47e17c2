// plan.cpp — enumerate the layouts, predict their time (plan_time.hpp), walk them fastest first
// predicting memory (the estimator) where no bound settles it, rank (plan.hpp).
#include "src/plan/plan.hpp"

#include <algorithm>
#include <chrono>
#include <map>

#include "src/comm/mesh.hpp"
#include "src/core/units.hpp"
#include "src/model/family.hpp"
#include "src/model/model.hpp"
#include "src/plan/plan_bound.hpp"
#include "src/plan/plan_progress.hpp"
#include "src/train/predict.hpp"

namespace shardlab {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

template <class T>
std::vector<T> pinned_or(const std::optional<T>& pin, std::vector<T> all) {
  if (pin) return {*pin};
  return all;
}

class Searcher {
 public:
  explicit Searcher(const PlanConfig& c) : c_(c) {}

  PlanResult run(std::FILE* progress) {
    const double t0 = now_s();
    PlanResult res;
    std::vector<PlanEntry> cands = enumerate(res);
    res.candidates = cands.size();
    SHARD_REQUIRE(!cands.empty(),
                  "no layout of {} ranks meets the flags given: tp must divide the heads ({}), KV heads ({}) and MLP "
                  "width ({}) within a node of {}, tp x pp the world, dp = world / (tp x pp) the global batch ({}), "
                  "pp x virtual stages at most the {} blocks, and each schedule's own rules (--pp-virtual, micro-batches)",
                  c_.world, c_.train.spec.heads, c_.train.spec.num_kv_heads(), c_.train.spec.ffn_hidden(),
                  std::min(c_.ranks_per_node, c_.world), c_.batch(), c_.train.spec.layers);
    std::stable_sort(cands.begin(), cands.end(), [this](const PlanEntry& a, const PlanEntry& b) {
      if (rank_ms(a) != rank_ms(b)) return rank_ms(a) < rank_ms(b);
      return a.micro_batch > b.micro_batch;  // a tie (the model sees none): the larger micro-batch
    });
    std::vector<PlanEntry> fit, no;
    std::map<std::string, int64_t> failed_mb;  // layout (all but the micro-batch) -> smallest that did not fit
    WalkProgress report(progress, terminal_columns(progress));
    WalkState w;
    w.candidates = cands.size(), w.keep = c_.keep, w.exhaustive = c_.exhaustive;
    for (PlanEntry& e : cands) {
      if (!c_.exhaustive && fit.size() >= c_.keep) break;
      w.walked = ++res.walked, w.predictions = res.predictions, w.elapsed_s = now_s() - t0;
      report.update(w);
      // Past the fastest that do not fit that the result keeps, no report shows the peak of one that
      // does not: its steps may stop at their first allocation past the budget.
      const double t_settle = now_s();
      switch (settle(e, res, failed_mb, !c_.exhaustive && no.size() >= c_.keep_not_fitting)) {
        case Settled::fits: {
          fit.push_back(std::move(e));
          w.fit = fit.size();
          const double cost = now_s() - t_settle;
          w.fit_cost_max_s = std::max(w.fit_cost_max_s, cost);
          if (w.fit == 1) w.first_fit_walked = w.walked, w.first_fit_s = now_s() - t0, w.first_fit_cost_s = cost;
          break;
        }
        case Settled::does_not_fit: no.push_back(std::move(e)); break;
        case Settled::not_runnable: break;
      }
    }
    report.finish();
    res.entries = std::move(fit);
    for (size_t i = 0; i < no.size() && i < c_.keep_not_fitting; ++i) res.entries.push_back(std::move(no[i]));
    res.seconds = now_s() - t0;
    return res;
  }

 private:
  const PlanConfig& c_;
  PlanBounds bounds_{c_};

  enum class Settled { fits, does_not_fit, not_runnable };

  // The time the walk orders by: the step's, an unasked offload's longer by offload_rank_factor.
  double rank_ms(const PlanEntry& e) const {
    const bool unasked_offload = e.strategy.offload != Offload::none && !c_.pins.offload;
    return unasked_offload ? e.step_ms() * c_.offload_rank_factor : e.step_ms();
  }

  // Whether e fits: ruled out by a bound (a smaller micro-batch of its layout that did not fit, a
  // stage's model states and activations in flight at its first backward over the budget: see
  // plan_bound.hpp), else predicted.
  Settled settle(PlanEntry& e, PlanResult& res, std::map<std::string, int64_t>& failed_mb, bool stop_at_budget) {
    const std::string key = group_key(e);
    if (!c_.exhaustive) {
      auto it = failed_mb.find(key);
      if (it != failed_mb.end() && e.micro_batch >= it->second) {
        e.why = fmt::format("micro-batch {} of this layout does not fit already", it->second);
        ++res.ruled_by_micro_batch;
        return Settled::does_not_fit;
      }
      const PlanBounds::Bound b = bounds_.layout(e);
      if (b.total() > c_.device_memory) {
        e.why = fmt::format("at least {} > {}: model states {}, activations in flight {}{}",
                            format_bytes(double(b.total())), format_bytes(double(c_.device_memory)),
                            format_bytes(b.states), format_bytes(b.activations),
                            b.gathered > 0 ? ", a gathered block " + format_bytes(b.gathered) : "");
        ++res.ruled_by_bound;
        return Settled::does_not_fit;
      }
    }
    const TrainConfig t = e.config(c_);
    try {
      t.validate(c_.world);
      // Some rules hold only once the mesh is built (ZeRO++'s equal share of a shard group on
      // every node): the prediction builds it.
      predict_memory(t, e, res, stop_at_budget);
    } catch (const InputError&) {
      ++res.not_runnable;
      return Settled::not_runnable;
    }
    if (e.fits) return Settled::fits;
    auto [it, fresh] = failed_mb.emplace(key, e.micro_batch);
    if (!fresh) it->second = std::min(it->second, e.micro_batch);
    return Settled::does_not_fit;
  }

  // The (schedule, virtual stages) pairs of a pipeline of pp stages, in the planner's order of the
  // registry (ties in time go to the earlier); without a pipeline, the default schedule.
  std::vector<std::pair<PpSchedule, int>> schedules(int pp, int units) const {
    if (pp == 1) return {{default_pp_schedule(), 1}};
    std::vector<const PpScheduleDef*> defs(pp_schedules().begin(), pp_schedules().end());
    std::stable_sort(defs.begin(), defs.end(), [](auto* a, auto* b) { return a->plan_order < b->plan_order; });
    std::vector<std::pair<PpSchedule, int>> out;
    for (const PpScheduleDef* d : defs) {
      const PpSchedule k(*d);
      if (c_.pins.schedule && *c_.pins.schedule != k) continue;
      for (int v : pinned_or<int>(c_.pins.pp_virtual, d->plan_virtual))
        if (pp_schedule_allows(k, pp, v, 0) && pp * v <= units) out.push_back({k, v});
    }
    return out;
  }

  // e priced; and for zero3 whose shard group spans more ranks than a node holds, once more with
  // the ZeRO++ levers the flags allow (PlanConfig::zeropp; the time model prices them on their links,
  // the prediction holds hpZ's shard).
  void add_entry(std::vector<PlanEntry>& out, PlanEntry e, int64_t span) const {
    const int K = std::min(c_.ranks_per_node, c_.world);
    e.time = predict_step_time(c_.train.spec, e.time_layout(c_), c_.rates.device, c_.rates.achievable);
    out.push_back(e);
    if (e.strategy.kind != StrategyKind::zero3 || span <= K || c_.world % K != 0 || !c_.zeropp.any()) return;
    e.strategy.zeropp = c_.zeropp;
    e.layout.ranks_per_node = K;
    e.time = predict_step_time(c_.train.spec, e.time_layout(c_), c_.rates.device, c_.rates.achievable);
    out.push_back(std::move(e));
  }

  std::vector<PlanEntry> enumerate(PlanResult& res) {
    const ModelSpec& s = c_.train.spec;
    const PlanPins& p = c_.pins;
    const int N = c_.world, K = std::min(c_.ranks_per_node, c_.world);
    const int64_t B = c_.batch();
    // Each chunk holds at least one block (the time model spreads the blocks over the chunks).
    const int units = static_cast<int>(s.layers);
    std::vector<PlanEntry> out;
    for (int t : tp_choices()) {
      std::vector<int> pps;
      for (int pp : divisors(N / t))
        if (pp <= units) pps.push_back(pp);
      if (p.pp) {
        SHARD_REQUIRE(*p.pp <= units, "--pp {}: the model has {} blocks (each stage needs one)", *p.pp, units);
        if ((N / t) % *p.pp != 0) continue;  // another tp may leave room for it
        pps = {*p.pp};
      }
      for (int pp : pps)
        for (int cp : cp_choices(N / (t * pp))) {
          if (pp == 1 && (p.schedule || p.pp_virtual.value_or(1) > 1) && !p.pp) continue;  // they ask for a pipeline
          const int dp = N / (t * pp * cp);
          if (B % dp != 0) {
            ++res.not_runnable;
            continue;
          }
          const std::vector<std::pair<PpSchedule, int>> scheds = schedules(pp, units);
          std::vector<int> groups = {dp};
          const int local = K / (t * cp);  // a node's share of the data-parallel ranks
          if (local > 1 && local < dp && dp % local == 0) groups.push_back(local);
          if (p.dp_shard) {  // train's --dp-shard: the shard group without ep's ranks
            const int S = *p.dp_shard * p.ep.value_or(1);
            SHARD_REQUIRE(dp % S == 0, "--dp-shard {}{} does not divide the data-parallel degree {} (world {} / "
                          "tp {} / pp {} / cp {})", *p.dp_shard, p.ep ? fmt::format(" x --ep {}", *p.ep) : "", dp, N,
                          t, pp, cp);
            groups = {S};
          }
          std::vector<int64_t> mbs;
          for (int64_t mb = 1; mb <= B / dp; mb *= 2)
            if ((B / dp) % mb == 0) mbs.push_back(mb);
          if (p.micro_batch) {
            SHARD_REQUIRE((B / dp) % *p.micro_batch == 0,
                          "--micro-batch {} does not divide the {} sequences per data-parallel rank (--global-batch {} / "
                          "dp {})", *p.micro_batch, B / dp, B, dp);
            mbs = {*p.micro_batch};
          }
          for (auto [sched, v] : scheds)
            for (int S : groups)
              for (int ep : ep_choices(S))
              for (bool sp : pinned_or<bool>(p.sequence_parallel, {false, true})) {
                if (sp && t == 1) continue;
                for (StrategyKind k : pinned_or<StrategyKind>(
                         p.strategy, {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3}))
                  for (Offload off : pinned_or<Offload>(p.offload, {Offload::none, Offload::optimizer, Offload::params}))
                    for (Checkpointing ck : pinned_or<Checkpointing>(p.checkpointing, checkpointing_choices(s)))
                      for (int64_t mb : mbs) {
                        if ((S < dp && zero_stage(k) == 0) || offload_for(k, off) != off) continue;
                        const int64_t accum = B / (dp * mb);
                        if (!pp_schedule_allows(sched, pp, v, accum)) continue;
                        PlanEntry e;
                        e.strategy = c_.train.strategy.under(k);
                        e.layout.dims = ParallelDims{pp, dp / S, S / ep, t, cp, ep};
                        e.layout.cp.method = c_.train.layout.cp.method;
                        e.strategy.offload = off;
                        e.checkpointing = ck;
                        e.layout.sequence_parallel = sp;
                        e.layout.pipeline.schedule = sched;
                        e.layout.pipeline.virtual_stages = v;
                        e.micro_batch = mb;
                        e.accum = accum;
                        // ZeRO++'s node groups are not tried with experts split over ranks.
                        add_entry(out, std::move(e), ep > 1 ? 0 : int64_t{S} * cp * t);
                      }
              }
        }
    }
    return out;
  }

  // The expert-parallel degrees drawn from a shard group of S ranks: 1, and for a mixture of experts
  // those dividing S and the experts; or the one pinned (none when it does not divide S).
  std::vector<int> ep_choices(int S) const {
    const ModelSpec& s = c_.train.spec;
    if (const std::optional<int>& ep = c_.pins.ep) {
      SHARD_REQUIRE(*ep == 1 || (s.moe.enabled() && s.moe.experts % *ep == 0),
                    "--ep {}: {} has {} experts (expert parallelism needs a mixture of experts whose experts it "
                    "divides)", *ep, s.name, s.moe.experts);
      return S % *ep == 0 ? std::vector<int>{*ep} : std::vector<int>{};
    }
    if (c_.pins.dp_shard) return {1};  // a pinned shard group is train's: ep given with it, or none
    std::vector<int> eps;
    for (int e : divisors(S))
      if (e == 1 || (s.moe.enabled() && s.moe.experts % e == 0)) eps.push_back(e);
    return eps;
  }

  // The context-parallel degrees dividing n ranks: 1, and with the fused attention those up to 32
  // whose head-tail pieces hold at least 128 positions; or the one pinned (none when it does not
  // divide n: another tp or pp may leave room for it).
  std::vector<int> cp_choices(int n) const {
    const ModelSpec& s = c_.train.spec;
    if (const std::optional<int>& cp = c_.pins.cp) {
      if (*cp > 1) check_cp_seq(s.seq, *cp, CpBalance::head_tail);
      return n % *cp == 0 ? std::vector<int>{*cp} : std::vector<int>{};
    }
    std::vector<int> cps;
    for (int c : divisors(n))
      if (c == 1 || (c <= 32 && s.attention == AttentionKernel::flash && s.seq % (2 * c) == 0 && s.seq / (2 * c) >= 128))
        cps.push_back(c);
    return cps;
  }

  // The tensor-parallel degrees: those within a node that divide the world and that the model can
  // be split over (the trainer's rule, tp_split_problem), or the one pinned, refused with the
  // trainer's words when it cannot hold.
  std::vector<int> tp_choices() const {
    const ModelSpec& s = c_.train.spec;
    const int N = c_.world, K = std::min(c_.ranks_per_node, c_.world);
    if (const std::optional<int>& tp = c_.pins.tp) {
      SHARD_REQUIRE(*tp <= K && K % *tp == 0, "--tp {}: tensor parallelism stays within a node of {} ranks", *tp, K);
      if (auto why = tp_split_problem(s, *tp)) throw InputError(*why);
      SHARD_REQUIRE(N % *tp == 0, "--tp {} does not divide --world {}", *tp, N);
      return {*tp};
    }
    std::vector<int> tps;
    for (int t : divisors(K))
      if (N % t == 0 && !tp_split_problem(s, t)) tps.push_back(t);
    return tps;
  }

  // Everything but the micro-batch (and the accumulation that follows from it).
  static std::string group_key(const PlanEntry& e) {
    const ParallelDims& d = e.layout.dims;
    return fmt::format("{} {} {} {} {} {} {} {} {} {} {} {}", d.tp, d.pp, d.cp, d.ep, d.dp_shard, d.dp_replicate,
                       e.layout.pipeline.schedule.name(), e.layout.pipeline.virtual_stages,
                       int(e.layout.sequence_parallel), int(e.strategy.kind), int(e.strategy.offload),
                       int(e.checkpointing));
  }

  // Every distinct stage's step on the meta backend; the peak is the largest of theirs. With
  // stop_at_budget each step ends at its first allocation past a budget (it cannot fit then: the
  // budget is checked against the step's live bytes, which is what the peak is the largest of), and
  // the layout is settled at the first such stage, its peak unknown.
  void predict_memory(const TrainConfig& t, PlanEntry& e, PlanResult& res, bool stop_at_budget) {
    const ParallelDims dims = t.layout.dims.resolved(c_.world);
    const PoolConfig budgets{c_.device_memory, c_.host_memory};
    // Each distinct stage with its bound; stopping at the budget, the stage likeliest to pass it first
    // (the largest bound): a layout that does not fit then ends before its other stages' whole steps.
    std::vector<std::pair<uint64_t, int>> stages;
    for (int k : bounds_.stage_facts(e).distinct) stages.push_back({bounds_.stage(e, k).total(), k});
    if (stop_at_budget)
      std::stable_sort(stages.begin(), stages.end(), [](auto& a, auto& b) { return a.first > b.first; });
    for (const auto& [lb, k] : stages) {
      MeshCoord at;
      at.pp = k;
      const int rank = mesh_rank(dims, at);
      ++res.predictions;
      const std::optional<Estimate> est = stop_at_budget ? predict_step_within(t, c_.world, rank, e.micro_batch, budgets)
                                                         : predict_step(t, c_.world, rank, e.micro_batch, false);
      if (!est) {
        ++res.stopped_at_budget;
        e.why = fmt::format("stage {} passes the budget (its step stopped there)", k);
        return;  // not predicted: the peak is not known
      }
      SHARD_CHECK(est->peak >= lb, "plan: the bound {} exceeds the predicted peak {} of stage {} of {}", lb, est->peak,
                  k, e.label());
      if (est->peak > e.peak || (est->peak == e.peak && k < e.peak_stage)) e.peak = est->peak, e.peak_stage = k;
      e.host_peak = std::max(e.host_peak, est->host.peak);
    }
    e.predicted = true;
    e.fits = e.peak <= c_.device_memory && (c_.host_memory == 0 || e.host_peak <= c_.host_memory);
    if (e.peak > c_.device_memory)
      e.why = fmt::format("device peak {} > {}", format_bytes(double(e.peak)), format_bytes(double(c_.device_memory)));
    else if (!e.fits)
      e.why = fmt::format("host peak {} > {}", format_bytes(double(e.host_peak)), format_bytes(double(c_.host_memory)));
  }
};

}  // namespace

std::string mb_text(const PlanEntry& e) { return fmt::format("{} x {}", e.micro_batch, e.accum); }

PlanResult make_plan(const PlanConfig& c, std::FILE* progress) {
  c.validate();
  return Searcher(c).run(progress);
}

namespace {
// The exposed communication of the groups inside a replica (every axis but data parallelism's).
double comm_time(const TimeSplit& s) {
  double sum = 0;
  for (const auto& [axis, sec] : s.exposed)
    if (axis != CommAxis::dp) sum += sec;
  return sum;
}
}  // namespace

void print_plan(const PlanConfig& c, const PlanResult& res, size_t show, std::FILE* out) {
  std::fprintf(out, "shardlab plan: %s, %d ranks (%d per node), global batch %lld x %lld tokens, params %s, "
               "device %s per rank%s, host %s\n", c.train.spec.describe().c_str(), c.world, c.ranks_per_node,
               static_cast<long long>(c.batch()), static_cast<long long>(c.train.spec.seq),
               dtype_name(c.train.strategy.precision.param_dtype), format_bytes(double(c.device_memory)).c_str(),
               c.budget_note.c_str(),
               c.host_memory ? format_bytes(double(c.host_memory)).c_str() : "unlimited");
  std::fprintf(out, "%s", c.rates.describe().c_str());
  size_t fitting = 0;
  for (const auto& e : res.entries) fitting += e.fits;
  std::fprintf(out, "search: %zu layouts timed, %zu walked fastest first, %zu memory predictions, %zu of them stopped "
               "at the budget (%zu ruled out by a bound, %zu by a smaller micro-batch that did not fit, %zu "
               "not runnable), %.2f s; %zu fit\n", res.candidates, res.walked, res.predictions, res.stopped_at_budget,
               res.ruled_by_bound, res.ruled_by_micro_batch, res.not_runnable, res.seconds, fitting);
  bool ledger = false;
  for (const auto& e : res.entries) ledger |= !e.ledger_top_op.empty();
  std::fprintf(out, "%3s %-52s %-9s %9s %15s %10s %10s %10s %7s %5s  %-38s %9s %10s%s\n", "#", "layout", "ckpt",
               "mb x acc", "peak (stage)", "host peak", "step ms", "tokens/s", "TFLOP/s", "MFU",
               "compute/recomp/tp+cp+ep/dp/bubble/p2p/offl/opt %", "meas ms", "meas peak",
               ledger ? fmt::format(" {:>10}  {}", "ledger ms", "its top operation").c_str() : "");
  auto line = [&](size_t i, const PlanEntry& e) {
    const TimeSplit& s = e.time.split;
    auto pct = [&](double x) { return s.total > 0 ? 100 * x / s.total : 0.0; };
    const std::string split = fmt::format("{:.0f}/{:.0f}/{:.0f}/{:.0f}/{:.0f}/{:.0f}/{:.0f}/{:.0f}", pct(s.compute),
                                          pct(s.recompute), pct(comm_time(s)), pct(s.exposed_on(CommAxis::dp)), pct(s.bubble),
                                          pct(s.pp_p2p), pct(s.offload), pct(s.optimizer));
    const std::string ledger_ms = e.ledger_step_ms ? fmt::format("{:.1f}", *e.ledger_step_ms) : "-";
    const std::string by_ledger =
        e.ledger_top_op.empty() ? std::string() : fmt::format(" {:>10}  {}", ledger_ms, e.ledger_top_op);
    std::fprintf(out, "%3zu %-52s %-9s %9s %15s %10s %10.1f %10.0f %7.3g %4.0f%%  %-38s %9s %10s%s%s\n", i + 1,
                 e.label().c_str(), checkpointing_name(e.checkpointing), mb_text(e).c_str(), e.peak_text().c_str(),
                 e.predicted ? format_bytes(double(e.host_peak)).c_str() : "-", e.step_ms(), e.time.tokens_per_s,
                 e.time.model_tflops_per_device, 100 * e.time.mfu, split.c_str(),
                 e.measured_step_ms ? fmt::format("{:.1f}", *e.measured_step_ms).c_str() : "",
                 e.measured_peak ? format_bytes(double(*e.measured_peak)).c_str() : "", by_ledger.c_str(),
                 e.fits ? "" : ("  does not fit: " + e.why).c_str());
  };
  for (size_t i = 0; i < res.entries.size() && i < show && res.entries[i].fits; ++i) line(i, res.entries[i]);
  if (fitting < res.entries.size()) {
    std::fprintf(out, "the fastest that do not fit:\n");
    for (size_t i = fitting; i < res.entries.size() && i < fitting + 3; ++i) line(i, res.entries[i]);
  }
  if (fitting == 0) std::fprintf(out, "nothing fits: more ranks, more device memory, or a smaller model\n");
  std::fprintf(out, "TFLOP/s: model FLOPs per device (Megatron's count, no recomputation); MFU against the %.1f "
               "TFLOP/s peak. Memory is the estimator's (exact); time is the model of docs/planning.md.\n",
               c.rates.device.flops.value / 1e12);
  std::fprintf(out, "Levers: zero3 across nodes also with %s (lossy qwZ/qgZ only when given: --zeropp, "
               "--quantize-*); %s\n", c.zeropp.any() ? c.zeropp.label().c_str() : "no ZeRO++ lever",
               c.pins.offload ? "offload as pinned"
                              : fmt::format("offload ranked as if {:.0f}% slower (taken where nothing else fits or "
                                            "where it is that much faster; --offload pins it)",
                                            100 * (c.offload_rank_factor - 1)).c_str());
  std::fflush(out);
}

}  // namespace shardlab
