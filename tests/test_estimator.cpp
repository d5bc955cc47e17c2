// The memory prediction (the real step on the meta backend, src/train/predict) against oracles
// that share no code with it: ZeRO's model-state formulas and the activation memory of Korthikanti
// et al. 2022. (Prediction = measurement against real MPI runs is in test_strategies.cpp.)
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <tuple>
#include <nlohmann/json.hpp>

#include "shard/strategy_formulas.hpp"
#include "src/comm/sim_comm.hpp"
#include "src/model/gpt2/gpt2.hpp"
#include "src/model/unit.hpp"
#include "src/train/predict.hpp"
#include "src/plan/plan.hpp"
#include "src/compare/profile.hpp"

using namespace shardlab;

namespace {

TrainConfig config(const std::string& preset, StrategyKind s, DType dt) {
  TrainConfig c;
  c.spec = model_preset(preset);
  c.strategy.kind = s;
  c.strategy.precision.param_dtype = c.strategy.precision.reduce_dtype = dt;
  return c;
}

uint64_t category(const CategoryBytes& c, Category k) { return c[static_cast<int>(k)]; }

// Resident set size of this process, from /proc (bytes).
uint64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * 4096;
}

}  // namespace

TEST_CASE("ZeRO's worked example: 7.5B parameters on 64 ranks", "[estimator]") {
  // ZeRO paper, figure 1: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB (K = 12, GB = 1e9 bytes).
  const double psi = 7.5e9;
  CHECK(zero_model_states(StrategyKind::ddp, psi, 64) / 1e9 == Approx(120.0));
  CHECK(zero_model_states(StrategyKind::zero1, psi, 64) / 1e9 == Approx(31.4).margin(0.05));
  CHECK(zero_model_states(StrategyKind::zero2, psi, 64) / 1e9 == Approx(16.6).margin(0.05));
  CHECK(zero_model_states(StrategyKind::zero3, psi, 64) / 1e9 == Approx(1.9).margin(0.05));
}

TEST_CASE("predicted model states of gpt2-xl on 64 ranks are ZeRO's formulas, to the byte", "[estimator]") {
  const int N = 64;
  auto layout = gpt2_layout(model_preset("gpt2-xl"));
  uint64_t psi = 0, shard = 0;  // parameters, and one rank's shard of every unit (units padded to N)
  for (const auto& u : layout) {
    psi += static_cast<uint64_t>(u.numel);
    shard += static_cast<uint64_t>((u.numel + N - 1) / N);
  }
  // bf16 parameters and gradients, f32 master weights and Adam: K = 12.
  std::map<StrategyKind, uint64_t> want = {{StrategyKind::ddp, 16 * psi},
                                           {StrategyKind::zero1, 4 * shard * N + 12 * shard},
                                           {StrategyKind::zero2, 2 * shard * N + 14 * shard},
                                           {StrategyKind::zero3, 16 * shard}};
  for (auto [s, bytes] : want) {
    Estimate e = predict_step(config("gpt2-xl", s, DType::bf16), N, 0, 1, false);
    INFO(strategy_name(s));
    CHECK(e.model_state_total() == bytes);
    // Without padding this is exactly the formula; padding adds under N elements per unit.
    CHECK(double(e.model_state_total()) == Approx(zero_model_states(s, double(psi), N)).epsilon(1e-4));
  }
}

