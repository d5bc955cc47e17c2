// Strategy parity under mpirun (N = 1..4, and 3 for uneven shards): every strategy trains the tiny
// model for 10 AdamW steps from the same seed and must give the per-step losses and the final
// parameters of single-rank training on the same global batch. Also: ZeRO-3's reduced gradient
// shards equal DDP's gradient, a late rank changes nothing, gradient accumulation matches, and
// the headline: a model that does not fit one rank's budget under DDP trains under ZeRO-3.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "src/comm/mpi_comm.hpp"
#include "src/comm/sim_comm.hpp"
#include "src/model/gpt2/gpt2.hpp"
#include "src/model/model.hpp"
#include "src/train/compare.hpp"
#include "src/train/predict.hpp"
#include "src/train/profile.hpp"
#include "src/train/trainer.hpp"
#include "tests/mpi_test_env.hpp"

using namespace shardlab;
using shardlab::test::g_mpi;

namespace {

struct RunOut {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;  // per unit, gathered
  std::vector<double> comm_bytes;          // per step, this rank
};

TrainConfig parity_config(StrategyKind strategy, int world) {
  TrainConfig cfg;
  cfg.spec = model_preset("tiny");
  cfg.strategy.kind = strategy;
  cfg.steps = 10;
  cfg.batch = 12 % world == 0 ? 12 : 2 * world;
  cfg.schedule.lr = 1e-3f;
  cfg.schedule.warmup_steps = 2;
  cfg.seed = 4242;
  return cfg;
}

ProcessGroup world_group() {
  return {g_mpi->rank(), g_mpi->world(), [](Pool& pool) { return test::test_communicator(pool); }};
}

RunOut train(Communicator& comm, Pool& pool, const TrainConfig& cfg) {
  Trainer t(pool.backend(), pool, comm, cfg);
  RunOut out;
  for (int64_t s = 0; s < cfg.steps; ++s) {
    StepStats st = t.step(s);
    out.losses.push_back(st.loss);
    out.comm_bytes.push_back(st.comm_bytes);
  }
  for (size_t u = 0; u < t.units().size(); ++u) out.params.push_back(t.strategy().gather_unit_params(u));
  return out;
}

// Single-rank training on this process (every rank computes the same reference), on the test's
// device.
RunOut reference(const TrainConfig& cfg) {
  auto be = test::test_backend();
  Pool pool(*be);
  auto comm = make_sim_communicator(0, 1, pool);
  TrainConfig c = cfg;
  c.strategy = c.strategy.under(StrategyKind::ddp);  // without what only ZeRO takes (shard groups, offload)
  return train(*comm, pool, c);
}

// N ranks over the test's transport (mpi unless $SHARDLAB_TEST_COMM says otherwise).
RunOut train_mpi(const TrainConfig& cfg, uint64_t budget = 0) {
  auto be = test::test_backend();
  Pool pool(*be, PoolConfig{budget});
  auto comm = test::test_communicator(pool);
  TrainConfig c = cfg;
  c.comm = test::test_comm();
  return train(*comm, pool, c);
}

// Losses: relative difference <= 1e-5 per step. Parameters: |difference| <= 2e-5 (10 AdamW steps
// of lr 1e-3 on f32 values whose gradients were summed in a different order).
// Local only (no collective): CHECK, never REQUIRE, so a failing rank stays in step with the others.
void check_parity(const RunOut& got, const RunOut& want, const std::string& what) {
  CHECK(got.losses.size() == want.losses.size());
  CHECK(got.params.size() == want.params.size());
  double worst_loss = 0, worst_param = 0;
  for (size_t i = 0; i < got.losses.size() && i < want.losses.size(); ++i)
    worst_loss = std::max(worst_loss, double(std::fabs(got.losses[i] - want.losses[i]) / std::fabs(want.losses[i])));
  for (size_t u = 0; u < got.params.size() && u < want.params.size(); ++u)
    for (size_t i = 0; i < got.params[u].size() && i < want.params[u].size(); ++i)
      worst_param = std::max(worst_param, double(std::fabs(got.params[u][i] - want.params[u][i])));
  if (g_mpi->rank() == 0)
    std::printf("parity %-22s world %d: max loss rel diff %.2e, max param abs diff %.2e\n", what.c_str(),
                g_mpi->world(), worst_loss, worst_param);
  CHECK(worst_loss <= 1e-5);
  CHECK(worst_param <= 2e-5);
}

}  // namespace

TEST_CASE("every strategy matches single-rank training", "[strategies][transport]") {
  for (StrategyKind s : all_strategies()) {
    TrainConfig cfg = parity_config(s, g_mpi->world());
    RunOut want = reference(cfg);
    RunOut got = train_mpi(cfg);
    check_parity(got, want, strategy_name(s));
  }
}

TEST_CASE("gradient accumulation matches, and ddp/zero1 communicate only on the last micro-step", "[strategies]") {
  for (StrategyKind s : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3}) {
    TrainConfig cfg = parity_config(s, g_mpi->world());
    cfg.steps = 4;
    cfg.batch = 4 * g_mpi->world();
    RunOut one = train_mpi(cfg);
    cfg.accum = 2;
    RunOut two = train_mpi(cfg);
    TrainConfig ref_cfg = cfg;
    check_parity(two, reference(ref_cfg), std::string(strategy_name(s)) + " accum 2");
    if (s == StrategyKind::ddp || s == StrategyKind::zero1)
      CHECK(two.comm_bytes[1] == Approx(one.comm_bytes[1]));
    else if (g_mpi->world() > 1)
      CHECK(two.comm_bytes[1] > one.comm_bytes[1]);  // zero2/3 reduce every micro-step
  }
}

