// Pipeline parallelism on real ranks (mpirun -np 2, 4 and 8), GPT-2 (tied head: the last stage
// trains a tied copy of the token embedding) and Llama (untied): parity with single-rank training
// of the same configuration in this process over 10 steps (losses within 1e-5 relative, every
// element of every unit this rank holds, tied copies included, within 2e-5 of the whole model's),
// for each schedule (zb-h1's weight gradients computed in W passes apart from their backwards)
// and with DDP, ZeRO and TP on the other axes; gradients reduced once per step,
// not once per micro-batch; and the bad inputs, by their messages. Each case runs at the world
// its layout needs and returns at the others.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "src/model/tp.hpp"
#include "tests/strategy_test_util.hpp"

using namespace shardlab;
using namespace shardlab::strategy_test;

namespace {

// The schedules these tests run, by the names --pp-schedule takes.
const PpSchedule gpipe = parse_pp_schedule("gpipe"), one_f_one_b = parse_pp_schedule("1f1b"),
                 interleaved = parse_pp_schedule("interleaved-1f1b"), zb_h1 = parse_pp_schedule("zb-h1"),
                 zb_v = parse_pp_schedule("zb-v");

struct Layout {
  int pp;
  PpSchedule schedule;
  int micro;  // M
  StrategyKind kind = StrategyKind::ddp;
  int tp = 1;
  int virtual_stages = 1;
};

ModelSpec gpt2_spec() { return model_preset("tiny"); }     // embedding, h.0, h.1, head: 4 units
ModelSpec llama_spec() { return model_preset("llama-tiny"); }

TrainConfig pp_config(const ModelSpec& spec, const Layout& l) {
  const int N = g_mpi->world();
  TrainConfig cfg = parity_config(l.kind, N);
  cfg.spec = spec;
  cfg.layout.dims.pp = l.pp;
  cfg.layout.dims.tp = l.tp;
  cfg.layout.pipeline.schedule = l.schedule;
  cfg.layout.pipeline.virtual_stages = l.virtual_stages;
  cfg.accum = l.micro;
  cfg.batch = 2 * l.micro * (N / l.pp / l.tp);  // micro-batches of 2 sequences on each data-parallel rank
  return cfg;
}

// The same run on one rank holding the whole model: the reference.
TrainConfig whole_model(TrainConfig c) {
  c.layout.dims = ParallelDims{};
  c.layout.pipeline = PipelineConfig{};
  return c;
}

std::string label(const TrainConfig& c) {
  const ParallelDims& d = c.layout.dims;
  return fmt::format("{} pp {} {} M {}{}{} {}{}", c.spec.name, d.pp, c.layout.pipeline.schedule.name(), c.accum,
                     c.layout.pipeline.virtual_stages > 1 ? fmt::format(" V {}", c.layout.pipeline.virtual_stages) : "",
                     d.tp > 1 ? fmt::format(" tp {}", d.tp) : "", strategy_name(c.strategy.kind),
                     c.strategy.precision.param_dtype != DType::f32 ? " bf16" : "");
}

void check_pp_parity(const TrainConfig& cfg) {
  const PartsRun got = train_parts(cfg);
  const RunOut want = reference(whole_model(cfg));
  const PartsWorst w = compare_parts(got, want, cfg.spec);
  if (g_mpi->rank() == 0 || g_mpi->rank() == g_mpi->world() - 1)  // the first stage and the last
    std::printf("parity %-36s world %d rank %d: max loss rel diff %.2e, max param abs diff %.2e (%zu params, %zu in "
                "tied copies)\n", label(cfg).c_str(), g_mpi->world(), g_mpi->rank(), w.loss, w.param, w.compared,
                w.tied);
  INFO(label(cfg) << " world " << g_mpi->world() << " rank " << g_mpi->rank() << ": loss " << w.loss << " param "
                   << w.param);
  CHECK(got.losses.size() == want.losses.size());
  CHECK(w.compared > 0);
  // A tied head on another stage than the embedding trains a copy of the token embedding: compared
  // with the owner's (zb-v's V keeps both on rank 0: no copy).
  CHECK((w.tied > 0) == (cfg.spec.tied_head && got.head_apart));
  CHECK(w.loss <= 1e-5);
  CHECK(w.param <= 2e-5);
}

// The layouts of the issues' lists that fit this world (zb-h1 and zb-v: pp 2 and 4, alone, x zero3
// dp 2, x tp 2; zb-v at pp 4 below, with more units).
std::vector<Layout> layouts(int world) {
  if (world == 2) return {{2, gpipe, 2}, {2, one_f_one_b, 2}, {2, zb_h1, 4}, {2, zb_v, 4, StrategyKind::ddp, 1, 2}};
  if (world == 4) return {{2, one_f_one_b, 2, StrategyKind::ddp}, {2, one_f_one_b, 2, StrategyKind::zero3},
                          {2, gpipe, 2, StrategyKind::ddp, 2}, {4, zb_h1, 8}, {2, zb_h1, 4, StrategyKind::zero3},
                          {2, zb_h1, 2, StrategyKind::ddp, 2}, {2, zb_v, 4, StrategyKind::zero3, 1, 2},
                          {2, zb_v, 2, StrategyKind::ddp, 2, 2}};
  if (world == 8) return {{2, one_f_one_b, 2, StrategyKind::zero1, 2}, {4, zb_h1, 4, StrategyKind::zero3},
                          {4, zb_h1, 4, StrategyKind::ddp, 2}};
  return {};
}

}  // namespace

