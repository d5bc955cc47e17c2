// ZeRO++ (shard/zeropp.hpp) over MPI: the all-to-all and the node groups it runs on, qgZ's
// reduction against the exact reduce-scatter, training with each lever and all three against
// plain zero3 (losses within 1%), each lever's bytes per axis against its formula, the inter-node
// bytes of all three against plain zero3's (at most 0.3x), hpZ's secondary shard to the byte, and
// measured = predicted for each lever. Nodes: 2 ranks each (1 at world 2, so every world has 2+ nodes).
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>

#include "shard/zeropp.hpp"
#include "tests/strategy_test_util.hpp"

using namespace shardlab;
using namespace shardlab::strategy_test;

namespace {
int node_ranks() { return g_mpi->world() >= 4 ? 2 : 1; }

TrainConfig zeropp_config(const ZeroPP& z) {
  TrainConfig cfg = parity_config(StrategyKind::zero3, g_mpi->world());
  cfg.strategy.zeropp = z;
  cfg.strategy.zeropp.block = 64;
  cfg.layout.ranks_per_node = node_ranks();
  return cfg;
}

struct LeverRun {
  std::vector<float> losses;
  std::array<double, kNumCommAxes> axis{};  // the last step's bus bytes per axis (this rank)
  double inter = 0;                         // of them, on axes that cross nodes
  uint64_t secondary_peak = 0;
  std::vector<int64_t> padded;  // each unit's padded elements
  int S = 1, L = 1, N = 1;
};

LeverRun run_lever(const TrainConfig& base, int steps) {
  TrainConfig cfg = base;
  cfg.steps = steps;
  cfg.record_step = true;
  cfg.comm = test::test_comm();
  auto be = test::test_backend();
  Pool pool(*be);
  auto comm = test::test_communicator(pool);
  Trainer t(*be, pool, *comm, cfg);
  LeverRun r;
  for (int s = 0; s < steps; ++s) r.losses.push_back(t.step(s).loss);
  r.axis = t.mesh().last_step_bytes();
  for (int a = 0; a < kNumCommAxes; ++a)
    if (t.mesh().crosses_nodes(static_cast<CommAxis>(a))) r.inter += r.axis[a];
  r.secondary_peak = t.measured_step().peak_by_category[static_cast<int>(Category::secondary_shard)];
  r.S = t.mesh().size(CommAxis::dp_shard_cp);
  if (cfg.strategy.zeropp.hierarchical()) {
    r.L = t.mesh().size(CommAxis::dp_shard_node);
    r.N = t.mesh().size(CommAxis::dp_shard_cross);
  }
  for (const auto& u : t.units()) r.padded.push_back(make_flat_param(u->layout(), r.S, 0).padded);
  return r;
}
}  // namespace

TEST_CASE("all_to_all gives rank r chunk r of every rank, in rank order", "[zeropp]") {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
  const int N = comm->world_size(), r = comm->rank();
  const int64_t c = 5;
  std::vector<float> send(static_cast<size_t>(N * c)), recv(send.size(), -1.f);
  for (int64_t i = 0; i < N * c; ++i) send[static_cast<size_t>(i)] = static_cast<float>(1000 * r + i);
  comm->all_to_all(Tensor::of(std::span<float>(send)), Tensor::of(std::span<float>(recv))).wait();
  for (int j = 0; j < N; ++j)
    for (int64_t i = 0; i < c; ++i) CHECK(recv[static_cast<size_t>(j * c + i)] == static_cast<float>(1000 * j + r * c + i));
  CHECK(comm->stats().total[static_cast<int>(CommOp::all_to_all)].bytes == Approx((N - 1.0) / N * N * c * 4));
}

TEST_CASE("the shard group splits by node: places in the node and one rank per node", "[zeropp]") {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
  const int W = comm->world_size(), R = node_ranks(), me = comm->rank();
  Mesh mesh(*comm, ParallelDims{}.resolved(W), R, true);
  CHECK(mesh.size(CommAxis::dp_shard_node) == R);
  CHECK(mesh.rank(CommAxis::dp_shard_node) == me % R);
  CHECK(mesh.size(CommAxis::dp_shard_cross) == W / R);
  CHECK(mesh.rank(CommAxis::dp_shard_cross) == me / R);
  CHECK(mesh.crosses_nodes(CommAxis::dp_shard_cp) == (W > R));
  CHECK_FALSE(mesh.crosses_nodes(CommAxis::dp_shard_node));
  CHECK(mesh.crosses_nodes(CommAxis::dp_shard_cross) == (W > R));
  // Under tp 2 the shard group is {0, 2} or {1, 3}: one rank of it on each node of 2.
  if (W == 4) {
    ParallelDims d{};
    d.tp = 2;
    Mesh tp(*comm, d.resolved(W), 2, true);
    CHECK(tp.size(CommAxis::dp_shard_node) == 1);
    CHECK(tp.size(CommAxis::dp_shard_cross) == 2);
    CHECK_FALSE(tp.crosses_nodes(CommAxis::tp));
  }
}

