// profile.cpp — the memory profile in three parts: predict every row (the meta backend, fast for
// any world size), measure the rows that ran (--measure), and assemble the report.
#include "src/compare/profile.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "src/comm/mesh.hpp"
#include "src/compare/memory_row.hpp"
#include "src/comm/sim_comm.hpp"
#include "src/model/family.hpp"
#include "src/train/predict.hpp"

namespace shardlab {
namespace {

// A row of the report: a strategy as seen from one rank (DP's rank 0 differs from its replicas;
// under --pp each stage differs: its units, and the micro-batches its schedule keeps in flight).
struct RowSpec {
  std::string label;
  StrategyKind kind;
  int rank;
  int stage = 0;
};

int pp_of(const ProfileConfig& cfg) { return cfg.train.layout.dims.pp; }

// The world rank of pipeline stage k's first rank (its data- and tensor-parallel ranks are alike).
int stage_rank(const ProfileConfig& cfg, int k) {
  MeshCoord c;
  c.pp = k;
  return mesh_rank(cfg.train.layout.dims.resolved(cfg.world), c);
}

// "0-16" or, with virtual stages (several chunks per rank), "0-8,17-24": the units a stage holds, in model order.
std::string unit_ranges(const StageSplit& split, int stage) {
  std::string out;
  for (int c : split.chunks_of(stage))
    out += fmt::format("{}{}-{}", out.empty() ? "" : ",", split.begin(c), split.begin(c) + split.count(c) - 1);
  return out;
}

// The run's configuration under one strategy.
TrainConfig config_for(const ProfileConfig& cfg, StrategyKind kind) {
  TrainConfig t = cfg.train;
  t.use_strategy(kind);
  if (cfg.budget && t.strategy.prefetch == kPrefetchAuto)  // as train resolves it on this budget (rank 0's)
    t.strategy.prefetch = auto_prefetch(t, cfg.world, 0, cfg.micro_batch, PoolConfig{cfg.budget, cfg.host_budget});
  return t;
}

std::string row_label(const ProfileConfig& cfg, StrategyKind kind) {
  TrainConfig t = cfg.train;
  t.use_strategy(kind);
  return t.label();
}

std::vector<RowSpec> row_specs(const ProfileConfig& cfg) {
  std::vector<RowSpec> rows;
  for (StrategyKind s : cfg.strategies) {
    if (pp_of(cfg) > 1) {
      for (int k = 0; k < pp_of(cfg); ++k)
        rows.push_back({fmt::format("{} stage {}", row_label(cfg, s), k), s, stage_rank(cfg, k), k});
    } else if (s == StrategyKind::dp && cfg.world > 1) {
      rows.push_back({"dp rank 0", s, 0});
      rows.push_back({"dp others", s, 1});
    } else {
      rows.push_back({row_label(cfg, s), s, 0});
    }
  }
  return rows;
}

bool fits(const ProfileConfig& cfg, const Estimate& e) {
  return e.peak <= cfg.budget && (cfg.host_budget == 0 || e.host.peak <= cfg.host_budget);
}

// The most any rank needs: rank 0's at --pp 1 (the strategies the search tries treat their ranks
// alike), the largest stage's peaks otherwise.
Estimate predict_worst(const TrainConfig& t, const ProfileConfig& cfg, int64_t micro_batch) {
  Estimate worst = predict_step(t, cfg.world, 0, micro_batch, false);
  for (int k = 1; k < pp_of(cfg); ++k) {
    Estimate e = predict_step(t, cfg.world, stage_rank(cfg, k), micro_batch, false);
    if (e.peak > worst.peak) std::swap(worst.peak, e.peak);
    if (e.host.peak > worst.host.peak) std::swap(worst.host.peak, e.host.peak);
  }
  return worst;
}

// The cheapest combination of levers that fits the budgets, trying them in order of cost: shard
// more first (ddp -> zero1 -> zero2 -> zero3: the same traffic, or 1.5x for zero3, and overlapped),
// then recompute (attention, a few percent; blocks, one more forward), then offload (the
// optimizer, then the parameters: host-link traffic every step). Only when nothing fits at the
// requested micro-batch does a smaller one (with accumulation, the same sequences per step) count.
std::optional<LeverChoice> cheapest_levers(const ProfileConfig& cfg) {
  for (int64_t mb = cfg.micro_batch; mb >= 1; mb = mb == 1 ? 0 : (mb + 1) / 2)
    for (Offload off : {Offload::none, Offload::optimizer, Offload::params})
      for (Checkpointing ck : checkpointing_choices(cfg.train.spec))
        for (StrategyKind k : cfg.strategies) {
          if (k == StrategyKind::dp || offload_for(k, off) != off) continue;
          TrainConfig t = cfg.train;
          t.use_strategy(k);
          t.strategy.offload = off;
          t.checkpointing = ck;
          Estimate e = predict_worst(t, cfg, mb);
          if (!fits(cfg, e)) continue;
          return LeverChoice{strategy_name(k), checkpointing_name(ck), offload_name(off), mb,
                             (cfg.micro_batch + mb - 1) / mb * t.accum, e.peak, e.host.peak};
        }
  return std::nullopt;
}

// The largest micro-batch whose predicted peak fits the budget (0 if even one does not).
int64_t largest_fitting(const ProfileConfig& cfg, const RowSpec& r) {
  auto fits = [&](int64_t mb) { return shardlab::fits(cfg, predict(cfg, r.kind, r.rank, mb, false)); };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 2;
  while (hi <= (1 << 16) && fits(hi)) lo = hi, hi *= 2;
  if (hi > (1 << 16)) return lo;
  while (hi - lo > 1) {
    int64_t mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

// --optimizer muon: each row's optimizer state and model states beside AdamW's in the same layout
// (one note per row: Muon keeps one buffer per matrix element, AdamW two).
std::vector<std::string> muon_savings(const ProfileConfig& cfg, const std::vector<RowSpec>& specs,
                                      const std::vector<MemoryRow>& rows) {
  std::vector<std::string> notes;
  const auto mib = [](uint64_t b) { return static_cast<double>(b) / (1 << 20); };
  for (size_t i = 0; i < specs.size(); ++i) {
    TrainConfig adamw = config_for(cfg, specs[i].kind);
    adamw.optim.kind = OptimizerKind::adamw;
    const Estimate a = predict_step(adamw, cfg.world, specs[i].rank, cfg.micro_batch, false);
    const Estimate& m = rows[i].predicted;
    const uint64_t ms = m.model_states[static_cast<size_t>(Category::optim_state)],
                   as = a.model_states[static_cast<size_t>(Category::optim_state)];
    notes.push_back(fmt::format("{}: muon's optimizer state {:.2f} MiB against AdamW's {:.2f} ({:+.1f}%); model "
                                "states {:.2f} against {:.2f} MiB; peak {:.2f} against {:.2f} MiB", specs[i].label,
                                mib(ms), mib(as), as ? 100.0 * (double(ms) - double(as)) / double(as) : 0.0,
                                mib(m.model_state_total()), mib(a.model_state_total()), mib(m.peak), mib(a.peak)));
  }
  return notes;
}

MemoryRow predicted_row(const ProfileConfig& cfg, const RowSpec& r) {
  MemoryRow row;
  row.label = r.label;
  row.stage = r.stage;
  row.baseline = r.kind == StrategyKind::ddp ? Baseline::ddp
                 : r.kind == StrategyKind::dp && r.rank == 0 ? Baseline::dp
                                                             : Baseline::none;
  row.predicted = predict(cfg, r.kind, r.rank, cfg.micro_batch);
  row.predicted_eval_peak = predict_eval(config_for(cfg, r.kind), cfg.world, r.rank, cfg.micro_batch).peak;
  if (cfg.budget) {
    row.fits = fits(cfg, row.predicted);
    row.max_micro_batch = largest_fitting(cfg, r);
  }
  return row;
}

// A measured step's figures, as plain numbers that travel between ranks: six category arrays
// (device states, at peak, peaks; the same for the host), the two totals and the phase.
constexpr size_t K = kNumCategories, kPacked = 6 * K + 4;
std::array<uint64_t, kPacked> pack(const MemoryRow& m) {
  std::array<uint64_t, kPacked> b{};
  const CategoryBytes* arrays[6] = {&m.measured_states,         &m.measured_at_peak,     &m.measured_peak_by_category,
                                    &m.measured_host.model_states, &m.measured_host.at_peak, &m.measured_host.peak_by_category};
  for (size_t a = 0; a < 6; ++a) std::copy(arrays[a]->begin(), arrays[a]->end(), b.begin() + a * K);
  b[6 * K] = m.measured_peak;
  b[6 * K + 1] = m.measured_host.peak;
  b[6 * K + 2] = static_cast<uint64_t>(m.measured_phase.kind);
  b[6 * K + 3] = static_cast<uint64_t>(static_cast<int64_t>(m.measured_phase.unit));
  return b;
}
void unpack(const uint64_t* b, MemoryRow& row) {
  row.measured = true;
  CategoryBytes* arrays[6] = {&row.measured_states,         &row.measured_at_peak,     &row.measured_peak_by_category,
                              &row.measured_host.model_states, &row.measured_host.at_peak, &row.measured_host.peak_by_category};
  for (size_t a = 0; a < 6; ++a) std::copy(b + a * K, b + (a + 1) * K, arrays[a]->begin());
  row.measured_peak = b[6 * K];
  row.measured_host.peak = b[6 * K + 1];
  row.measured_phase = {static_cast<PhaseKind>(b[6 * K + 2]), static_cast<int>(static_cast<int64_t>(b[6 * K + 3]))};
}

// Runs a few real steps of `kind` as `rank` of cfg.world over `comm` and reads the ledger.
MemoryRow measure_on(Backend& be, Pool& pool, Communicator& comm, const ProfileConfig& cfg, StrategyKind kind) {
  TrainConfig tc = config_for(cfg, kind);
  tc.batch = cfg.micro_batch * tc.accum * tc.layout.dims.resolved(cfg.world).dp();
  tc.steps = cfg.measure_steps;
  tc.log_path.clear();
  tc.save_path.clear();
  tc.record_step = true;
  Trainer t(be, pool, comm, tc);
  for (int64_t k = 0; k < tc.steps; ++k) t.step(k);
  return memory_row(t, "");
}

// Fills the measured fields of the rows of one strategy. One process: it plays each row's rank
// through sim. Real ranks: one run; rank 0 keeps its own figures and receives rank 1's for DP.
void measure_strategy(Backend& be, const ProcessGroup& group, const ProfileConfig& cfg,
                      const std::vector<RowSpec>& specs, std::vector<MemoryRow>& rows, StrategyKind kind) {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind != kind) continue;
    if (group.size == 1) {
      Pool pool(be, cfg.pools);
      auto comm = make_sim_communicator(specs[i].rank, cfg.world, pool, sim_transport(cfg.train.comm));
      MemoryRow m = measure_on(be, pool, *comm, cfg, kind);
      rows[i].take_measurement(m);
      continue;
    }
    if (specs[i].rank != 0) continue;  // filled below from the same run
    Pool pool(be, cfg.pools);
    auto comm = group.connect(pool);
    MemoryRow m = measure_on(be, pool, *comm, cfg, kind);
    rows[i].take_measurement(m);
    // The strategy's other rows (DP's replicas, the later pipeline stages) are other ranks' runs.
    bool others = false;
    for (const RowSpec& o : specs) others |= o.kind == kind && o.rank != 0;
    if (!others) continue;
    std::vector<uint64_t> all = comm->gather_u64(pack(m));
    if (group.rank != 0) continue;
    for (size_t j = 0; j < specs.size(); ++j)
      if (specs[j].kind == kind && specs[j].rank != 0)
        unpack(all.data() + static_cast<size_t>(specs[j].rank) * kPacked, rows[j]);
  }
}

std::string title_of(const ProfileConfig& cfg) {
  const auto& t = cfg.train;
  std::string levers;
  if (t.checkpointing != Checkpointing::none) levers += fmt::format(", activation checkpointing {}", checkpointing_name(t.checkpointing));
  if (t.strategy.offload != Offload::none) levers += fmt::format(", offload {} (where the strategy allows)", offload_name(t.strategy.offload));
  if (pp_of(cfg) > 1)
    levers += fmt::format(", pp {} {}{} (accum = micro-batches per step)", pp_of(cfg), t.layout.pipeline.schedule.name(),
                          t.layout.pipeline.virtual_stages > 1 ? fmt::format(" V {}", t.layout.pipeline.virtual_stages) : "");
  return fmt::format("{}, world {}, micro-batch {} x {} tokens, accum {}, params {}, grads {}, {}{}", t.spec.describe(),
                     cfg.world, cfg.micro_batch, t.spec.seq, t.accum, dtype_name(t.strategy.precision.param_dtype),
                     dtype_name(t.strategy.precision.reduce_dtype), optimizer_name(t.optim.kind), levers);
}

std::string config_json(const ProfileConfig& cfg) {
  const auto& t = cfg.train;
  nlohmann::json c = {{"model", spec_to_json(t.spec)},
                      {"world", cfg.world},
                      {"micro_batch", cfg.micro_batch},
                      {"accum", t.accum},
                      {"param_dtype", dtype_name(t.strategy.precision.param_dtype)},
                      {"reduce_dtype", dtype_name(t.strategy.precision.reduce_dtype)},
                      {"optimizer", optimizer_name(t.optim.kind)},
                      {"prefetch", t.strategy.prefetch == kPrefetchAuto ? nlohmann::json("auto") : nlohmann::json(t.strategy.prefetch)},
                      {"bucket_mb", t.strategy.bucket_mb},
                      {"activation_checkpointing", checkpointing_name(t.checkpointing)},
                      {"offload", offload_name(t.strategy.offload)},
                      {"host_budget_bytes", cfg.host_budget},
                      {"measured", cfg.measure}};
  if (pp_of(cfg) > 1) {
    const StageSplit split = stage_split(t.spec, t.layout);
    nlohmann::json stages = nlohmann::json::array();
    for (int k = 0; k < split.pp; ++k) stages.push_back(split.units_of(k));
    c["pipeline"] = {{"pp", split.pp},
                     {"schedule", t.layout.pipeline.schedule.name()},
                     {"virtual_stages", split.virtual_stages},
                     {"micro_batches", t.accum},
                     {"stage_units", stages}};
  }
  return c.dump();
}

void validate(const ProfileConfig& cfg, const ProcessGroup& group) {
  SHARD_REQUIRE(cfg.world >= 1, "--world {}: expected at least one rank", cfg.world);
  SHARD_REQUIRE(cfg.micro_batch >= 1, "--micro-batch {}: expected at least one sequence", cfg.micro_batch);
  SHARD_REQUIRE(!cfg.strategies.empty(), "--strategies: name at least one strategy");
  SHARD_REQUIRE(cfg.host_budget == 0 || cfg.budget > 0, "--host-memory needs --device-memory (the device tier's)");
  cfg.train.spec.validate();
  {  // each row applies what its strategy allows
    StepConfig z = cfg.train;
    z.use_strategy(StrategyKind::zero3);
    z.validate_strategy();
  }
  SHARD_REQUIRE(pp_of(cfg) == 1 || std::find(cfg.strategies.begin(), cfg.strategies.end(), StrategyKind::dp) ==
                                       cfg.strategies.end(),
                "--strategies with dp and --pp {}: dp, the single-master baseline, takes no pipeline; leave it out",
                pp_of(cfg));
  SHARD_REQUIRE(!cfg.measure || group.size == 1 || group.size == cfg.world,
                "--measure with {} processes: start 1 (the sim communicator stands in for the others) or --world {}",
                group.size, cfg.world);
  // The sim communicator stands in for collectives, not for a neighbour stage's activations: a
  // stage measured alone would compute on what no stage sent.
  SHARD_REQUIRE(!cfg.measure || pp_of(cfg) == 1 || group.size == cfg.world,
                "--measure with --pp {} and {} process: start --nproc {} (every stage runs)", pp_of(cfg), group.size,
                cfg.world);
}

// One line per stage: the units it holds (by name) and the micro-batches its schedule keeps in flight.
std::vector<std::string> stage_notes(const ProfileConfig& cfg, const std::vector<std::string>& names) {
  const TrainConfig& t = cfg.train;
  const StageSplit split = stage_split(t.spec, t.layout);
  const PipeSchedule sched =
      build_schedule(t.layout.pipeline.schedule, split.pp, split.virtual_stages, static_cast<int>(t.accum));
  std::vector<std::string> notes;
  for (int k = 0; k < split.pp; ++k) {
    std::string held;
    for (int c : split.chunks_of(k))
      held += fmt::format("{}{} .. {}", held.empty() ? "" : ", ", names[static_cast<size_t>(split.begin(c))],
                          names[static_cast<size_t>(split.begin(c) + split.count(c) - 1)]);
    std::string flight =
        split.virtual_stages == 1
            ? fmt::format("up to {} of {} micro-batches in flight", sched.in_flight(k), t.accum)
            : fmt::format("up to {} of {} (micro-batch, chunk) activations in flight", sched.in_flight(k),
                          t.accum * split.virtual_stages);
    if (sched.kind->splits_backward)  // zero-bubble: B done, W not yet
      flight += fmt::format(", up to {} owing their weight gradients", sched.weights_owed(k));
    notes.push_back(fmt::format("stage {} (ranks with pp coordinate {}, e.g. rank {}): units {} ({}); {}", k, k,
                                stage_rank(cfg, k), unit_ranges(split, k), held, flight));
  }
  return notes;
}

// The runtime names a unit in a phase by its index on the rank, which under --pp is an index into
// the stage's units; the report names units of the model.
void to_model_units(MemoryRow& row, const std::vector<int>& units) {
  auto fix = [&](Phase& p) {
    if (p.unit >= 0 && static_cast<size_t>(p.unit) < units.size()) p.unit = units[static_cast<size_t>(p.unit)];
  };
  fix(row.predicted.peak_phase);
  for (EstimatePoint& e : row.predicted.timeline) fix(e.phase);
  fix(row.measured_phase);
  for (LedgerEvent& e : row.measured_timeline) fix(e.phase);
}

}  // namespace

Estimate predict(const ProfileConfig& cfg, StrategyKind strategy, int rank, int64_t micro_batch, bool timeline) {
  return predict_step(config_for(cfg, strategy), cfg.world, rank, micro_batch, timeline);
}

MemoryReport run_profile(Backend& be, const ProcessGroup& group, const ProfileConfig& cfg) {
  validate(cfg, group);
  MemoryReport r;
  r.budget = cfg.budget;
  r.title = title_of(cfg);
  r.config_json = config_json(cfg);
  r.unit_names = family_of(cfg.train.spec).unit_names(cfg.train.spec);
  if (pp_of(cfg) > 1) r.notes = stage_notes(cfg, r.unit_names);
  const std::vector<RowSpec> specs = row_specs(cfg);
  for (const RowSpec& s : specs) r.rows.push_back(predicted_row(cfg, s));
  if (cfg.train.optim.kind == OptimizerKind::muon)
    for (std::string& n : muon_savings(cfg, specs, r.rows)) r.notes.push_back(std::move(n));
  r.host_budget = cfg.host_budget;
  if (cfg.budget) {
    r.levers_searched = true;
    r.levers = cheapest_levers(cfg);
  }
  if (cfg.measure) {
    for (StrategyKind k : cfg.strategies) measure_strategy(be, group, cfg, specs, r.rows, k);
    r.outside_pool = be.device_memory().outside_pool();
  }
  if (pp_of(cfg) > 1) {
    const StageSplit split = stage_split(cfg.train.spec, cfg.train.layout);
    for (MemoryRow& row : r.rows) to_model_units(row, split.units_of(row.stage));
  }
  return r;
}

}  // namespace shardlab
