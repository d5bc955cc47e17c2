// Memory under pipeline parallelism: every stage's measured step equals its prediction (meta
// backend, sim) to the byte under each schedule (interleaved and zb-v at pp 2 x V 2), at pp 2 and
// pp 4 and composed with data parallelism; and the activations a stage holds follow the schedule
// (gpipe every micro-batch, 1f1b min(M, P - stage), zb-h1 1f1b's and the weight passes it owes),
// read off the ledger's activation peaks at several micro-batch counts.
#include <catch2/catch.hpp>

#include "tests/strategy_test_util.hpp"

using namespace shardlab;
using namespace shardlab::strategy_test;

namespace {

// The schedules these tests run, by the names --pp-schedule takes.
const PpSchedule gpipe = parse_pp_schedule("gpipe"), one_f_one_b = parse_pp_schedule("1f1b"),
                 interleaved = parse_pp_schedule("interleaved-1f1b"), zb_h1 = parse_pp_schedule("zb-h1"),
                 zb_v = parse_pp_schedule("zb-v");

// tiny (GPT-2, tied head) at pp P: M micro-batches of 2 sequences per data-parallel rank.
TrainConfig pp_config(StrategyKind s, int world, int P, PpSchedule schedule, int64_t M) {
  TrainConfig cfg = parity_config(s, world);
  cfg.layout.dims.pp = P;
  cfg.layout.pipeline.schedule = schedule;
  cfg.accum = M;
  cfg.batch = 2 * M * (world / P);
  return cfg;
}

std::vector<PpSchedule> schedules() { return {gpipe, one_f_one_b, zb_h1}; }

// Stage k's activation peak (the ledger's, through a prediction: equal to a run's, as the test
// below checks) with M micro-batches, as rank k of a pipeline of P over P ranks.
uint64_t activation_peak(PpSchedule schedule, int P, int k, int64_t M) {
  TrainConfig cfg = pp_config(StrategyKind::ddp, P, P, schedule, M);
  Estimate e = predict_step(cfg, P, k, 2, false);
  return e.peak_by_category[static_cast<size_t>(Category::activations)];
}

}  // namespace

TEST_CASE("pipeline: every stage's step memory is predicted to the byte, each schedule", "[pp][estimator]") {
  const int N = g_mpi->world();
  if (N % 2 != 0) return;  // a pipeline of 2 or 4 stages over every rank, or 2 stages x 2 data-parallel ranks
  struct Layout {
    int pp;
    StrategyKind kind;
  };
  std::vector<Layout> layouts = {{2, StrategyKind::ddp}};
  if (N == 4) layouts = {{2, StrategyKind::ddp}, {2, StrategyKind::zero3}, {2, StrategyKind::zero1}, {4, StrategyKind::zero2}};
  for (const Layout& l : layouts)
    for (PpSchedule s : schedules())
      for (DType dt : {DType::f32, DType::bf16}) {
        TrainConfig cfg = pp_config(l.kind, N, l.pp, s, 4);
        cfg.steps = 2;
        cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = dt;
        check_measured_is_predicted(cfg, fmt::format("pp {} x dp {} {} {} {}", l.pp, N / l.pp, strategy_name(l.kind),
                                                     s.name(), dtype_name(dt)));
      }
  // A mixture of experts: the messages carry the balancing statistics behind them.
  TrainConfig moe = pp_config(StrategyKind::ddp, N, 2, one_f_one_b, 4);
  moe.spec = model_preset("qwen3-moe-tiny");
  moe.steps = 2;
  check_measured_is_predicted(moe, fmt::format("qwen3-moe pp 2 x dp {} 1f1b", N / 2));
  // Interleaved 1F1B and ZB-V: tiny's 4 units as 2 chunks on each of 2 stages (V 2; interleaved:
  // M a multiple of P; zb-v: in a V, the embedding and the head on rank 0).
  for (StrategyKind k : N == 4 ? std::vector<StrategyKind>{StrategyKind::ddp, StrategyKind::zero3}
                               : std::vector<StrategyKind>{StrategyKind::ddp})
    for (PpSchedule s : {interleaved, zb_v}) {
      TrainConfig cfg = pp_config(k, N, 2, s, 4);
      cfg.layout.pipeline.virtual_stages = 2;
      cfg.steps = 2;
      check_measured_is_predicted(cfg, fmt::format("pp 2 V 2 x dp {} {} {}", N / 2, strategy_name(k), s.name()));
    }
}

