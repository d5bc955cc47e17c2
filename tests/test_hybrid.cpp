// Hybrid sharding on the mesh (--dp-shard S with the replicas taking the rest): parity with
// single-rank training at every S dividing the world, S = 1 reducing DDP's gradients, the dp_shard
// and dp_replicate axes' traffic equal to the theory to the byte, memory predicted to the byte.
#include <catch2/catch.hpp>
#include <cmath>

#include "tests/strategy_test_util.hpp"

using namespace shardlab;
using namespace shardlab::strategy_test;

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
      cfg.layout.dims.dp_shard = S;
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
    cfg.layout.dims.dp_shard = 1;
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
    cfg.layout.dims.dp_shard = S;
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
    Trainer t(*be, pool, *comm, cfg);
    t.step(0);
    double padded = 0;  // every unit padded to a multiple of S
    for (const auto& u : family_of(cfg.spec).layout(cfg.spec)) padded += static_cast<double>(make_flat_param(u, S, 0).padded);
    const double fs = (S - 1.0) / S, fg = (G - 1.0) / G, fn = (N - 1.0) / N;
    // In the group: reduce-scatter and all-gather of every unit (f32), and the gradient norm's
    // all-reduce of one float. Across groups: an all-reduce of each rank's shard. World: the loss.
    const double intra = 2 * fs * 4 * padded + 2 * fs * 4, inter = 2 * fg * 4 * padded / S, world = 2 * fn * 4;
    const auto& link = comm->stats().last_step_axis;
    INFO(strategy_name(s) << " S=" << S << " world " << N);
    CHECK(link[static_cast<int>(CommAxis::dp_shard)] == Approx(intra).epsilon(1e-12));
    CHECK(link[static_cast<int>(CommAxis::dp_replicate)] == Approx(inter).epsilon(1e-12));
    CHECK(link[static_cast<int>(CommAxis::world)] == Approx(world).epsilon(1e-12));
    CHECK(comm->stats().last_step_bytes == Approx(intra + inter + world).epsilon(1e-12));
  }
}

TEST_CASE("hybrid sharding's memory is predicted to the byte", "[strategies][hybrid][estimator]") {
  const int N = g_mpi->world();
  for (StrategyKind s : {StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3}) {
    if (N >= 2 && N % 2 == 0) {  // real ranks: S = N / 2 (S = 2 at N = 4)
      TrainConfig cfg = parity_config(s, N);
      cfg.batch = 4 * N;
      cfg.layout.dims.dp_shard = N / 2;
      cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = DType::bf16;
      check_measured_is_predicted(cfg, fmt::format("{} S={}", strategy_name(s), N / 2));
    }
    if (g_mpi->rank() != 0) continue;
    // One process playing rank 4 of 6 with S = 3, through the sim communicator, on the CPU backend.
    TrainConfig cfg = parity_config(s, 6);
    cfg.batch = 12;
    cfg.steps = 2;
    cfg.layout.dims.dp_shard = 3;
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
    plain3.layout.dims = ParallelDims{};
    CHECK(e.model_states == predict_step(plain3, 3, 1, 2, false).model_states);
  }
}

TEST_CASE("a shard group that does not divide the world is refused", "[strategies][hybrid]") {
  TrainConfig cfg = parity_config(StrategyKind::zero3, 6);
  cfg.batch = 12;
  cfg.layout.dims.dp_shard = 4;
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  auto comm = make_sim_communicator(0, 6, pool);
  CHECK_THROWS_WITH(Trainer(*be, pool, *comm, cfg), Catch::Contains("--dp-shard 4 = 4 does not divide the world of 6"));
  CHECK(ParallelDims{1, 0, 2, 1}.resolved(6) == ParallelDims{1, 3, 2, 1});  // --shard-group's message: cli tests
}
