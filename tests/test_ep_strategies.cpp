// Expert parallelism (--ep) on real ranks (mpirun -np 2 and 4): one MoE layer's dispatch and combine
// against the same layer on one rank holding every expert (outputs, input and weight gradients) with
// the all-to-all bytes against the routing histogram the test computes itself; and whole models
// trained at ep 2 and ep 4, alone and with zero3 over the rest, with tensor parallelism (experts split in its group),
// and with hybrid sharding, against single-rank training (cross-entropy, auxiliary loss, every
// parameter each rank holds), their model states measured = predicted.
#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <random>

#include "src/model/blocks/moe.hpp"
#include "tests/strategy_test_util.hpp"

using namespace shardlab;
using namespace shardlab::strategy_test;

namespace {

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// Host values in pool blocks, as (rows, cols) tensors.
struct Tensors {
  Pool& pool;
  std::vector<Block> blocks;
  Tensor make(const std::vector<float>& v, int64_t rows, int64_t cols) {
    blocks.push_back(pool.alloc(DType::f32, rows * cols, Category::workspace, "test"));
    Tensor t = blocks.back().view(DType::f32, {rows, cols});
    pool.backend().copy(t, Tensor::flat(const_cast<float*>(v.data()), DType::f32, rows * cols));
    return t;
  }
};

std::vector<float> host(Backend& be, Tensor t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  be.copy(Tensor::flat(h.data(), DType::f32, t.numel()), t);
  return h;
}

// One rank's pass of the layer: its rows' output and input gradient, the gradients of the experts it
// holds (first .. first + count) and of the router, and the ep group's all-to-all bytes.
struct LayerRun {
  std::vector<float> out, dx, router_grad;
  std::vector<std::vector<float>> gate_up_grad, down_grad;
  double a2a_bytes = 0;
};

LayerRun run_layer(const ModelSpec& spec, Communicator* ep, int64_t first, int64_t count, const std::vector<float>& x,
                   const std::vector<float>& dout, int64_t N) {
  auto be = test::test_backend();
  Pool pool(*be);
  const int64_t C = spec.dim, E = spec.moe.experts, F = spec.moe.ffn_dim;
  Tensors t{pool, {}};
  blocks::MoeWeights w, g;
  w.router = t.make(random_values(static_cast<size_t>(E * C), 7, 0.5f), E, C);
  g.router = t.make(std::vector<float>(static_cast<size_t>(E * C), 0.f), E, C);
  for (int64_t e = first; e < first + count; ++e) {
    w.gate_up.push_back(t.make(random_values(static_cast<size_t>(2 * F * C), 100 + e, 0.2f), 2 * F, C));
    w.down.push_back(t.make(random_values(static_cast<size_t>(C * F), 200 + e, 0.2f), C, F));
    g.gate_up.push_back(t.make(std::vector<float>(static_cast<size_t>(2 * F * C), 0.f), 2 * F, C));
    g.down.push_back(t.make(std::vector<float>(static_cast<size_t>(C * F), 0.f), C, F));
  }
  Tensor xt = t.make(x, N, C), dt = t.make(dout, N, C);
  Tensor out = t.make(std::vector<float>(x.size(), 0.f), N, C), dx = t.make(std::vector<float>(x.size(), 0.f), N, C);
  EpContext group;
  if (ep) group = EpContext{{ep->world_size(), ep->rank()}, ep};
  UnitContext c{*be, pool, spec, Batch{}, Checkpointing::none, TpContext{}, ep ? &group : nullptr};
  const auto a2a = [&] {
    if (!ep) return 0.0;
    const auto& total = ep->stats().total;
    return total[static_cast<int>(CommOp::all_to_all_v)].bytes + total[static_cast<int>(CommOp::all_to_all)].bytes;
  };
  const double before = a2a();
  Saved s;
  blocks::moe_forward(c, s, xt, out, w);
  blocks::moe_backward(c, s, dx, dt, xt, w, g);
  LayerRun r;
  r.a2a_bytes = a2a() - before;
  r.out = host(*be, out), r.dx = host(*be, dx), r.router_grad = host(*be, g.router);
  for (int64_t l = 0; l < count; ++l) r.gate_up_grad.push_back(host(*be, g.gate_up[l])), r.down_grad.push_back(host(*be, g.down[l]));
  s.clear();
  return r;
}

// The top-k experts of each of x's rows (N, C) under router (E, C), computed here: softmax then the
// k largest (ties: the lower index), as transformers routes.
std::vector<int64_t> histogram(const ModelSpec& spec, const std::vector<float>& x, int64_t N) {
  const int64_t C = spec.dim, E = spec.moe.experts, k = spec.moe.top_k;
  const std::vector<float> router = random_values(static_cast<size_t>(E * C), 7, 0.5f);
  std::vector<int64_t> counts(static_cast<size_t>(E), 0);
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> logit(static_cast<size_t>(E), 0.0);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = 0; i < C; ++i) logit[e] += double(x[n * C + i]) * router[e * C + i];
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logit[a] > logit[b]; });
    for (int64_t j = 0; j < k; ++j) ++counts[order[j]];
  }
  return counts;
}