TEST_CASE("predicted activations of gpt2-xl follow Korthikanti et al. 2022", "[estimator]") {
  // Per transformer layer, f32 activations and no dropout: 64 s b h + 4 a s^2 b bytes with the naive
  // attention (the paper's 34 sbh + 5 as^2 b counts 16-bit tensors and dropout masks); the fused
  // kernel keeps a log-sum-exp per head and position instead of the probabilities: 64 s b h + 4 a s b.
  // Plus the logits, 4 s b V bytes.
  ModelSpec spec = model_preset("gpt2-xl");
  const double s = 1024, b = 4, h = double(spec.dim), a = double(spec.heads), L = double(spec.layers);
  const double logits = 4 * s * b * double(spec.vocab);
  for (AttentionKernel k : {AttentionKernel::naive, AttentionKernel::flash}) {
    const double layers = L * (64 * s * b * h + 4 * a * s * b * (k == AttentionKernel::naive ? s : 1));
    auto cfg = config("gpt2-xl", StrategyKind::zero3, DType::bf16);
    cfg.spec.attention = k;
    const double act = double(category(predict_step(cfg, 64, 0, 4, false).peak_by_category, Category::activations));
    std::printf("gpt2-xl x 4 x 1024 activations, %s attention: predicted %.3f GiB, formula + logits %.3f GiB (%+.2f%%)\n",
                attention_kernel_name(k), act / (1 << 30), (layers + logits) / (1 << 30),
                100 * (act - layers - logits) / (layers + logits));
    CHECK(act == Approx(layers + logits).epsilon(0.005));
  }
  Estimate ddp = predict_step(config("gpt2-xl", StrategyKind::ddp, DType::bf16), 64, 0, 4, false);
  Estimate z3 = predict_step(config("gpt2-xl", StrategyKind::zero3, DType::bf16), 64, 0, 4, false);
  // Activations do not shard: the same under DDP and ZeRO-3; model states shrink about 64 times.
  CHECK(category(ddp.peak_by_category, Category::activations) == category(z3.peak_by_category, Category::activations));
  CHECK(double(ddp.model_state_total()) / double(z3.model_state_total()) == Approx(64.0).epsilon(0.001));
  CHECK(z3.peak < ddp.peak);
  CHECK(ddp.peak_phase.kind == PhaseKind::backward);
}

// Korthikanti et al.'s accounting under tensor parallelism, adapted as above (f32, no dropout): a
// layer keeps its norms' inputs and outputs and its residual (ln1, x2, ln2, its output: 16 sbh)
// whole on every rank and the rest split (q/k/v, the attention output, both MLP activations: 48
// sbh/t; the probabilities 4as^2b/t) — their sbh(10 + 24/t + 5as/(ht)); with sequence parallelism
// everything splits, (64 sbh + 4as^2b)/t — their sbh(34 + 5as/h)/t. The logits: 4 s b V'/t, V'
// the vocabulary padded to a multiple of t.
TEST_CASE("predicted activations under tensor parallelism follow Korthikanti et al. 2022", "[estimator][tp]") {
  ModelSpec spec = model_preset("gpt2-large");  // 20 heads: t = 4 divides them
  const double s = 1024, b = 4, h = double(spec.dim), a = double(spec.heads), L = double(spec.layers), t = 4;
  const double Vp = std::ceil(double(spec.vocab) / t) * t;
  for (bool sp : {false, true}) {
    TrainConfig c = config("gpt2-large", StrategyKind::zero3, DType::bf16);
    c.spec.attention = AttentionKernel::naive;  // the paper's accounting keeps the probabilities
    c.layout.dims.tp = 4;
    c.layout.sequence_parallel = sp;
    const double layer = sp ? (64 * s * b * h + 4 * a * s * s * b) / t
                            : 16 * s * b * h + 48 * s * b * h / t + 4 * a * s * s * b / t;
    const double want = L * layer + 4 * s * b * Vp / t;
    const Estimate e = predict_step(c, 32, 0, 4, false);
    const double act = double(category(e.peak_by_category, Category::activations));
    std::printf("gpt2-large x 4 x 1024 at tp 4%s: predicted activations %.3f GiB, Korthikanti + logits %.3f GiB "
                "(%+.2f%%)\n", sp ? " with sequence parallelism" : "", act / (1 << 30), want / (1 << 30),
                100 * (act - want) / want);
    INFO((sp ? "sequence-parallel" : "tensor-parallel"));
    CHECK(act == Approx(want).epsilon(0.02));
  }
}