TEST_CASE("ZeRO-3's reduced gradient shards, concatenated, equal DDP's gradient", "[strategies]") {
  auto grads_after_backward = [](StrategyKind s) {
    TrainConfig cfg = parity_config(s, g_mpi->world());
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
    Trainer t(*be, pool, *comm, cfg);
    t.step(0);  // one full step: the gradients it leaves are those of step 0's batch
    std::vector<std::vector<float>> g;
    for (size_t u = 0; u < t.units().size(); ++u) g.push_back(t.strategy().gather_unit_grads(u));
    return g;
  };
  auto ddp = grads_after_backward(StrategyKind::ddp), z3 = grads_after_backward(StrategyKind::zero3);
  double worst = 0;
  for (size_t u = 0; u < ddp.size(); ++u) {
    REQUIRE(ddp[u].size() == z3[u].size());
    for (size_t i = 0; i < ddp[u].size(); ++i) worst = std::max(worst, double(std::fabs(ddp[u][i] - z3[u][i])));
  }
  if (g_mpi->rank() == 0) std::printf("zero3 vs ddp gradients, world %d: max abs diff %.2e\n", g_mpi->world(), worst);
  CHECK(worst <= 1e-6);  // the same sums in a different order
}

namespace {
// Delays the last rank before every collective: a missing wait or a buffer reused too early
// shows up as a different result.
class LateRank final : public Communicator {
 public:
  explicit LateRank(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string name() const override { return "late-rank(" + inner_->name() + ")"; }

 protected:
  Work do_all_reduce(Tensor b, ReduceOp op) override { return late(), inner_->all_reduce(b, op); }
  Work do_reduce_scatter(Tensor s, Tensor r, ReduceOp op) override { return late(), inner_->reduce_scatter(s, r, op); }
  Work do_all_gather(Tensor s, Tensor r) override { return late(), inner_->all_gather(s, r); }
  Work do_broadcast(Tensor b, int root) override { return late(), inner_->broadcast(b, root); }
  Work do_reduce(Tensor s, Tensor r, int root, ReduceOp op) override { return late(), inner_->reduce(s, r, root, op); }
  Work do_gather(Tensor s, Tensor r, int root) override { return late(), inner_->gather(s, r, root); }
  Work do_scatter(Tensor s, Tensor r, int root) override { return late(), inner_->scatter(s, r, root); }
  Work do_barrier() override { return late(), inner_->barrier(); }
  std::vector<std::string> exchange(const std::string& mine) override { return inner_->all_gather_strings(mine); }
  std::unique_ptr<Communicator> do_split(int color, int key, int size, int rank) override {
    return std::make_unique<LateRank>(inner_->split(color, key, size, rank, CommLink::world));
  }

 private:
  void late() const {
    if (rank() == world_size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::unique_ptr<Communicator> inner_;
};
}  // namespace

TEST_CASE("a rank that arrives late at every collective changes nothing", "[strategies]") {
  for (StrategyKind s : all_strategies()) {
    TrainConfig cfg = parity_config(s, g_mpi->world());
    cfg.steps = 3;
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    LateRank comm(make_mpi_communicator(MPI_COMM_WORLD, pool));
    RunOut late = train(comm, pool, cfg);
    RunOut on_time = train_mpi(cfg);
    CHECK(late.losses == on_time.losses);  // bit for bit: the same operations in the same order
    CHECK(late.params == on_time.params);
  }
}

// Registered in CTest only at 4 ranks (strategies_headline_np4; the np1-3 runs exclude [headline]).
TEST_CASE("too big for one rank under DDP, trains under ZeRO-3 with the same budget", "[headline]") {
  REQUIRE(g_mpi->world() == 4);
  const uint64_t budget = 12ull << 20;  // 12 MiB per rank
  TrainConfig cfg = parity_config(StrategyKind::ddp, 4);
  cfg.spec = model_preset("small");  // 0.84M parameters: 16 bytes each is 13.5 MB of model state
  cfg.spec.seq = 32;
  cfg.batch = 8;
  cfg.steps = 4;
  std::string message;
  try {
    train_mpi(cfg, budget);
  } catch (const OutOfMemory& e) {
    message = e.what();
  }
  if (g_mpi->rank() == 0) std::printf("ddp under a 12 MiB budget: %s\n", message.substr(0, message.find('\n')).c_str());
  CHECK_THAT(message, Catch::Contains("out of memory: cannot allocate"));
  CHECK_THAT(message, Catch::Contains("of the 12.00 MiB budget in use"));

  cfg.strategy.kind = StrategyKind::zero3;
  RunOut tight = train_mpi(cfg, budget);
  RunOut roomy = train_mpi(cfg, 0);
  CHECK(tight.losses == roomy.losses);
  check_parity(tight, reference(cfg), "zero3 in 12 MiB");

  // Model state per rank, measured by the ledger right after set-up.
  auto model_state = [&](StrategyKind s) {
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
    TrainConfig c = cfg;
    c.strategy.kind = s;
    Trainer t(*be, pool, *comm, c);
    const Ledger& L = pool.ledger();
    uint64_t bytes = 0;
    for (Category k : {Category::param_full, Category::param_shard, Category::grad_full, Category::grad_shard,
                       Category::master_weights, Category::optim_state})
      bytes += L.current(k);
    return std::pair<uint64_t, int64_t>{bytes, t.num_params()};
  };
  auto [ddp_bytes, n_params] = model_state(StrategyKind::ddp);
  auto [z3_bytes, n2] = model_state(StrategyKind::zero3);
  const double padding = 16.0 * 4 * 6 / 4;  // at most world-1 padding elements per unit, 16 bytes each, over 4 ranks
  if (g_mpi->rank() == 0)
    std::printf("model state per rank: ddp %llu bytes (16 x %lld params), zero3 %llu bytes = 1/%.3f of ddp\n",
                static_cast<unsigned long long>(ddp_bytes), static_cast<long long>(n_params),
                static_cast<unsigned long long>(z3_bytes), double(ddp_bytes) / z3_bytes);
  CHECK(ddp_bytes == 16ull * static_cast<uint64_t>(n_params));
  CHECK(double(z3_bytes) <= ddp_bytes / 4.0 * 1.01 + padding);
  CHECK(double(z3_bytes) >= ddp_bytes / 4.0);
}

TEST_CASE("measured communication per step matches each strategy's pattern", "[strategies][compare]") {
  CompareConfig cc;
  cc.train = parity_config(StrategyKind::ddp, g_mpi->world());
  cc.train.steps = 2;
  std::FILE* sink = std::fopen("/dev/null", "w");
  auto be = make_cpu_backend(BackendConfig{1});
  CompareResult r = run_compare(*be, world_group(), cc, sink);
  std::fclose(sink);
  CHECK(r.agree);
  const int N = g_mpi->world();
  const double f = (N - 1.0) / N;
  auto layout = gpt2_layout(cc.train.spec);
  double psi = 0, pad_all = 0, pad_blocks = 0;
  for (const auto& u : layout) {
    psi += u.numel;
    pad_all += make_flat_param(u, N, 0).padded;
  }
  for (size_t u = 1; u + 1 < layout.size(); ++u) pad_blocks += make_flat_param(layout[u], N, 0).padded;
  const double pad_emb = make_flat_param(layout.front(), N, 0).padded, pad_head = make_flat_param(layout.back(), N, 0).padded;
  const double scalar = N > 1 ? 2 * f * 4 : 0;  // one f32 all-reduce (the loss; zero: also the norm)
  const double logits = 4.0 * cc.train.batch * cc.train.spec.seq * cc.train.spec.vocab;
  std::map<std::string, double> want = {
      {"ddp", 2 * f * 4 * psi + scalar},
      {"zero1", 2 * f * 4 * pad_all + 2 * scalar},
      {"zero2", 2 * f * 4 * pad_all + 2 * scalar},
      // zero3: every unit gathered for forward and backward and reduce-scattered once; the head is
      // kept from its forward into its backward; the tied embedding is gathered once more for the head.
      {"zero3", f * 4 * (3 * pad_blocks + 4 * pad_emb + 2 * pad_head) + 2 * scalar},
      {"dp", N > 1 ? 2 * 4 * psi + 2 * f * logits + scalar + 4 : 0.0},
  };
  for (const auto& run : r.runs) {
    INFO(run.name << " world " << N);
    CHECK(run.comm_bytes == Approx(want[run.name]).epsilon(1e-9));
    if (N > 1 && run.name != "zero3") CHECK(run.comm_bytes / run.comm_theory == Approx(1.0).epsilon(0.01));
  }
}

TEST_CASE("bf16 parameters and gradients: ZeRO's memory formulas, exactly, and the same training", "[strategies][bf16]") {
  const int N = g_mpi->world();
  TrainConfig base = parity_config(StrategyKind::ddp, N);
  auto layout = gpt2_layout(base.spec);
  uint64_t psi = 0, psi_pad = 0;
  for (const auto& u : layout) {
    psi += static_cast<uint64_t>(u.numel);
    psi_pad += static_cast<uint64_t>(make_flat_param(u, N, 0).padded);
  }
  // Model states per rank with bf16 params and grads, fp32 master weights and Adam (K = 12):
  // DDP 16 Psi, ZeRO-1 4 Psi + 12 Psi/N, ZeRO-2 2 Psi + 14 Psi/N, ZeRO-3 16 Psi/N (Psi padded to
  // a multiple of N per unit for the sharded strategies); DP 16 Psi on rank 0 and nothing elsewhere.
  const uint64_t P = psi_pad / N;  // one rank's shard of every unit
  std::map<std::string, uint64_t> want = {{"ddp", 16 * psi},
                                          {"zero1", 4 * psi_pad + 12 * P},
                                          {"zero2", 2 * psi_pad + 14 * P},
                                          {"zero3", 16 * P},
                                          {"dp", g_mpi->rank() == 0 ? 16 * psi : 0}};
  RunOut ref = reference(base);  // f32, one rank
  for (StrategyKind kind : all_strategies()) {
    const std::string s = strategy_name(kind);
    TrainConfig cfg = parity_config(kind, N);
    cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = DType::bf16;
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
    Trainer t(*be, pool, *comm, cfg);
    uint64_t state = 0;
    for (Category k : {Category::param_full, Category::param_shard, Category::grad_full, Category::grad_shard,
                       Category::master_weights, Category::optim_state})
      state += pool.ledger().current(k);
    INFO(s << " world " << N);
    CHECK(state == want[s]);
    std::vector<float> losses;
    for (int64_t k = 0; k < cfg.steps; ++k) losses.push_back(t.step(k).loss);
    double worst = 0;
    for (size_t k = 0; k < losses.size(); ++k)
      worst = std::max(worst, std::fabs(double(losses[k]) - ref.losses[k]) / ref.losses[k]);
    if (g_mpi->rank() == 0)
      std::printf("bf16 %-6s world %d: model state %llu bytes; losses within %.1e of f32 single-rank\n", s.c_str(), N,
                  static_cast<unsigned long long>(state), worst);
    CHECK(worst < 1e-4);  // bf16 storage rounds parameters and gradients; 10 steps stay this close
  }
}

namespace {
// Measured (MPI, both tiers) = predicted (meta + sim) for one configuration: model states, peaks,
// composition and phase at the peak, and the step allocation by allocation, on both tiers.
void check_measured_is_predicted(const TrainConfig& base, const std::string& what) {
  const int N = g_mpi->world();
  TrainConfig cfg = base;
  cfg.record_step = true;
  cfg.comm = test::test_comm();  // the prediction holds what this transport holds
  auto be = test::test_backend();
  Pool pool(*be);
  auto comm = test::test_communicator(pool);
  Trainer t(*be, pool, *comm, cfg);
  t.step(0);
  t.step(1);
  Estimate m = t.measured_step();
  Estimate e = predict_step(cfg, N, g_mpi->rank(), cfg.batch / N / cfg.accum);
  INFO(what << " world " << N << " rank " << g_mpi->rank() << ": device peak predicted " << e.peak << " measured "
            << m.peak << ", host peak predicted " << e.host.peak << " measured " << m.host.peak);
  CHECK(m.model_states == e.model_states);
  CHECK(m.peak == e.peak);
  CHECK(m.peak_by_category == e.peak_by_category);
  CHECK(m.at_peak == e.at_peak);
  CHECK(m.peak_phase == e.peak_phase);
  CHECK(m.host == e.host);
  bool same = m.timeline.size() == e.timeline.size();
  for (size_t i = 0; same && i < m.timeline.size(); ++i)
    same = m.timeline[i].live == e.timeline[i].live && m.timeline[i].host_live == e.timeline[i].host_live &&
           m.timeline[i].phase == e.timeline[i].phase;
  CHECK(same);
}

}  // namespace

TEST_CASE("the prediction (meta backend, sim) equals what an MPI run's ledger measures",
          "[strategies][estimator][transport]") {
  const int N = g_mpi->world();
  for (DType dt : {DType::f32, DType::bf16})
    for (StrategyKind s : all_strategies())
      for (int64_t accum : {1, 2}) {
        TrainConfig cfg = parity_config(s, N);
        cfg.batch = 4 * N;
        cfg.accum = accum;
        cfg.steps = 2;
        cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = dt;
        check_measured_is_predicted(cfg, fmt::format("{} {} accum {}", strategy_name(s), dtype_name(dt), accum));
      }
}

TEST_CASE("the predicted validation pass equals what an MPI run's ledger measures", "[strategies][estimator]") {
  const int N = g_mpi->world();
  for (DType dt : {DType::f32, DType::bf16})
    for (StrategyKind s : all_strategies()) {
      TrainConfig cfg = parity_config(s, N);
      cfg.batch = 4 * N;
      cfg.accum = 2;
      cfg.steps = 1;
      cfg.val_fraction = 0.1;
      cfg.val_batches = 2;
      cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = dt;
      auto be = make_cpu_backend(BackendConfig{1});
      Pool pool(*be);
      auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
      Trainer t(*be, pool, *comm, cfg);
      t.step(0);
      t.evaluate();
      Estimate m = t.measured_eval();
      Estimate e = predict_eval(cfg, N, g_mpi->rank(), cfg.batch / N / cfg.accum);
      INFO(strategy_name(s) << " " << dtype_name(dt) << " world " << N << " rank " << g_mpi->rank()
                            << ": validation peak predicted " << e.peak << ", measured " << m.peak);
      CHECK(m.peak == e.peak);
      CHECK(m.at_peak == e.at_peak);
      CHECK(m.peak_by_category == e.peak_by_category);
      CHECK(m.peak_phase == e.peak_phase);
      CHECK(m.peak > m.model_state_total());  // activations were live: the pass ran
    }
}

TEST_CASE("profile --measure: measured equals predicted, with real ranks or the sim communicator", "[profile]") {
  int procs = g_mpi->world();
  ProfileConfig pc;
  pc.train = parity_config(StrategyKind::ddp, 1);
  pc.world = procs == 1 ? 4 : procs;  // one process plays rank 0 (and DP's rank 1) of 4 through sim
  pc.micro_batch = 2;
  pc.measure = true;
  pc.budget = 1 << 20;
  auto be = make_cpu_backend(BackendConfig{1});
  MemoryReport r = run_profile(*be, world_group(), pc);
  if (g_mpi->rank() != 0) return;
  REQUIRE(r.rows.size() == (pc.world > 1 ? 6u : 5u));
  for (const auto& row : r.rows) {
    INFO(row.label << " world " << pc.world << " (" << procs << " processes)");
    CHECK(row.measured);
    CHECK(row.measured_peak == row.predicted.peak);
    CHECK(row.measured_at_peak == row.predicted.at_peak);
    CHECK(row.measured_phase == row.predicted.peak_phase);
    uint64_t states = 0;
    for (uint64_t b : row.measured_states) states += b;
    CHECK(states == row.predicted.model_state_total());
    CHECK(row.fits == (row.predicted.peak <= pc.budget));
    if (row.max_micro_batch > 0) {
      StrategyKind k = parse_strategy(row.label.substr(0, row.label.find(' ')));
      int rank = row.label == "dp others" ? 1 : 0;
      CHECK(predict(pc, k, rank, row.max_micro_batch).peak <= pc.budget);
      CHECK(predict(pc, k, rank, row.max_micro_batch + 1).peak > pc.budget);
    }
  }
  auto j = nlohmann::json::parse(memory_report_json(r));
  CHECK(j["schema"] == "shardlab.profile/2");
  CHECK(j["rows"].size() == r.rows.size());
  CHECK(j["rows"][0]["measured"]["peak"] == r.rows[0].measured_peak);
  std::string html = memory_report_html(r);
  CHECK(html.find("<svg") != std::string::npos);
  CHECK(html.find("<script") == std::string::npos);  // self-contained, nothing to run
  CHECK(html.find("http://") == html.find("http://www.w3.org/2000/svg"));  // no network, only the SVG namespace
  auto trace = nlohmann::json::parse(memory_trace_json(r));
  CHECK(trace["traceEvents"].size() > 10);
}

// ---- Validation: a forward-only pass through the same hooks ----

namespace {

// The validation loss of cfg's model at its initialisation, computed by a single-rank Model
// (an independent path: its own hooks, forward_backward's mean loss) over the same sequences.
double reference_val_loss(const TrainConfig& cfg, int64_t batches) {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  Model model(cfg.spec, *be, pool);
  model.init(cfg.seed);
  TokenStream train = synthetic_stream(cfg.spec.vocab);
  TokenStream val = split_tail(train, cfg.val_fraction);
  const int64_t T = cfg.spec.seq, B = cfg.batch;
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    std::vector<int32_t> in, tgt;
    for (int64_t j = i * B; j < (i + 1) * B; ++j) {  // sequence j is val[j*T : j*T + T + 1]
      in.insert(in.end(), val.tokens.begin() + j * T, val.tokens.begin() + j * T + T);
      tgt.insert(tgt.end(), val.tokens.begin() + j * T + 1, val.tokens.begin() + j * T + T + 1);
    }
    sum += model.forward_backward(Batch{in.data(), tgt.data(), B, T}, 1.f);
  }
  return sum / static_cast<double>(batches);
}

TrainConfig val_config(StrategyKind s, int world) {
  TrainConfig cfg = parity_config(s, world);
  cfg.val_fraction = 0.01;  // 10486 tokens of the synthetic stream: 327 sequences of 32
  cfg.val_batches = 3;
  return cfg;
}

double rel(double a, double b) { return std::fabs(a - b) / std::fabs(b); }

}  // namespace

TEST_CASE("the validation loss is the same under every strategy and equals a single-rank forward", "[strategies][validation]") {
  const int W = g_mpi->world();
  const double want = reference_val_loss(val_config(StrategyKind::ddp, W), 3);
  float trained_ref = 0;
  for (StrategyKind s : all_strategies()) {
    TrainConfig cfg = val_config(s, W);
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
    Trainer t(*be, pool, *comm, cfg);
    CHECK(t.val_batches() == 3);
    const CategoryBytes before = pool.ledger().current_by_category();
    const float at_init = t.evaluate();
    INFO(strategy_name(s) << " at " << W << " ranks: " << at_init << " vs single-rank forward " << want);
    CHECK(rel(at_init, want) <= 1e-6);
    // Nothing is left gathered or allocated by the forward-only pass: ZeRO-3 frees its last unit,
    // DP's replicas drop their copies, no activation survives.
    CHECK(pool.ledger().current_by_category() == before);
    for (int64_t k = 0; k < 3; ++k) t.step(k);
    const float trained = t.evaluate();
    if (s == StrategyKind::dp) trained_ref = trained;
    CHECK(rel(trained, trained_ref) <= 1e-5);  // training itself reorders sums: parity's tolerance
    if (g_mpi->rank() == 0)
      std::printf("validation %-6s world %d: at init %.7f (reference %.7f), after 3 steps %.7f\n", strategy_name(s), W,
                  at_init, want, trained);
  }
}

TEST_CASE("validation touches no parameter, gradient or optimizer state, and frees what it gathers", "[strategies][validation]") {
  const int W = g_mpi->world();
  std::vector<std::pair<StrategyKind, bool>> cases;  // strategy, reshard_after_forward
  for (StrategyKind s : all_strategies()) cases.push_back({s, true});
  cases.push_back({StrategyKind::zero3, false});
  for (auto [s, reshard] : cases) {
    TrainConfig cfg = val_config(s, W);
    cfg.steps = 4;
    cfg.strategy.reshard_after_forward = reshard;
    RunOut plain = train_mpi(cfg);
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
    Trainer t(*be, pool, *comm, cfg);
    RunOut with_val;
    for (int64_t k = 0; k < cfg.steps; ++k) {
      const CategoryBytes before = pool.ledger().current_by_category();
      t.evaluate();
      CHECK(pool.ledger().current_by_category() == before);  // every gathered unit and activation freed
      with_val.losses.push_back(t.step(k).loss);
      t.evaluate();
    }
    for (size_t u = 0; u < t.units().size(); ++u) with_val.params.push_back(t.strategy().gather_unit_params(u));
    INFO(strategy_name(s) << " reshard_after_forward " << reshard);
    CHECK(with_val.losses == plain.losses);  // bit for bit
    CHECK(with_val.params == plain.params);
  }
}

TEST_CASE("shuffled batches are the same global batches at every world size and strategy", "[strategies][shuffle]") {
  for (StrategyKind s : {StrategyKind::dp, StrategyKind::zero3}) {
    TrainConfig cfg = parity_config(s, g_mpi->world());
    cfg.steps = 4;
    cfg.shuffle = true;
    check_parity(train_mpi(cfg), reference(cfg), std::string(strategy_name(s)) + " shuffled");
    TrainConfig plain = cfg;
    plain.shuffle = false;
    CHECK(train_mpi(cfg).losses != train_mpi(plain).losses);  // the order did change
  }
}

TEST_CASE("activation checkpointing: the same losses and parameters, bit for bit, and the memory predicted",
          "[strategies][checkpointing]") {
  const int N = g_mpi->world();
  for (StrategyKind s : all_strategies()) {
    TrainConfig cfg = parity_config(s, N);
    cfg.steps = 3;
    cfg.accum = 2;
    cfg.batch = 4 * N;
    cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = DType::bf16;
    RunOut plain = train_mpi(cfg);
    for (Checkpointing c : {Checkpointing::attention, Checkpointing::blocks}) {
      TrainConfig ck = cfg;
      ck.checkpointing = c;
      INFO(strategy_name(s) << " " << checkpointing_name(c) << " world " << N);
      RunOut got = train_mpi(ck);
      CHECK(got.losses == plain.losses);
      CHECK(got.params == plain.params);
      // Measured (one step, MPI) = predicted (meta + sim), and activations fall.
      auto be = make_cpu_backend(BackendConfig{1});
      Pool pool(*be);
      auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
      Trainer t(*be, pool, *comm, ck);
      t.step(0);
      Estimate m = t.measured_step();
      Estimate e = predict_step(ck, N, g_mpi->rank(), ck.batch / N / ck.accum, false);
      Estimate none = predict_step(cfg, N, g_mpi->rank(), cfg.batch / N / cfg.accum, false);
      CHECK(m.peak == e.peak);
      CHECK(m.peak_by_category == e.peak_by_category);
      CHECK(m.at_peak == e.at_peak);
      const int act = static_cast<int>(Category::activations);
      CHECK(e.peak_by_category[act] < none.peak_by_category[act]);
    }
  }
}

namespace {
uint64_t total(const CategoryBytes& c) {
  uint64_t s = 0;
  for (uint64_t b : c) s += b;
  return s;
}
}  // namespace

TEST_CASE("offload: the same training as without it, and both memory tiers predicted to the byte",
          "[strategies][offload]") {
  const int N = g_mpi->world();
  for (DType dt : {DType::f32, DType::bf16})
    for (StrategyKind s : {StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3})
      for (Offload o : {Offload::optimizer, Offload::params}) {
        if (o == Offload::params && s != StrategyKind::zero3) continue;
        TrainConfig cfg = parity_config(s, N);
        cfg.steps = 3;
        cfg.accum = 2;
        cfg.batch = 4 * N;
        cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = dt;
        TrainConfig off = cfg;
        off.strategy.offload = o;
        const std::string what = fmt::format("{} offload {} {}", strategy_name(s), offload_name(o), dtype_name(dt));
        INFO(what << " world " << N);
        RunOut plain = train_mpi(cfg);
        RunOut got = train_mpi(off);
        double worst = 0;
        for (size_t i = 0; i < got.losses.size() && i < plain.losses.size(); ++i)
          worst = std::max(worst, double(std::fabs(got.losses[i] - plain.losses[i]) / std::fabs(plain.losses[i])));
        CHECK(got.losses.size() == plain.losses.size());
        CHECK(worst <= 1e-6);
        CHECK(got.params == plain.params);  // the same kernels on the same values, on the other tier
        check_measured_is_predicted(off, what);
        // What moved: the optimizer's state (and the shards) leave the device tier for the host.
        Estimate e_plain = predict_step(cfg, N, g_mpi->rank(), cfg.batch / N / cfg.accum, false);
        Estimate e_off = predict_step(off, N, g_mpi->rank(), off.batch / N / off.accum, false);
        const int opt = static_cast<int>(Category::optim_state);
        CHECK(e_off.model_states[opt] == 0);
        CHECK(e_off.host.model_states[opt] == e_plain.model_states[opt]);
        CHECK(total(e_off.model_states) < total(e_plain.model_states));
        if (o == Offload::params) CHECK(e_off.model_states[static_cast<int>(Category::param_shard)] == 0);
      }
}

TEST_CASE("checkpoints save and resume with offload on or off, across world sizes", "[strategies][offload]") {
  const int N = g_mpi->world();
  // Reference: 4 uninterrupted steps of zero3 without offload.
  TrainConfig cfg = parity_config(StrategyKind::zero3, N);
  cfg.steps = 4;
  cfg.batch = 4 * N;
  cfg.schedule.kind = ScheduleKind::constant;  // a 2-step run then has the 4-step run's learning rates
  RunOut want = train_mpi(cfg);
  // Two steps with offload params, a checkpoint, then two more with offload optimizer (zero2)
  // and with none: the run continues as if never stopped.
  const std::string dir = fmt::format("offload_ckpt_np{}", N);
  if (g_mpi->rank() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  TrainConfig first = cfg;
  first.strategy.offload = Offload::params;
  first.save_dir = dir;
  first.steps = 2;
  for (auto [kind, off] : {std::pair{StrategyKind::zero2, Offload::optimizer}, std::pair{StrategyKind::zero3, Offload::none}}) {
    {
      auto be = make_cpu_backend(BackendConfig{1});
      Pool pool(*be);
      auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
      TrainConfig c = first;
      Trainer t(*be, pool, *comm, c);
      std::FILE* sink = std::fopen("/dev/null", "w");
      t.run(sink);
      std::fclose(sink);
    }
    TrainConfig second = cfg;
    second.strategy.kind = kind;
    second.strategy.offload = off;
    second.save_dir = dir;
    second.resume = "auto";
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
    Trainer t(*be, pool, *comm, second);
    CHECK(t.start_step() == 2);
    std::vector<float> losses;
    for (int64_t s = t.start_step(); s < second.steps; ++s) losses.push_back(t.step(s).loss);
    INFO("resumed under " << strategy_name(kind) << " offload " << offload_name(off) << " world " << N);
    REQUIRE(losses.size() == 2);
    for (size_t i = 0; i < 2; ++i) CHECK(std::fabs(losses[i] - want.losses[2 + i]) <= 1e-5 * std::fabs(want.losses[2 + i]));
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_mpi->rank() == 0) std::filesystem::remove_all(dir);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("one rank, 64 MiB: DDP runs out of memory, ZeRO-3 with offload and checkpointing trains",
          "[headline][offload]") {
  REQUIRE(g_mpi->world() == 1);
  const uint64_t budget = 64ull << 20;
  TrainConfig cfg;
  cfg.spec = model_preset("small");
  cfg.spec.layers = 8;
  cfg.spec.dim = 512;
  cfg.spec.heads = 8;
  cfg.spec.seq = 64;
  cfg.spec.vocab = 256;
  cfg.spec.name = "small+custom";
  cfg.batch = 4;
  cfg.steps = 3;
  cfg.seed = 4242;
  cfg.strategy.kind = StrategyKind::ddp;
  const Estimate ddp = predict_step(cfg, 1, 0, 4, false);
  std::printf("L8 C512 H8 T64 V256: model states under ddp %.1f MiB, %.1fx the 64 MiB budget\n",
              ddp.model_state_total() / 1048576.0, double(ddp.model_state_total()) / double(budget));
  CHECK(ddp.model_state_total() > 6 * budget);
  std::string message;
  try {
    train_mpi(cfg, budget);
  } catch (const OutOfMemory& e) {
    message = e.what();
  }
  std::printf("ddp: %s\n", message.substr(0, message.find('\n')).c_str());
  CHECK_THAT(message, Catch::Contains("out of memory: cannot allocate"));
  CHECK_THAT(message, Catch::Contains("on the device tier"));

  cfg.strategy.kind = StrategyKind::zero3;
  cfg.strategy.offload = Offload::params;
  cfg.strategy.prefetch = 0;  // one gathered unit at a time: the budget has no room for a second
  cfg.checkpointing = Checkpointing::blocks;
  RunOut tight = train_mpi(cfg, budget);
  TrainConfig roomy = cfg;
  roomy.strategy = StrategyConfig{};
  roomy.strategy.kind = StrategyKind::zero3;
  roomy.checkpointing = Checkpointing::none;
  RunOut want = train_mpi(roomy, 0);
  CHECK(tight.losses == want.losses);
  const Estimate e = predict_step(cfg, 1, 0, 4, false);
  std::printf("zero3 + offload params + blocks: device peak %.2f MiB, host peak %.2f MiB, losses %.4f %.4f %.4f\n",
              e.peak / 1048576.0, e.host.peak / 1048576.0, tight.losses[0], tight.losses[1], tight.losses[2]);
  CHECK(e.peak <= budget);
}

// ---- Hybrid sharding (--shard-group S): ZeRO within groups of S ranks, replicas across them ----

namespace {
// The gradients a strategy leaves after one step of cfg (every unit, gathered), over MPI.
std::vector<std::vector<float>> grads_after_step(const TrainConfig& cfg) {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
  Trainer t(*be, pool, *comm, cfg);
  t.step(0);
  std::vector<std::vector<float>> g;
  for (size_t u = 0; u < t.units().size(); ++u) g.push_back(t.strategy().gather_unit_grads(u));
  return g;
}
}  // namespace

TEST_CASE("hybrid sharding trains as single-rank training does, at every shard group that divides the world",
          "[strategies][hybrid]") {
  const int N = g_mpi->world();
  for (int S = 1; S < N; ++S) {
    if (N % S != 0) continue;
    for (StrategyKind s : {StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3}) {
      TrainConfig cfg = parity_config(s, N);
      cfg.strategy.shard_group = S;
      check_parity(train_mpi(cfg), reference(cfg), fmt::format("{} S={}", strategy_name(s), S));
    }
  }
}

TEST_CASE("hybrid sharding with groups of one rank reduces DDP's gradients", "[strategies][hybrid]") {
  TrainConfig ddp = parity_config(StrategyKind::ddp, g_mpi->world());
  const auto want = grads_after_step(ddp);
  for (StrategyKind s : {StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3}) {
    TrainConfig cfg = ddp;
    cfg.strategy.kind = s;
    cfg.strategy.shard_group = 1;
    const auto got = grads_after_step(cfg);
    double worst = 0;
    for (size_t u = 0; u < want.size(); ++u) {
      REQUIRE(got[u].size() == want[u].size());
      for (size_t i = 0; i < want[u].size(); ++i) worst = std::max(worst, double(std::fabs(got[u][i] - want[u][i])));
    }
    INFO(strategy_name(s) << " S=1 world " << g_mpi->world());
    CHECK(worst <= 1e-6);  // an all-reduce of each full gradient, as DDP's, in another order
  }
}

TEST_CASE("hybrid sharding's intra- and inter-group traffic is the theory's, to the byte", "[strategies][hybrid]") {
  const int N = g_mpi->world();
  if (N < 2 || N % 2 != 0) return;  // needs two groups
  const int S = N / 2, G = 2;
  for (StrategyKind s : {StrategyKind::zero1, StrategyKind::zero2}) {
    TrainConfig cfg = parity_config(s, N);
    cfg.steps = 1;
    cfg.strategy.shard_group = S;
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
    Trainer t(*be, pool, *comm, cfg);
    t.step(0);
    double padded = 0;  // every unit padded to a multiple of S
    for (const auto& u : gpt2_layout(cfg.spec)) padded += static_cast<double>(make_flat_param(u, S, 0).padded);
    const double fs = (S - 1.0) / S, fg = (G - 1.0) / G, fn = (N - 1.0) / N;
    // In the group: reduce-scatter and all-gather of every unit (f32), and the gradient norm's
    // all-reduce of one float. Across groups: an all-reduce of each rank's shard. World: the loss.
    const double intra = 2 * fs * 4 * padded + 2 * fs * 4, inter = 2 * fg * 4 * padded / S, world = 2 * fn * 4;
    const auto& link = comm->stats().last_step_link;
    INFO(strategy_name(s) << " S=" << S << " world " << N);
    CHECK(link[static_cast<int>(CommLink::intra)] == Approx(intra).epsilon(1e-12));
    CHECK(link[static_cast<int>(CommLink::inter)] == Approx(inter).epsilon(1e-12));
    CHECK(link[static_cast<int>(CommLink::world)] == Approx(world).epsilon(1e-12));
    CHECK(comm->stats().last_step_bytes == Approx(intra + inter + world).epsilon(1e-12));
  }
}

TEST_CASE("hybrid sharding's memory is predicted to the byte", "[strategies][hybrid][estimator]") {
  const int N = g_mpi->world();
  for (StrategyKind s : {StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3}) {
    if (N >= 2 && N % 2 == 0) {  // real ranks: S = N / 2 (S = 2 at N = 4)
      TrainConfig cfg = parity_config(s, N);
      cfg.batch = 4 * N;
      cfg.strategy.shard_group = N / 2;
      cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = DType::bf16;
      check_measured_is_predicted(cfg, fmt::format("{} S={}", strategy_name(s), N / 2));
    }
    if (g_mpi->rank() != 0) continue;
    // One process playing rank 4 of 6 with S = 3, through the sim communicator, on the CPU backend.
    TrainConfig cfg = parity_config(s, 6);
    cfg.batch = 12;
    cfg.steps = 2;
    cfg.strategy.shard_group = 3;
    cfg.record_step = true;
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    auto comm = make_sim_communicator(4, 6, pool);
    Trainer t(*be, pool, *comm, cfg);
    t.step(0);
    t.step(1);
    Estimate m = t.measured_step(), e = predict_step(cfg, 6, 4, 2);
    INFO(strategy_name(s) << " S=3 world 6 (sim)");
    CHECK(m.model_states == e.model_states);
    CHECK(m.peak == e.peak);
    CHECK(m.at_peak == e.at_peak);
    CHECK(m.peak_by_category == e.peak_by_category);
    // Model states follow ZeRO's formulas with S in place of N: those of plain ZeRO on a world of S.
    TrainConfig plain3 = cfg;
    plain3.strategy.shard_group = 0;
    CHECK(e.model_states == predict_step(plain3, 3, 1, 2, false).model_states);
  }
}

TEST_CASE("a shard group that does not divide the world is refused", "[strategies][hybrid]") {
  TrainConfig cfg = parity_config(StrategyKind::zero3, 6);
  cfg.batch = 12;
  cfg.strategy.shard_group = 4;
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  auto comm = make_sim_communicator(0, 6, pool);
  CHECK_THROWS_WITH(Trainer(*be, pool, *comm, cfg), Catch::Contains("--shard-group 4 does not divide the world of 6"));
}
