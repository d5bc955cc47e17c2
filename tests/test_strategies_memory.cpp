// Memory under every strategy on real ranks: the prediction (meta backend, sim) equals the MPI ledger
// for a step and a validation pass, profile --measure, validation and shuffling under every strategy,
// activation checkpointing and offload (the same training, both tiers predicted to the byte).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "src/report/memory_report.hpp"
#include "tests/strategy_test_util.hpp"

using namespace shardlab;
using namespace shardlab::strategy_test;

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
  const std::vector<int32_t> val = split_tail(train, cfg.val_fraction).to_vector();
  const int64_t T = cfg.spec.seq, B = cfg.batch;
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    std::vector<int32_t> in, tgt;
    for (int64_t j = i * B; j < (i + 1) * B; ++j) {  // sequence j is val[j*T : j*T + T + 1]
      in.insert(in.end(), val.begin() + j * T, val.begin() + j * T + T);
      tgt.insert(tgt.end(), val.begin() + j * T + 1, val.begin() + j * T + T + 1);
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
      // The fused attention keeps no probabilities: `attention` has nothing to drop, `blocks` does.
      if (c == Checkpointing::blocks || ck.spec.attention == AttentionKernel::naive)
        CHECK(e.peak_by_category[act] < none.peak_by_category[act]);
      else
        CHECK(e.peak_by_category[act] == none.peak_by_category[act]);
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
  // --prefetch auto (the default) finds no room for a second gathered block beside the activations
  // and keeps one at a time, as --prefetch 0 does.
  cfg.checkpointing = Checkpointing::blocks;
  RunOut tight = train_mpi(cfg, budget);
  TrainConfig roomy = cfg;
  roomy.strategy = StrategyConfig{};
  roomy.strategy.kind = StrategyKind::zero3;
  roomy.checkpointing = Checkpointing::none;
  RunOut want = train_mpi(roomy, 0);
  CHECK(tight.losses == want.losses);
  // Predicted on the run's budget, as the run resolves --prefetch auto (to 0 here: depth 1 would not fit).
  CHECK(auto_prefetch(cfg, 1, 0, 4, PoolConfig{budget}) == 0);
  const std::optional<Estimate> fits = predict_step_within(cfg, 1, 0, 4, PoolConfig{budget});
  REQUIRE(fits);
  const Estimate& e = *fits;
  std::printf("zero3 + offload params + blocks: device peak %.2f MiB, host peak %.2f MiB, losses %.4f %.4f %.4f\n",
              e.peak / 1048576.0, e.host.peak / 1048576.0, tight.losses[0], tight.losses[1], tight.losses[2]);
  CHECK(e.peak <= budget);
}

TEST_CASE("--prefetch auto never exceeds a device budget that --prefetch 0 fits", "[strategies][prefetch]") {
  const int N = g_mpi->world();
  TrainConfig cfg = parity_config(StrategyKind::zero3, N);
  cfg.steps = 2;
  const int64_t micro = cfg.batch / N / cfg.accum;
  // Every rank's predicted peak with each fixed depth; a budget must hold the largest.
  auto peak = [&](int depth) {
    TrainConfig c = cfg;
    c.strategy.prefetch = depth;
    uint64_t p = 0;
    for (int r = 0; r < N; ++r) p = std::max(p, predict_step(c, N, r, micro, false).peak);
    return p;
  };
  const uint64_t p0 = peak(0), p1 = peak(kPrefetchDepth);
  REQUIRE(p1 > p0);  // prefetching holds a second gathered unit
  TrainConfig fixed = cfg;
  fixed.strategy.prefetch = 0;
  const RunOut want = train_mpi(fixed, 0);
  for (uint64_t budget : {p0, (p0 + p1) / 2, p1 - 1, p1}) {
    INFO("world " << N << ", budget " << budget << " (prefetch 0 needs " << p0 << ", 1 needs " << p1 << ")");
    const int depth = auto_prefetch(cfg, N, g_mpi->rank(), micro, PoolConfig{budget, 0});
    CHECK(depth == (budget >= p1 ? kPrefetchDepth : 0));
    RunOut got;
    REQUIRE_NOTHROW(got = train_mpi(cfg, budget));  // cfg's prefetch is auto
    CHECK(got.losses == want.losses);
  }
}

// ---- Hybrid sharding (--shard-group S): ZeRO within groups of S ranks, replicas across them ----