TEST_CASE("GPT-2 (tied head): pipeline parallelism matches single-rank training", "[pp][gpt2]") {
  for (const Layout& l : layouts(g_mpi->world())) check_pp_parity(pp_config(gpt2_spec(), l));
}

TEST_CASE("Llama: pipeline parallelism matches single-rank training", "[pp][llama]") {
  for (const Layout& l : layouts(g_mpi->world())) check_pp_parity(pp_config(llama_spec(), l));
}

// A mixture of experts pipelined: the balancing statistics travel behind the activations to the last
// chunk and back behind the gradients, so the auxiliary loss is the whole model's and every stage's
// routers get its gradient. Qwen3-MoE's and Mixtral's 4 units over 2 and 4 stages, interleaved,
// and with tp 2: cross-entropy and auxiliary loss against one rank's (the same micro-batches).
TEST_CASE("Mixture of experts: pipeline parallelism matches single-rank training, auxiliary loss included",
          "[pp][moe]") {
  struct MoeLayout {
    const char* preset;
    Layout l;
  };
  std::vector<MoeLayout> runs;
  if (g_mpi->world() == 2)
    runs = {{"qwen3-moe-tiny", {2, one_f_one_b, 2}}, {"mixtral-tiny", {2, gpipe, 4}},
            {"qwen3-moe-tiny", {2, interleaved, 2, StrategyKind::zero3, 1, 2}}};
  if (g_mpi->world() == 4)
    runs = {{"qwen3-moe-tiny", {4, one_f_one_b, 4}}, {"mixtral-tiny", {2, one_f_one_b, 2, StrategyKind::ddp, 2}}};
  for (const MoeLayout& r : runs) {
    ModelSpec spec = model_preset(r.preset);
    spec.moe.aux_coef = 0.05;  // large enough to move the routers within the run
    const TrainConfig cfg = pp_config(spec, r.l);
    check_pp_parity(cfg);
    const PartsRun got = train_parts(cfg);
    const RunOut want = reference(whole_model(cfg));
    REQUIRE(got.aux.size() == want.aux.size());
    double worst = 0;
    for (size_t i = 0; i < got.aux.size(); ++i) worst = std::max(worst, double(std::fabs(got.aux[i] - want.aux[i]) / want.aux[i]));
    INFO(label(cfg) << ": auxiliary loss within " << worst);
    CHECK(worst <= 1e-5);
  }
}

