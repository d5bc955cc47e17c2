// profile.cpp — the memory profile in three parts: predict every row (the meta backend, fast for
// any world size), measure the rows that ran (--measure), and assemble the report.
#include "src/train/profile.hpp"

#include <nlohmann/json.hpp>

#include "src/comm/sim_comm.hpp"
#include "src/model/family.hpp"
#include "src/train/predict.hpp"

namespace shardlab {
namespace {

// A row of the report: a strategy as seen from one rank (DP's rank 0 differs from its replicas).
struct RowSpec {
  std::string label;
  StrategyKind kind;
  int rank;
};

// The run's configuration under one strategy.
TrainConfig config_for(const ProfileConfig& cfg, StrategyKind kind) {
  TrainConfig t = cfg.train;
  t.strategy = t.strategy.under(kind);
  return t;
}

std::string row_label(const ProfileConfig& cfg, StrategyKind kind) {
  return cfg.train.strategy.under(kind).label();
}

std::vector<RowSpec> row_specs(const ProfileConfig& cfg) {
  std::vector<RowSpec> rows;
  for (StrategyKind s : cfg.strategies) {
    if (s == StrategyKind::dp && cfg.world > 1) {
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
          t.strategy = t.strategy.under(k);
          t.strategy.offload = off;
          t.checkpointing = ck;
          Estimate e = predict_step(t, cfg.world, 0, mb, false);
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

MemoryRow predicted_row(const ProfileConfig& cfg, const RowSpec& r) {
  MemoryRow row;
  row.label = r.label;
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
  tc.batch = cfg.micro_batch * tc.accum * tc.strategy.dims.resolved(cfg.world).dp();
  tc.steps = cfg.measure_steps;
  tc.log_path.clear();
  tc.save_path.clear();
  tc.record_step = true;
  Trainer t(be, pool, comm, tc);
  for (int64_t k = 0; k < tc.steps; ++k) t.step(k);
  return t.memory_row("");
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
    if (kind != StrategyKind::dp || cfg.world == 1) continue;
    std::vector<uint64_t> all = comm->gather_u64(pack(m));
    if (group.rank == 0 && i + 1 < specs.size() && specs[i + 1].rank == 1) unpack(all.data() + kPacked, rows[i + 1]);
  }
}

std::string title_of(const ProfileConfig& cfg) {
  const auto& t = cfg.train;
  std::string levers;
  if (t.checkpointing != Checkpointing::none) levers += fmt::format(", activation checkpointing {}", checkpointing_name(t.checkpointing));
  if (t.strategy.offload != Offload::none) levers += fmt::format(", offload {} (where the strategy allows)", offload_name(t.strategy.offload));
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
                      {"prefetch", t.strategy.prefetch},
                      {"bucket_mb", t.strategy.bucket_mb},
                      {"activation_checkpointing", checkpointing_name(t.checkpointing)},
                      {"offload", offload_name(t.strategy.offload)},
                      {"host_budget_bytes", cfg.host_budget},
                      {"measured", cfg.measure}};
  return c.dump();
}

void validate(const ProfileConfig& cfg, const ProcessGroup& group) {
  SHARD_REQUIRE(cfg.world >= 1, "--world {}: expected at least one rank", cfg.world);
  SHARD_REQUIRE(cfg.micro_batch >= 1, "--micro-batch {}: expected at least one sequence", cfg.micro_batch);
  SHARD_REQUIRE(!cfg.strategies.empty(), "--strategies: name at least one strategy");
  SHARD_REQUIRE(cfg.host_budget == 0 || cfg.budget > 0, "--host-memory needs --device-memory (the device tier's)");
  cfg.train.spec.validate();
  cfg.train.strategy.under(StrategyKind::zero3).validate();  // each row applies what its strategy allows
  SHARD_REQUIRE(!cfg.measure || group.size == 1 || group.size == cfg.world,
                "--measure with {} processes: start 1 (the sim communicator stands in for the others) or --world {}",
                group.size, cfg.world);
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
  const std::vector<RowSpec> specs = row_specs(cfg);
  for (const RowSpec& s : specs) r.rows.push_back(predicted_row(cfg, s));
  r.host_budget = cfg.host_budget;
  if (cfg.budget) {
    r.levers_searched = true;
    r.levers = cheapest_levers(cfg);
  }
  if (cfg.measure) {
    for (StrategyKind k : cfg.strategies) measure_strategy(be, group, cfg, specs, r.rows, k);
    r.outside_pool = be.device_memory().outside_pool();
  }
  return r;
}

}  // namespace shardlab