TEST_CASE("pipeline: the stages differ, and their activations follow the schedule's micro-batches in flight",
          "[pp][estimator]") {
  if (g_mpi->rank() != 0) return;  // predictions only: one process plays each stage
  // GPipe runs every forward before the first backward, so stage k holds all M micro-batches: its
  // activation peak grows by the same amount with each one. 1F1B's stage k holds min(M, P - k) (its
  // warm-up forwards), so its peak stops growing once M passes P - k, and stays below GPipe's. (The
  // receives posted ahead add a message or two to a stage's peak, so peaks are compared by their
  // growth, not against a single micro-batch's.)
  for (int P : {2, 4})
    for (int k = 0; k < P; ++k) {
      INFO("pp " << P << " stage " << k);
      const auto g = [&](int64_t M) { return activation_peak(gpipe, P, k, M); };
      const auto f = [&](int64_t M) { return activation_peak(one_f_one_b, P, k, M); };
      const uint64_t per_micro = g(4) - g(3);
      REQUIRE(per_micro > 0);
      CHECK(g(6) - g(4) == 2 * per_micro);
      CHECK(g(8) - g(6) == 2 * per_micro);
      const int64_t bound = P - k + 1;  // past the warm-up: no more micro-batches held
      CHECK(f(bound + 1) == f(bound));
      CHECK(f(bound + 3) == f(bound));
      CHECK(f(8) < g(8));
      if (P - k >= 3) CHECK(f(P - k) - f(P - k - 1) == per_micro);  // still in the warm-up
      // zb-h1 holds 1f1b's forwards, plus the weight passes stage k owes (at most k + 1, each the
      // copies of its GEMMs' operands): bounded too, past P + 1 micro-batches.
      const auto z = [&](int64_t M) { return activation_peak(zb_h1, P, k, M); };
      CHECK(z(P + 2) == z(P + 1));
      CHECK(z(P + 4) == z(P + 1));
      CHECK(z(8) < g(8));
    }
  // tiny has 4 units (embedding, h.0, h.1, head): one per stage at pp 4. Each stage's model states
  // are its own parameters at 16 bytes each under DDP with AdamW in f32 (parameter, gradient, two
  // moments): the embedding's V x C + T x C, a block's 12 C^2 + 13 C, the head's final norm (2 C)
  // and its tied copy of the token embedding (V x C).
  TrainConfig cfg = pp_config(StrategyKind::ddp, 4, 4, one_f_one_b, 4);
  const uint64_t C = 32, V = 256, T = 32;
  REQUIRE((cfg.spec.dim == 32 && cfg.spec.vocab == 256 && cfg.spec.seq == 32 && cfg.spec.layers == 2));
  const uint64_t expect[4] = {16 * (V * C + T * C), 16 * (12 * C * C + 13 * C), 16 * (12 * C * C + 13 * C),
                              16 * (2 * C + V * C)};
  for (int k = 0; k < 4; ++k) {
    INFO("stage " << k);
    CHECK(predict_step(cfg, 4, k, 2, false).model_state_total() == expect[k]);
  }
}

TEST_CASE("profile --pp: one row per stage, each the stage's prediction", "[pp][profile]") {
  if (g_mpi->rank() != 0) return;
  ProfileConfig pc;
  pc.train = pp_config(StrategyKind::ddp, 8, 4, one_f_one_b, 4);
  pc.train.layout.dims.dp_shard = 2;
  pc.world = 8;
  pc.micro_batch = 2;
  pc.strategies = {StrategyKind::ddp, StrategyKind::zero3};
  auto be = make_cpu_backend(BackendConfig{1});
  MemoryReport r = run_profile(*be, ProcessGroup{0, 1, nullptr}, pc);
  REQUIRE(r.rows.size() == 8);
  REQUIRE(r.notes.size() == 4);
  for (int k = 0; k < 4; ++k) {
    CHECK(r.rows[static_cast<size_t>(k)].label == fmt::format("ddp stage {}", k));
    CHECK(r.rows[static_cast<size_t>(k)].stage == k);
    // Stage k's first rank is k x (dp 2 x tp 1) in the mesh's layout.
    TrainConfig t = pc.train;
    t.use_strategy(StrategyKind::zero3);
    CHECK(r.rows[static_cast<size_t>(4 + k)].predicted.peak == predict_step(t, 8, 2 * k, 2, false).peak);
  }
}