// Four micro-batches per step (gradients accumulated over them on every stage) and 1f1b with fewer
// micro-batches than stages (it runs, warned about in the train header: gpipe's memory).
TEST_CASE("pipeline parallelism: accumulation over 4 micro-batches, and 1f1b with M < P", "[pp][accum]") {
  if (g_mpi->world() != 2) return;
  for (const ModelSpec& spec : {gpt2_spec(), llama_spec()}) {
    check_pp_parity(pp_config(spec, {2, one_f_one_b, 4}));
    check_pp_parity(pp_config(spec, {2, one_f_one_b, 1}));
  }
}

// Interleaved 1F1B: 8 chunks of one unit each (6 blocks) over 4 ranks, 2 per rank.
TEST_CASE("pipeline parallelism: interleaved 1f1b at pp 4 x V 2 matches single-rank training",
          "[pp][interleaved]") {
  if (g_mpi->world() != 4) return;
  for (ModelSpec spec : {gpt2_spec(), llama_spec()}) {
    spec.layers = 6;
    check_pp_parity(pp_config(spec, {4, interleaved, 4, StrategyKind::ddp, 1, 2}));
  }
}

// ZB-V at pp 4: 8 chunks in a V (6 blocks), the embedding and the tied head both on rank 0 (no tied
// copy), alone at world 4, x zero3 dp 2 and x tp 2 at world 8.
TEST_CASE("pipeline parallelism: zb-v at pp 4 matches single-rank training", "[pp][zb]") {
  std::vector<Layout> ls;
  if (g_mpi->world() == 4) ls = {{4, zb_v, 8, StrategyKind::ddp, 1, 2}};
  if (g_mpi->world() == 8) ls = {{4, zb_v, 4, StrategyKind::zero3, 1, 2}, {4, zb_v, 4, StrategyKind::ddp, 2, 2}};
  for (ModelSpec spec : {gpt2_spec(), llama_spec()}) {
    spec.layers = 6;
    for (const Layout& l : ls) check_pp_parity(pp_config(spec, l));
  }
}

// bf16 parameters and gradients: against single-rank training in bf16. At pp 2 (dp 1) the stages
// compute what one rank computes, in the same micro-batch order: bounded at 1e-5 as f32 (zb-h1
// too: B and W write disjoint gradient elements, each flushed to bf16 once per micro-batch).
TEST_CASE("pipeline parallelism: bf16 parameters and gradients train as on one rank", "[pp][bf16]") {
  if (g_mpi->world() != 2) return;
  for (const ModelSpec& spec : {gpt2_spec(), llama_spec()})
    for (PpSchedule sched : {one_f_one_b, zb_h1}) {  // zb-h1: B's gradients flushed before W's
      TrainConfig cfg = pp_config(spec, {2, sched, 2});
      const RunOut f32 = reference(whole_model(cfg));
      cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = DType::bf16;
      const PartsRun got = train_parts(cfg);
      const RunOut ref = reference(whole_model(cfg));
      const PartsWorst w = compare_parts(got, ref, cfg.spec);
      double worst_f32 = 0;
      for (size_t k = 0; k < got.losses.size() && k < f32.losses.size(); ++k)
        worst_f32 = std::max(worst_f32, std::fabs(double(got.losses[k]) - f32.losses[k]) / f32.losses[k]);
      if (g_mpi->rank() == 0)
        std::printf("bf16 %-40s world 2: losses within %.2e of bf16 on one rank, %.2e of f32; params within %.2e\n",
                    label(cfg).c_str(), w.loss, worst_f32, w.param);
      INFO(label(cfg) << ": losses within " << w.loss << " of one rank's bf16, " << worst_f32 << " of f32");
      CHECK(got.losses.size() == ref.losses.size());
      CHECK(w.loss <= 1e-5);
      CHECK(worst_f32 < 1e-3);
    }
}