double worst_diff(const std::vector<float>& a, const std::vector<float>& b, size_t b0 = 0) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) w = std::max(w, double(std::fabs(a[i] - b[b0 + i])));
  return w;
}

}  // namespace

TEST_CASE("EP: one MoE layer's dispatch and combine equal the layer on one rank; all-to-all bytes equal the "
          "routing histogram's", "[ep]") {
  const int D = g_mpi->world(), me = g_mpi->rank();
  auto be = test::test_backend();
  Pool pool(*be);
  auto comm = test::test_communicator(pool);
  for (const char* preset : {"qwen3-moe-tiny", "mixtral-tiny"}) {
    const ModelSpec spec = model_preset(preset);
    const int64_t C = spec.dim, E = spec.moe.experts, El = E / D, N = 6 + 3 * me;  // ranks route unequal batches
    std::vector<int64_t> rows(static_cast<size_t>(D));
    for (int r = 0; r < D; ++r) rows[r] = 6 + 3 * r;
    const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
    const std::vector<float> x_all = random_values(static_cast<size_t>(total * C), 11, 1.f);
    const std::vector<float> d_all = random_values(static_cast<size_t>(total * C), 12, 1.f);
    const int64_t r0 = std::accumulate(rows.begin(), rows.begin() + me, int64_t{0});
    const std::vector<float> x(x_all.begin() + r0 * C, x_all.begin() + (r0 + N) * C);
    const std::vector<float> d(d_all.begin() + r0 * C, d_all.begin() + (r0 + N) * C);

    const LayerRun got = run_layer(spec, comm.get(), me * El, El, x, d, N);
    const LayerRun want = run_layer(spec, nullptr, 0, E, x_all, d_all, total);
    // Outputs and input gradients: this rank's rows. Experts: every rank's tokens reached them.
    // The router's gradient is this rank's tokens' part: summed over the group, the whole batch's.
    std::vector<float> router = got.router_grad;
    comm->all_reduce(std::span<float>(router)).wait();
    double worst = std::max(worst_diff(got.out, want.out, static_cast<size_t>(r0 * C)),
                            worst_diff(got.dx, want.dx, static_cast<size_t>(r0 * C)));
    worst = std::max(worst, worst_diff(router, want.router_grad));
    for (int64_t l = 0; l < El; ++l) {
      worst = std::max(worst, worst_diff(got.gate_up_grad[l], want.gate_up_grad[me * El + l]));
      worst = std::max(worst, worst_diff(got.down_grad[l], want.down_grad[me * El + l]));
    }
    INFO(preset << " ep " << D << " rank " << me << ": worst difference " << worst);
    CHECK(worst <= 1e-5);

    // Bytes that leave this rank: forward sends its slots of the other ranks' experts and returns
    // the other ranks' slots of its own; backward the same again; and each layer's counts (E - El).
    int64_t out_rows = 0, in_rows = 0;
    for (int r = 0, at = 0; r < D; at += static_cast<int>(rows[r]), ++r) {
      const std::vector<float> xr(x_all.begin() + at * C, x_all.begin() + (at + rows[r]) * C);
      const std::vector<int64_t> h = histogram(spec, xr, rows[r]);
      for (int64_t e = 0; e < E; ++e) {
        if (r == me && e / El != me) out_rows += h[e];
        if (r != me && e / El == me) in_rows += h[e];
      }
    }
    const double expect = 4.0 * (2 * (out_rows + in_rows) * C + (E - El));
    INFO(preset << ": " << out_rows << " rows out, " << in_rows << " in; bytes " << got.a2a_bytes << ", expected "
                << expect);
    CHECK(got.a2a_bytes == expect);
  }
}

namespace {

struct EpLayout {
  const char* preset;
  StrategyKind kind;
  int ep, tp = 1, dp_replicate = 0, pp = 1;
  bool tied = false;  // the head tied to the embedding: under --pp the last stage trains a copy
};

// The layouts that fit the world: ep = world alone and under zero3, and at 4 ranks ep 2 with zero3
// sharding over the other 2 (and replicating: hybrid), ep 2 x tp 2, ep 2 x pp 2 (1f1b, one
// micro-batch: the single rank's grouping of the balancing statistics; a tied head too), and
// Mixtral under zero1.
std::vector<EpLayout> ep_layouts(int world) {
  if (world == 2)
    return {{"qwen3-moe-tiny", StrategyKind::ddp, 2}, {"qwen3-moe-tiny", StrategyKind::zero3, 2},
            {"mixtral-tiny", StrategyKind::zero1, 2}};
  if (world == 4)
    return {{"qwen3-moe-tiny", StrategyKind::zero3, 4},    {"qwen3-moe-tiny", StrategyKind::zero3, 2},
            {"mixtral-tiny", StrategyKind::zero2, 2, 1, 2}, {"qwen3-moe-tiny", StrategyKind::ddp, 2, 2},
            {"mixtral-tiny", StrategyKind::zero3, 2, 2},    {"qwen3-moe-tiny", StrategyKind::zero3, 2, 1, 0, 2},
            {"mixtral-tiny", StrategyKind::ddp, 2, 1, 0, 2, true}};
  return {};
}

}  // namespace