TEST_CASE("qgZ's two quantized all-to-alls sum the gradients within the quantization error", "[zeropp]") {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
  const int W = comm->world_size();
  Mesh mesh(*comm, ParallelDims{}.resolved(W), node_ranks(), true);
  const int64_t c = 100, P = c * W;
  std::vector<float> g(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) g[size_t(i)] = std::sin(0.37f * float(i) + 1.3f * float(comm->rank()));  // in [-1, 1]
  std::vector<float> exact(static_cast<size_t>(c));
  comm->reduce_scatter(Tensor::of(std::span<const float>(g)), Tensor::of(std::span<float>(exact))).wait();
  for (int bits : {8, 4}) {
    ZeroPP z;
    z.grad_bits = bits;
    z.block = 32;
    ZeroPPComms zc(z, mesh, pool, mesh.comm(CommAxis::dp_shard_cp));
    std::vector<float> got(static_cast<size_t>(c));
    zc.reduce_scatter_quantized(Tensor::of(std::span<float>(g)), Tensor::of(std::span<float>(got)), "test");
    // Each of the W contributions is off by at most half its block's scale (<= 1 / qmax / 2), and
    // each of the N node sums (|x| <= L) by at most L / qmax / 2.
    const double qmax = bits == 8 ? 127 : 7, L = node_ranks(), N = W / L;
    const double bound = (W + (N > 1 ? N * L : 0)) / qmax / 2 + 1e-6;
    double worst = 0;
    for (int64_t i = 0; i < c; ++i) worst = std::max(worst, std::fabs(double(got[size_t(i)]) - exact[size_t(i)]));
    INFO(bits << " bits, world " << W << ": max |error| " << worst << ", bound " << bound);
    CHECK(worst <= bound);
    CHECK(worst > 0);  // it did quantize
  }
}

TEST_CASE("qgZ's error feedback carries what quantizing lost into the next reduction", "[zeropp]") {
  // One node (no second quantization across nodes): with feedback the errors of K reductions of the
  // same gradients telescope, so their sum is K exact sums within one reduction's error; without,
  // the same rounding repeats K times.
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
  const int W = comm->world_size();
  Mesh mesh(*comm, ParallelDims{}.resolved(W), W, true);
  const int64_t c = 64, P = c * W, K = 20;
  std::vector<float> g(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) g[size_t(i)] = std::sin(0.71f * float(i) + 0.9f * float(comm->rank()));
  std::vector<float> exact(static_cast<size_t>(c));
  comm->reduce_scatter(Tensor::of(std::span<const float>(g)), Tensor::of(std::span<float>(exact))).wait();
  double worst[2] = {0, 0};
  for (bool ef : {false, true}) {
    ZeroPP z;
    z.grad_bits = 4;
    z.block = 32;
    z.error_feedback = ef;
    ZeroPPComms zc(z, mesh, pool, mesh.comm(CommAxis::dp_shard_cp));
    std::vector<float> feedback(static_cast<size_t>(P), 0.f), sum(static_cast<size_t>(c), 0.f), out(sum.size());
    for (int k = 0; k < K; ++k) {
      std::vector<float> full = g;  // a fresh gradient each step, as backward writes it
      auto r = zc.start_reduction(Tensor::of(std::span<float>(full)), c, "test",
                                  ef ? Tensor::of(std::span<float>(feedback)) : Tensor());
      zc.finish_reduction(r, Tensor::of(std::span<float>(out)), "test");
      for (int64_t i = 0; i < c; ++i) sum[size_t(i)] += out[size_t(i)];
    }
    for (int64_t i = 0; i < c; ++i) worst[ef] = std::max(worst[ef], std::fabs(double(sum[size_t(i)]) - K * exact[size_t(i)]));
  }
  // One reduction's bound: W contributions, each within scale / 2 <= amax / 7 / 2, amax <= 1 + the carried error.
  const double one = W * 1.1 / 7.0 / 2;
  INFO("world " << W << ": |sum of " << K << " reductions - " << K << " x exact| without feedback " << worst[0]
                << ", with " << worst[1] << " (one reduction's bound " << one << ")");
  if (comm->rank() == 0)
    std::printf("qgZ int4 error feedback, world %d: |sum of %lld reductions - exact| %.3g without, %.3g with\n", W,
                static_cast<long long>(K), worst[0], worst[1]);
  CHECK(worst[1] <= one + 1e-4);
  if (W > 1) CHECK(worst[0] > 2 * worst[1]);
}