// The data-parallel collectives of a step (calls per op over the dp, dp_shard and dp_replicate
// communicators) at M = 4 equal those at M = 1: gradients are reduced (and ZeRO-3's parameters
// gathered) once per step, not once per micro-batch (pytorch#164756, torchtitan#1733).
TEST_CASE("pipeline parallelism: data-parallel collectives run once per step, not once per micro-batch",
          "[pp][comm]") {
  if (g_mpi->world() != 4) return;
  auto step_calls = [](const TrainConfig& cfg) {
    auto be = test::test_backend();
    Pool pool(*be);
    auto comm = test::test_communicator(pool);
    Trainer t(*be, pool, *comm, cfg);
    t.step(0);
    std::vector<Communicator*> dp;
    for (CommAxis a : {CommAxis::dp, CommAxis::dp_shard, CommAxis::dp_replicate})
      if (std::find(dp.begin(), dp.end(), &t.mesh().comm(a)) == dp.end()) dp.push_back(&t.mesh().comm(a));
    std::array<uint64_t, kNumCommOps> before{}, calls{};
    for (Communicator* c : dp)
      for (int op = 0; op < kNumCommOps; ++op) before[op] += c->stats().total[op].calls;
    t.step(1);
    for (Communicator* c : dp)
      for (int op = 0; op < kNumCommOps; ++op) calls[op] += c->stats().total[op].calls;
    for (int op = 0; op < kNumCommOps; ++op) calls[op] -= before[op];
    return calls;
  };
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero2, StrategyKind::zero3}) {
    TrainConfig one = pp_config(gpt2_spec(), {2, one_f_one_b, 1, k});
    TrainConfig four = pp_config(gpt2_spec(), {2, one_f_one_b, 4, k});
    one.batch = four.batch;  // the same sequences per step
    const auto a = step_calls(one), b = step_calls(four);
    const CommOp reduce = k == StrategyKind::ddp ? CommOp::all_reduce : CommOp::reduce_scatter;
    std::string row;
    for (int op = 0; op < kNumCommOps; ++op)
      if (a[op] || b[op]) row += fmt::format(" {} {}/{}", comm_op_name(static_cast<CommOp>(op)), a[op], b[op]);
    if (g_mpi->rank() == 0)
      std::printf("pp 2 x %s 2: data-parallel calls per step, M = 1 / M = 4:%s\n", strategy_name(k), row.c_str());
    INFO(strategy_name(k) << " rank " << g_mpi->rank() << ": calls per step M = 1 / M = 4:" << row);
    CHECK(a[static_cast<int>(reduce)] > 0);
    if (k == StrategyKind::zero3) CHECK(a[static_cast<int>(CommOp::all_gather)] > 0);
    CHECK(a == b);
  }
}

// --activation-dtype bf16: the activations and their gradients cross between stages in bf16, half
// the pp axis's message bytes (the tied embedding's all-reduce and the loss's floats stay f32), and
// a mixture of experts' auxiliary floats ride behind them, their bits in bf16 slots.
TEST_CASE("pipeline parallelism: messages in the activation dtype", "[pp][activation-dtype]") {
  if (g_mpi->world() != 2) return;
  auto pp_bytes = [](TrainConfig cfg, DType act) {
    cfg.spec.activation_dtype = act;
    auto be = test::test_backend();
    Pool pool(*be);
    auto comm = test::test_communicator(pool);
    Trainer t(*be, pool, *comm, cfg);
    t.step(0);
    return t.mesh().last_step_bytes()[static_cast<int>(CommAxis::pp)];
  };
  const TrainConfig cfg = pp_config(gpt2_spec(), {2, one_f_one_b, 2});
  const double f32 = pp_bytes(cfg, DType::f32), bf16 = pp_bytes(cfg, DType::bf16);
  // Each rank sends M activations (or gradients) of 2 x T x C and receives as many: half of them.
  const double messages = 2.0 * cfg.accum * 2 * double(cfg.spec.seq) * double(cfg.spec.dim) * sizeof(float);
  INFO("pp axis bytes f32 " << f32 << ", bf16 " << bf16);
  CHECK(f32 - bf16 == messages / 2);
  ModelSpec moe = model_preset("qwen3-moe-tiny");
  moe.moe.aux_coef = 0.05;
  TrainConfig m = pp_config(moe, {2, one_f_one_b, 2});
  const PartsRun wide = train_parts(m);
  m.spec.activation_dtype = DType::bf16;
  const PartsRun narrow = train_parts(m);
  REQUIRE(narrow.aux.size() == wide.aux.size());
  for (size_t i = 0; i < wide.aux.size(); ++i) {
    CHECK(narrow.losses[i] == Approx(wide.losses[i]).epsilon(2e-2));
    CHECK(narrow.aux[i] == Approx(wide.aux[i]).epsilon(2e-2));
  }
  // Step 1's statistics as f32's but for the second stage's routers reading rounded inputs: floats
  // carried in bf16 slots with a bit wrong would be far off.
  CHECK(narrow.aux.front() == Approx(wide.aux.front()).epsilon(1e-4));
}