// --activation-dtype bf16: each block's saved tensors (15 sbh of them) in 2 bytes, its output (the
// residual stream the runner keeps) in f32: 30 sbh + 4 sbh, the 34 sbh of Korthikanti et al.'s 16-bit
// accounting (theirs counts dropout masks where this counts an f32 residual); the naive kernel's
// probabilities in 2 bytes (2 a s^2 b), the fused one's log-sum-exp and the norms' statistics in f32
// (4 a s b + 16 s b). The logits stay f32: 4 s b V. Against the f32 run's 64 sbh + 4 a s^2 b (naive)
// or 64 sbh (flash), the layers' share about half. The prediction's peak is in the head's backward
// (its input gradient beside everything): 0.08 GiB above the formula, as in the f32 test above, so
// 0.4-0.7% here.
TEST_CASE("--activation-dtype bf16: gpt2-xl's saved activations take 2 bytes, Korthikanti's 34 sbh", "[estimator]") {
  ModelSpec spec = model_preset("gpt2-xl");
  const double s = 1024, b = 4, h = double(spec.dim), a = double(spec.heads), L = double(spec.layers);
  const double logits = 4 * s * b * double(spec.vocab);
  for (AttentionKernel k : {AttentionKernel::naive, AttentionKernel::flash}) {
    const bool naive = k == AttentionKernel::naive;
    const double layers = L * (34 * s * b * h + (naive ? 2 * a * s * s * b : 4 * a * s * b) + 16 * s * b);
    auto cfg = config("gpt2-xl", StrategyKind::zero3, DType::bf16);
    cfg.spec.attention = k;
    const double f32 = double(category(predict_step(cfg, 64, 0, 4, false).peak_by_category, Category::activations));
    cfg.spec.activation_dtype = DType::bf16;
    const double act = double(category(predict_step(cfg, 64, 0, 4, false).peak_by_category, Category::activations));
    std::printf("gpt2-xl x 4 x 1024, %s attention, activations bf16: predicted %.3f GiB (f32 %.3f GiB, %.2fx; "
                "without the logits %.2fx), formula + logits %.3f GiB (%+.2f%%)\n", attention_kernel_name(k),
                act / (1 << 30), f32 / (1 << 30), act / f32, (act - logits) / (f32 - logits),
                (layers + logits) / (1 << 30), 100 * (act - layers - logits) / (layers + logits));
    CHECK(act == Approx(layers + logits).epsilon(0.01));
    const double half = naive ? (34 * h + 2 * a * s) / (64 * h + 4 * a * s) : 34.0 / 64;
    CHECK((act - logits) / (f32 - logits) == Approx(half).epsilon(0.02));
  }
}

// The narrowing itself: add()'s tensors rounded to nearest even in bf16 blocks (half the bytes),
// add_f32's untouched, and widened back to exactly the rounded values.
TEST_CASE("Saved narrows what add() made to bf16 and widens it back; add_f32 stays", "[estimator][activation-dtype]") {
  auto be = make_cpu_backend(BackendConfig{});
  Pool pool(*be);
  Saved saved;
  Tensor x = saved.add(pool, "x", {3, 5}), stat = saved.add_f32(pool, "x_rstd", {3});
  const std::vector<float> xs{1.f, 1.00390625f, 1.01171875f, -3.3f, 1e-8f, 65504.f, -0.f, 0.1f, 2.5f, 3.0000002f,
                              1.f / 3, -7.77f, 1e30f, 5e-39f, 42.f};  // 1 + 2^-8 and 1 + 3 * 2^-8: ties
  const std::vector<float> ss{0.3f, 1.f / 7, 9.99f};
  be->copy(x, Tensor::of(std::span<const float>(xs)));
  be->copy(stat, Tensor::of(std::span<const float>(ss)));
  CHECK(pool.ledger().current(Category::activations) == 18 * 4);
  saved.narrow(*be, pool, DType::bf16);
  CHECK(pool.ledger().current(Category::activations) == 15 * 2 + 3 * 4);
  REQUIRE(saved("x").dtype() == DType::bf16);
  CHECK(saved("x").ndim() == 2);
  CHECK(saved("x").dim(1) == 5);
  REQUIRE(saved("x_rstd").dtype() == DType::f32);
  CHECK(saved("x_rstd").data() == stat.data());
  const bf16* narrowed = saved("x").ptr<bf16>();
  CHECK(narrowed[1].bits == 0x3f80);  // the tie 1 + 2^-8 to even: 1
  CHECK(narrowed[2].bits == 0x3f82);  // 1 + 3 * 2^-8 to even: 1 + 2^-6
  saved.widen(*be, pool);
  CHECK(pool.ledger().current(Category::activations) == 18 * 4);
  REQUIRE(saved("x").dtype() == DType::f32);
  for (size_t i = 0; i < xs.size(); ++i) CHECK(saved("x").ptr<float>()[i] == float(bf16(xs[i])));
  for (size_t i = 0; i < ss.size(); ++i) CHECK(saved("x_rstd").ptr<float>()[i] == ss[i]);
  saved.clear();
  CHECK(pool.ledger().current(Category::activations) == 0);
}