TEST_CASE("ZeRO++ trains as zero3 does, moves the bytes its formulas say, and is predicted to the byte",
          "[zeropp][zeropp-train]") {
  const int W = g_mpi->world();
  if (W < 2) return;
  const int steps = 6;
  const LeverRun plain = run_lever(zeropp_config(ZeroPP{}), steps);
  ZeroPP qw, hp, qg, all, ef;
  qw.weight_bits = 8;
  hp.secondary = true;
  qg.grad_bits = 4;
  all = ZeroPP{8, 4, true};
  ef = qg;
  ef.error_feedback = true;
  const QuantSpec q8{8, 64}, q4{4, 64};
  for (const auto& [name, z] :
       {std::pair{"qwZ", qw}, {"hpZ", hp}, {"qgZ4", qg}, {"qgZ4+ef", ef}, {"qwZ hpZ qgZ4", all}}) {
    INFO(name << " world " << W);
    const TrainConfig cfg = zeropp_config(z);
    const LeverRun r = run_lever(cfg, steps);
    double worst = 0;
    for (int s = 0; s < steps; ++s) worst = std::max(worst, std::fabs(double(r.losses[s]) - plain.losses[s]) / plain.losses[s]);
    if (g_mpi->rank() == 0) std::printf("zeropp %-13s world %d: max loss rel diff to zero3 %.2e, inter-node bytes %.0f "
                                        "of zero3's %.0f (%.3fx)\n", name, W, worst, r.inter, plain.inter, r.inter / plain.inter);
    CHECK(worst <= 0.01);
    // hpZ moves the same values by another route: the same losses, bit for bit. The others quantize.
    if (z == hp) CHECK(r.losses == plain.losses);
    else CHECK(r.losses != plain.losses);
    // qgZ: per unit one all-to-all in the node (L x N records of a chunk each) and, across nodes,
    // one of N records; the plain reduce-scatter's bytes leave the shard group's axis.
    const int S = r.S, L = r.L, N = r.N;
    double node = 0, cross = 0, rs = 0, secondary = 0;
    for (size_t u = 0; u < r.padded.size(); ++u) {
      const int64_t c = r.padded[u] / S;
      node += z.grad_bits ? (L - 1.0) / L * L * N * q4.words(c) * 4 : 0;
      cross += z.grad_bits && N > 1 ? (N - 1.0) / N * N * q4.words(c) * 4 : 0;
      rs += (S - 1.0) / S * r.padded[u] * 4;
      if (u + 1 < r.padded.size()) secondary += r.padded[u] / L * 4.0;  // the last unit stays gathered
    }
    const double shard_axis = r.axis[static_cast<int>(CommAxis::dp_shard)];
    const double plain_gathers = plain.axis[static_cast<int>(CommAxis::dp_shard)] - rs - 2.0 * (S - 1) / S * 4;
    if (z.grad_bits) {
      CHECK(r.axis[static_cast<int>(CommAxis::dp_shard_cross)] == Approx(cross).epsilon(1e-12));
      if (!z.secondary) CHECK(r.axis[static_cast<int>(CommAxis::dp_shard_node)] == Approx(node).epsilon(1e-12));
      if (!z.weight_bits && !z.secondary) CHECK(shard_axis == Approx(plain.axis[static_cast<int>(CommAxis::dp_shard)] - rs).epsilon(1e-12));
    }
    // qwZ alone: each gather of unit u moves S records of its shard instead of its f32 values, so
    // the gathers' bytes shrink by a ratio between the smallest and the largest unit's.
    if (z.weight_bits && !z.secondary && !z.grad_bits) {
      double lo = 1e9, hi = 0;
      for (int64_t p : r.padded) {
        const double ratio = double(S) * q8.words(p / S) / double(p);
        lo = std::min(lo, ratio), hi = std::max(hi, ratio);
      }
      const double ratio = (shard_axis - rs - 2.0 * (S - 1) / S * 4) / plain_gathers;
      CHECK(ratio >= lo * (1 - 1e-12));
      CHECK(ratio <= hi * (1 + 1e-12));
    }
    // hpZ: the secondary shards of every unit but the last live from forward to backward.
    if (z.secondary) CHECK(r.secondary_peak == static_cast<uint64_t>(secondary));
    else CHECK(r.secondary_peak == 0);
    if (z == all) CHECK(r.inter <= 0.3 * plain.inter);
    check_measured_is_predicted(cfg, name);
  }
}

TEST_CASE("an emulated inter-node link paces the groups that span nodes, and only those", "[zeropp]") {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, pool);
  const int W = comm->world_size();
  if (W < 2) return;
  Mesh mesh(*comm, ParallelDims{}.resolved(W), node_ranks(), true);
  const double rate = 2e6;  // bytes per second
  mesh.pace_inter_node(rate);
  std::vector<float> buf(25000, 1.f);  // 100 kB: an all-reduce's bus bytes 2 (S-1)/S x 100 kB
  const double bus = 2.0 * (W - 1) / W * 1e5;
  const auto t0 = std::chrono::steady_clock::now();
  mesh.comm(CommAxis::dp_shard).all_reduce(std::span<float>(buf)).wait();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("world " << W << ": " << bus << " bus bytes at " << rate << " B/s took " << took << " s");
  CHECK(took >= bus / rate);  // a lower bound: a busy machine only makes it slower
  CHECK_FALSE(mesh.crosses_nodes(CommAxis::dp_shard_node));  // the node's group is not paced
}