TEST_CASE("EP: models trained at ep 2 and ep 4 equal single-rank training", "[ep][strategies]") {
  const int N = g_mpi->world();
  for (const EpLayout& l : ep_layouts(N)) {
    TrainConfig cfg = parity_config(l.kind, N);
    cfg.spec = model_preset(l.preset);
    cfg.spec.moe.aux_coef = 0.05;  // large enough to move the routers within the run
    cfg.batch = 8;
    cfg.layout.dims.ep = l.ep;
    cfg.layout.dims.tp = l.tp;
    cfg.layout.dims.dp_replicate = l.dp_replicate;
    cfg.layout.dims.pp = l.pp;
    cfg.spec.tied_head = cfg.spec.tied_head || l.tied;
    const std::string what = fmt::format("{} {} ep {} tp {}{}{}{}", l.preset, strategy_name(l.kind), l.ep, l.tp,
                                         l.dp_replicate > 1 ? " hybrid" : "", l.pp > 1 ? " pp 2" : "",
                                         l.tied ? " tied" : "");
    const PartsRun got = train_parts(cfg);  // this rank's losses, auxiliary losses and parameters
    const std::vector<float>& aux = got.aux;
    TrainConfig whole = cfg;  // one rank holding every expert
    whole.layout.dims = ParallelDims{};
    const RunOut want = reference(whole);
    const PartsWorst worst = compare_parts(got, want, cfg.spec);
    double worst_aux = 0;
    for (size_t i = 0; i < aux.size() && i < want.aux.size(); ++i)
      worst_aux = std::max(worst_aux, double(std::fabs(aux[i] - want.aux[i]) / std::fabs(want.aux[i])));
    const UnitLayout& layer = got.layouts[got.layouts[0].name == "embedding" ? 1 : 0];  // a stage's first layer
    const size_t experts = std::count_if(layer.tensors.begin(), layer.tensors.end(),
                                         [](const TensorDecl& d) { return d.expert; });
    if (g_mpi->rank() == 0)
      std::printf("parity %-40s world %d: max loss rel diff %.2e, aux %.2e, param abs diff %.2e (%zu compared)\n",
                  what.c_str(), N, worst.loss, worst_aux, worst.param, worst.compared);
    INFO(what);
    CHECK(aux.size() == want.aux.size());
    CHECK(experts == static_cast<size_t>(3 * cfg.spec.moe.experts / l.ep));  // this rank's experts only
    CHECK(worst.loss <= 1e-5);
    CHECK(worst_aux <= 1e-5);
    CHECK(worst.param <= 1e-4);  // routing is discrete: last-bit differences of sums move Adam's steps
    // The model states (parameters, gradients, optimizer) do not depend on the routing: predicted exactly.
    TrainConfig p = cfg;
    p.record_step = true;
    p.comm = test::test_comm();
    auto be = test::test_backend();
    Pool pool(*be);
    auto comm = test::test_communicator(pool);
    Trainer m(*be, pool, *comm, p);
    m.step(0);
    const Estimate e = predict_step(p, N, g_mpi->rank(), p.batch / p.layout.dims.resolved(N).dp() / p.accum);
    CHECK(m.measured_step().model_states == e.model_states);
  }
}

// Dropless, an expert rank's buffers hold what arrives (the routing decides); under
// --moe-capacity-factor they hold every peer's full share, so the step's memory does not depend on
// the data and the prediction (meta backend, balanced routing) equals the run allocation by allocation.
TEST_CASE("EP: under a capacity factor memory is predicted to the byte", "[ep][estimator]") {
  const int N = g_mpi->world();
  for (StrategyKind k : {StrategyKind::zero3, StrategyKind::ddp}) {
    TrainConfig cfg = parity_config(k, N);
    cfg.spec = model_preset("qwen3-moe-tiny");
    cfg.spec.moe_capacity_factor = 1.25;
    cfg.batch = 2 * N;
    cfg.steps = 2;
    cfg.layout.dims.ep = N;
    check_measured_is_predicted(cfg, fmt::format("qwen3-moe ep {} {} F 1.25", N, strategy_name(k)));
  }
}