TEST_CASE("predicting gpt2-xl never materialises the model", "[estimator]") {
  // 1.56B parameters: DDP's model states alone are 25 GB. The meta backend hands out addresses,
  // not memory; the process must not grow by anything near that (nor by the 6 GB of one f32 copy).
  const uint64_t before = rss_bytes();
  Estimate e = predict_step(config("gpt2-xl", StrategyKind::ddp, DType::f32), 1, 0, 8, true);
  const uint64_t grown = rss_bytes() - std::min(before, rss_bytes());
  CHECK(e.peak > (uint64_t{30} << 30));
  CHECK(grown < (uint64_t{200} << 20));
  CHECK(!e.timeline.empty());
}

TEST_CASE("offload moves ZeRO's model states to the host tier, by the formulas, to the byte", "[estimator][offload]") {
  // ZeRO-Offload: the f32 master weights, Adam's m and v (12 bytes per parameter) and the reduced
  // bf16 gradient shard (2) move to the host; ZeRO-Infinity's parameter offload moves the bf16
  // parameter shard (2) as well. What stays on the device is what the forward and backward need.
  const int N = 64;
  uint64_t psi = 0, shard = 0;
  for (const auto& u : gpt2_layout(model_preset("gpt2-xl"))) {
    psi += static_cast<uint64_t>(u.numel);
    shard += static_cast<uint64_t>((u.numel + N - 1) / N);
  }
  const uint64_t padded = shard * N;
  struct Want {
    StrategyKind s;
    Offload o;
    uint64_t device, host;
  };
  for (const Want& w : {Want{StrategyKind::zero1, Offload::optimizer, 2 * padded + 2 * padded, 14 * shard},
                        Want{StrategyKind::zero2, Offload::optimizer, 2 * padded, 14 * shard},
                        Want{StrategyKind::zero3, Offload::optimizer, 2 * shard, 14 * shard},
                        Want{StrategyKind::zero3, Offload::params, 0, 16 * shard}}) {
    TrainConfig c = config("gpt2-xl", w.s, DType::bf16);
    c.strategy.offload = w.o;
    Estimate e = predict_step(c, N, 0, 1, false);
    INFO(strategy_name(w.s) << " offload " << offload_name(w.o));
    CHECK(e.model_state_total() == w.device);
    uint64_t host = 0;
    for (uint64_t b : e.host.model_states) host += b;
    CHECK(host == w.host);
    // Nothing else moves: device + host = the strategy without offload, plus, for ZeRO-1 (whose
    // reduced shard lives inside the full gradient buffer on the device), the host's copy of it.
    const uint64_t copy = w.s == StrategyKind::zero1 ? 2 * shard : 0;
    CHECK(e.model_state_total() + host ==
          predict_step(config("gpt2-xl", w.s, DType::bf16), N, 0, 1, false).model_state_total() + copy);
  }
}