TEST_CASE("pipeline parallelism: bad layouts are input errors naming the values", "[pp][errors]") {
  auto be = test::test_backend();
  Pool pool(*be);
  auto comm = test::test_communicator(pool);
  const int N = g_mpi->world();
  if (N < 2) return;
  auto throws_with = [&](TrainConfig cfg, const std::string& text) {
    INFO(label(cfg));
    CHECK_THROWS_AS(Trainer(*be, pool, *comm, cfg), InputError);
    CHECK_THROWS_WITH(Trainer(*be, pool, *comm, cfg), Catch::Contains(text));
  };
  const Layout two{2, one_f_one_b, 2};
  TrainConfig cfg = pp_config(gpt2_spec(), two);
  cfg.layout.dims.pp = N + 1;
  throws_with(cfg, fmt::format("--pp {} x --tp 1 x --dp-replicate 1 = {} does not divide the world of {} ranks", N + 1,
                               N + 1, N));
  // More stages than units: 2 x 3 chunks of GPT-2 tiny's 4 units.
  cfg = pp_config(gpt2_spec(), {2, interleaved, 2, StrategyKind::ddp, 1, 3});
  throws_with(cfg, "--pp 2 x --pp-virtual 3 = 6 stages, but the model has 4 units (embedding .. head): every "
                   "stage needs at least one");
  cfg = pp_config(gpt2_spec(), two);
  cfg.layout.pipeline.split = {3, 2};
  throws_with(cfg, "--pp-split 3,2 sums to 5 units, but the model has 4 (embedding .. head)");
  cfg.layout.pipeline.split = {4};
  throws_with(cfg, "--pp-split 4 gives 1 count; --pp 2 x --pp-virtual 1 needs 2 (one per chunk)");
  cfg.layout.pipeline.split = {4, 0};
  throws_with(cfg, "--pp-split 4,0: every chunk needs at least one unit");
  for (PpSchedule s : {gpipe, one_f_one_b}) {
    cfg = pp_config(gpt2_spec(), {2, s, 2, StrategyKind::ddp, 1, 2});
    throws_with(cfg, fmt::format("--pp-virtual 2 with --pp-schedule {}: only interleaved-1f1b or zb-v runs virtual stages",
                                 s.name()));
  }
  cfg = pp_config(gpt2_spec(), {2, interleaved, 2});
  throws_with(cfg, "--pp-schedule interleaved-1f1b needs --pp-virtual 2 or more");
  cfg = pp_config(gpt2_spec(), {2, interleaved, 3, StrategyKind::ddp, 1, 2});
  throws_with(cfg, "--pp-schedule interleaved-1f1b: --micro-batches 3 is not a multiple of --pp 2");
  cfg = pp_config(gpt2_spec(), two);
  cfg.strategy.kind = StrategyKind::dp;
  throws_with(cfg, "--pp 2 with --strategy dp: the single-master baseline keeps the whole model on rank 0");
  cfg = pp_config(gpt2_spec(), two);
  cfg.layout.dims.pp = 1;
  cfg.layout.pipeline.split = {2, 2};
  throws_with(cfg, "--pp-virtual 1 / --pp-split: pipeline options need --pp 2 or more");
}