TEST_CASE("activation checkpointing removes what Korthikanti et al. say it removes", "[estimator][checkpointing]") {
  // attention drops the probabilities (4 a s^2 b bytes per layer in f32); blocks keeps one (s, b, h)
  // input per block (4 s b h) and, at the peak, one block's recomputed activations.
  ModelSpec spec = model_preset("gpt2-xl");
  const double s = 1024, b = 4, h = double(spec.dim), a = double(spec.heads), L = double(spec.layers);
  TrainConfig c = config("gpt2-xl", StrategyKind::zero3, DType::bf16);
  c.spec.attention = AttentionKernel::naive;  // the fused kernel keeps no probabilities to drop
  auto act = [&](Checkpointing k) {
    c.checkpointing = k;
    return double(category(predict_step(c, 64, 0, 4, false).peak_by_category, Category::activations));
  };
  const double none = act(Checkpointing::none), attention = act(Checkpointing::attention), blocks = act(Checkpointing::blocks);
  std::printf("gpt2-xl x 4 x 1024 activations: none %.2f GiB, attention %.2f GiB, blocks %.2f GiB\n", none / (1 << 30),
              attention / (1 << 30), blocks / (1 << 30));
  CHECK(none - attention == L * 4 * a * s * s * b);  // the peak comes before any recomputation
  CHECK(blocks < (L * 4 * s * b * h + 2 * (64 * s * b * h + 4 * a * s * s * b) + 4 * s * b * double(spec.vocab)));
  CHECK(blocks > L * 4 * s * b * h);
}

TEST_CASE("profile --device-memory names the cheapest levers that fit, and they fit", "[estimator][profile]") {
  ProfileConfig pc;
  pc.train = config("gpt2-xl", StrategyKind::ddp, DType::bf16);
  pc.world = 8;
  pc.micro_batch = 4;
  pc.budget = uint64_t{16} << 30;
  auto meta = make_meta_backend();
  ProcessGroup one{0, 1, [](Pool& pool) { return make_sim_communicator(0, 1, pool); }};
  MemoryReport r = run_profile(*meta, one, pc);
  REQUIRE(r.levers_searched);
  REQUIRE(r.levers);
  const LeverChoice& c = *r.levers;
  TrainConfig t = pc.train;
  t.strategy.kind = parse_strategy(c.strategy);
  t.checkpointing = parse_checkpointing(c.checkpointing);
  t.strategy.offload = parse_offload(c.offload);
  CHECK(c.micro_batch == 4);
  CHECK(predict_step(t, 8, 0, c.micro_batch, false).peak <= pc.budget);
  // Plain sharding is not enough at 16 GiB (38 GiB of activations), so a lever was needed.
  TrainConfig plain = pc.train;
  plain.strategy.kind = StrategyKind::zero3;
  CHECK(predict_step(plain, 8, 0, 4, false).peak > pc.budget);
  CHECK(c.checkpointing != "none");
  // Nothing fits 1 MiB: said so, not a wrong answer.
  pc.budget = 1 << 20;
  CHECK(!run_profile(*meta, one, pc).levers);
}

// plan's tests (tests/test_plan.cpp) hold its memory to the estimator's.

TEST_CASE("a step's GEMMs as the meta backend records them are GPT-2's linears and head, three each", "[estimator]") {
  StepConfig step;
  step.spec = model_preset("tiny");
  const int64_t B = 3, N = B * step.spec.seq, C = step.spec.dim, V = step.spec.vocab, L = step.spec.layers;
  std::map<std::tuple<int, int, int64_t, int64_t, int64_t>, int64_t> got, want;  // (ta, tb, m, n, k) -> calls
  for (const GemmDesc& d : step_gemms(step, 1, 0, B))
    got[{int(d.trans_a), int(d.trans_b), d.m, d.n, d.k}] += d.batch;
  const int N_ = int(Trans::N), T_ = int(Trans::T);
  // Each linear (in, out): forward, the input's gradient, the weight's gradient (Conv1D weights).
  for (auto [ic, oc] : {std::pair{C, 3 * C}, std::pair{C, C}, std::pair{C, 4 * C}, std::pair{4 * C, C}}) {
    want[{N_, N_, N, oc, ic}] += L;
    want[{N_, T_, N, ic, oc}] += L;
    want[{T_, N_, ic, oc, N}] += L;
  }
  want[{N_, T_, N, V, C}] += 1;  // logits through the tied wte
  want[{N_, N_, N, C, V}] += 1;
  want[{T_, N_, V, C, N}] += 1;
  CHECK(got == want);
}
