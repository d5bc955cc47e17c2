// DeepSeek-V3 against transformers' own DeepseekV3ForCausalLM (tests/reference/
// make_hf_deepseek_v3_dir.py, float64): three tiny models (3 layers, the first dense; latent attention
// with and without a query low rank, and with one and YaRN's RoPE; 8 experts in 2 groups, 2 per token, a shared expert; a non-zero
// correction bias). At one rank, the first step's loss and every gradient; on every axis (ep 2 and
// 4, zero3 over 2, ep 2 x zero3 over 4, tp 2 with and without sequence parallelism, pp 2, cp 2) ten
// AdamW steps' losses within 1e-4 of transformers' (--moe-bias-update-rate 0, as transformers
// trains); the presets' sizes; config.json both ways. Auxiliary-loss-free balancing (γ > 0): over
// 300 steps the worst layer's load falls further than at γ = 0; the biases bit-identical on every
// rank and expert-parallel degree to one rank's; a resumed run's equal to an uninterrupted one's.
// Memory: measured equals predicted at one rank and under pp 2.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>

#include "src/model/blocks/moe.hpp"
#include "src/model/deepseek/deepseek.hpp"
#include "tests/grad_check.hpp"
#include "tests/hf_reference.hpp"
#include "tests/strategy_test_util.hpp"

using namespace shardlab;
using namespace shardlab::strategy_test;

namespace {

// The third: RoPE of type yarn (its frequencies, its softmax scale), checked at one rank, tp 2 and cp 2.
const char* const kModels[] = {"hf_deepseek_v3_tiny", "hf_deepseek_v3_tiny_nolora", "hf_deepseek_v3_tiny_yarn"};
bool is_yarn(const char* name) { return std::string(name).ends_with("_yarn"); }

// transformers' buffers: no gradient in the reference (and none here: the routing is not differentiable).
bool is_bias(const std::string& name) { return name.ends_with("e_score_correction_bias"); }

// A layout the ten steps run under.
struct Axes {
  const char* what;
  int world;
  StrategyKind kind;
  int tp = 1, ep = 1, pp = 1, cp = 1;
  bool sp = false;
};

// n pseudo-random tokens below `vocab` (a fixed linear congruential sequence: every rank's alike).
std::shared_ptr<const TokenStream> random_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t x = 12345;
  for (int32_t& v : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  return std::make_shared<const TokenStream>(std::move(t), "random tokens");
}

// The correction bias of every MoE layer this rank holds (all but under --pp), in layer order
// (collective: the units are gathered); `layers` (when given) gets their layer numbers.
std::vector<float> correction_biases(Trainer& t, std::vector<int64_t>* layers = nullptr) {
  std::vector<float> out;
  for (size_t u = 0; u < t.units().size(); ++u) {
    const std::vector<float> full = t.strategy().gather_unit_params(u);
    for (const TensorDecl& d : t.units()[u]->layout().tensors)
      if (d.name.ends_with(kCorrectionBias)) {
        out.insert(out.end(), full.begin() + d.offset, full.begin() + d.offset + d.numel);
        if (layers) layers->push_back(correction_bias_layer(d));
      }
  }
  return out;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The reference model trained on random tokens with correction-bias rate `rate`.
TrainConfig balancing(const test::HfReference& ref, double rate, int64_t steps) {
  TrainConfig cfg = ref.training();
  cfg.spec.moe.bias_rate = rate;
  cfg.steps = steps;
  return cfg;
}

}  // namespace

TEST_CASE("DeepSeek-V3 forward and backward match transformers' DeepseekV3ForCausalLM", "[deepseek]") {
  if (g_mpi->world() != 1) return;
  for (const char* name : kModels) {
    INFO(name);
    test::HfReference ref(name, deepseek_spec_from_hf_config);
    CHECK(ref.spec.family == FamilyId::deepseek_v3);
    CHECK(ref.spec.mla.v != ref.spec.mla.qk());  // values of their own head dimension
    CHECK(ref.spec.mla.yarn.enabled() == is_yarn(name));
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    Model model(ref.spec, *be, pool);
    const auto [loss, want] = ref.first_step(model);
    std::printf("%s: cross-entropy %.7f vs transformers %.7f\n", name, loss, want);
    CHECK(std::fabs(loss - want) <= 2e-6 * want);
    const test::GradCheck g = test::check_grads(model, ref.file, 1e-6, 1e-4, is_bias);
    std::printf("%s: %d gradients, worst error/tolerance %.3f (%s)\n", name, g.compared, g.worst, g.worst_name.c_str());
    CHECK(g.compared == static_cast<int>(ref.file.entries().size()));  // every reference gradient
    CHECK(g.failures == 0);
  }
}

TEST_CASE("DeepSeek-V3 trains as transformers does on every axis: ten AdamW steps", "[deepseek]") {
  const int N = g_mpi->world();
  const Axes layouts[] = {
      {"one rank", 1, StrategyKind::ddp},      {"tp 2", 2, StrategyKind::ddp, 2},
      {"tp 2 with sequence parallelism", 2, StrategyKind::ddp, 2, 1, 1, 1, true},
      {"ep 2", 2, StrategyKind::ddp, 1, 2},    {"zero3 x 2", 2, StrategyKind::zero3},
      {"pp 2", 2, StrategyKind::ddp, 1, 1, 2}, {"cp 2", 2, StrategyKind::ddp, 1, 1, 1, 2},
      {"ep 4", 4, StrategyKind::ddp, 1, 4},    {"ep 2 x zero3", 4, StrategyKind::zero3, 1, 2},
  };
  for (const char* name : kModels)
    for (const Axes& a : layouts) {
      if (a.world != N) continue;
      if (is_yarn(name) && a.tp == 1 && a.cp == 1 && a.world > 1) continue;  // positions matter under tp and cp
      const test::HfReference ref(name, deepseek_spec_from_hf_config);
      TrainConfig cfg = ref.training();
      cfg.spec.moe.bias_rate = 0;  // the bias as loaded: transformers' training
      cfg.use_strategy(a.kind);
      cfg.layout.dims.tp = a.tp, cfg.layout.dims.ep = a.ep, cfg.layout.dims.pp = a.pp, cfg.layout.dims.cp = a.cp;
      cfg.layout.sequence_parallel = a.sp;
      if (a.pp > 1) cfg.accum = 2;
      RankTrainer r(cfg, std::make_shared<TokenStream>(TokenStream(ref.tokens, "deepseek reference")));
      double worst = 0;
      for (int64_t s = 0; s < ref.steps; ++s)
        worst = std::max(worst, std::fabs(r.trainer.step(s).loss - ref.ce[s]) / ref.ce[s]);
      if (g_mpi->rank() == 0)
        std::printf("%s under %s: worst relative loss error over %lld steps %.2g\n", name, a.what,
                    static_cast<long long>(ref.steps), worst);
      INFO(name << " under " << a.what);
      CHECK(worst <= 1e-4);
    }
}

TEST_CASE("the deepseek presets have the published sizes; config.json goes both ways", "[deepseek]") {
  if (g_mpi->world() != 1) return;
  // transformers' DeepseekV3ForCausalLM built on the meta device from DeepseekV3Config() (V3's
  // shape) and from V2-Lite's sizes; its parameters, without the correction biases (its buffers).
  const ModelSpec v3 = model_preset("deepseek-v3"), lite = model_preset("deepseek-v2-lite");
  CHECK(num_params(family_of(v3).layout(v3)) - 58 * 256 == 671026404352);
  CHECK(num_params(family_of(lite).layout(lite)) - 26 * 64 == 15706484224);
  const ModelSpec back = deepseek_spec_from_hf_config(deepseek_hf_config(v3));
  CHECK(back.mla == v3.mla);
  CHECK(back.moe == v3.moe);
  CHECK(back.dim == v3.dim);
  CHECK(back.ffn_dim == v3.ffn_dim);
  nlohmann::json aux = deepseek_hf_config(v3);
  aux["scoring_func"] = "softmax";
  CHECK_THROWS_WITH(deepseek_spec_from_hf_config(aux), Catch::Contains("scoring_func"));
  // YaRN both ways, and in shardlab's own spec JSON; scaled cos and sin (mscale != mscale_all_dim) refused.
  const test::HfReference yarn("hf_deepseek_v3_tiny_yarn", deepseek_spec_from_hf_config);
  CHECK(yarn.spec.mla.yarn.factor == 4.0);
  CHECK(yarn.spec.mla.yarn.original_max_positions == 8);
  CHECK(deepseek_spec_from_hf_config(deepseek_hf_config(yarn.spec)).mla == yarn.spec.mla);
  CHECK(spec_from_json(spec_to_json(yarn.spec)).mla == yarn.spec.mla);
  nlohmann::json scaled = deepseek_hf_config(yarn.spec);
  scaled["rope_parameters"]["mscale"] = 1.0;
  CHECK_THROWS_WITH(deepseek_spec_from_hf_config(scaled), Catch::Contains("attention_factor"));
}

TEST_CASE("auxiliary-loss-free balancing: the correction bias evens the experts' loads", "[deepseek]") {
  if (g_mpi->world() != 1) return;
  // The reference model's non-zero correction bias loads some experts more from the start.
  const test::HfReference ref("hf_deepseek_v3_tiny", deepseek_spec_from_hf_config);
  const int64_t steps = 300;
  const auto tokens = random_tokens(ref.B * ref.T * 64 + 1, ref.spec.vocab);
  // The worst layer's max / mean load at each step.
  auto run = [&](double rate) {
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    auto comm = make_sim_communicator(0, 1, pool);
    Trainer t(*be, pool, *comm, balancing(ref, rate, steps), tokens);
    std::vector<double> worst;
    for (int64_t s = 0; s < steps; ++s) worst.push_back(t.step(s).worst_layer_imbalance.value_or(0.0));
    return worst;
  };
  auto mean = [](const std::vector<double>& v, size_t from, size_t to) {
    return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(to),
                           0.0) / static_cast<double>(to - from);
  };
  const std::vector<double> still = run(0.0), moved = run(0.001);
  const double still0 = mean(still, 0, 20), still1 = mean(still, 200, 300);
  const double moved0 = mean(moved, 0, 20), moved1 = mean(moved, 200, 300);
  std::printf("worst layer's max/mean load, steps 1-20 -> 201-300: gamma 0 %.3f -> %.3f, gamma 0.001 %.3f -> %.3f\n",
              still0, still1, moved0, moved1);
  CHECK(still.front() == moved.front());  // the first step's routing precedes any move
  CHECK(moved1 < still1);
  CHECK(moved0 - moved1 > still0 - still1);
  CHECK(moved1 < moved0);
}

TEST_CASE("auxiliary-loss-free balancing: every rank and ep degree moves the bias bit for bit as one rank",
          "[deepseek]") {
  const int N = g_mpi->world();
  if (N == 1) return;
  const test::HfReference ref("hf_deepseek_v3_tiny", deepseek_spec_from_hf_config);
  const int64_t steps = 20;
  const auto tokens = random_tokens(ref.B * ref.T * steps + 1, ref.spec.vocab);
  const double rate = 0.01;  // larger than the paper's, so the moved bias changes the routing within 20 steps
  std::vector<float> want;
  {
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    auto comm = make_sim_communicator(0, 1, pool);
    Trainer t(*be, pool, *comm, balancing(ref, rate, steps), tokens);
    for (int64_t s = 0; s < steps; ++s) t.step(s);
    want = correction_biases(t);
  }
  const Axes layouts[] = {
      {"ddp x 2 (ep 1)", 2, StrategyKind::ddp},        {"ep 2", 2, StrategyKind::ddp, 1, 2},
      {"ep 2, zero2", 2, StrategyKind::zero2, 1, 2},    {"pp 2", 2, StrategyKind::ddp, 1, 1, 2},
      {"ep 4", 4, StrategyKind::ddp, 1, 4},             {"ep 2 x zero3", 4, StrategyKind::zero3, 1, 2},
      {"zero1 x 4", 4, StrategyKind::zero1},            {"pp 2 x ep 2", 4, StrategyKind::ddp, 1, 2, 2}};
  const size_t E = static_cast<size_t>(ref.spec.moe.experts);
  for (const Axes& a : layouts) {
    if (a.world != N) continue;
    TrainConfig cfg = balancing(ref, rate, steps);
    cfg.use_strategy(a.kind);
    cfg.layout.dims.ep = a.ep, cfg.layout.dims.pp = a.pp;
    if (a.pp > 1) cfg.accum = 2;  // two micro-batches: their loads add up before the move
    RankTrainer r(cfg, tokens);
    for (int64_t s = 0; s < steps; ++s) r.trainer.step(s);
    std::vector<int64_t> layers;
    const std::vector<float> got = correction_biases(r.trainer, &layers);
    INFO(a.what << ", rank " << g_mpi->rank());
    CHECK(got.size() == layers.size() * E);
    if (a.pp == 1) CHECK(layers.size() == 2);  // both MoE layers (1 and 2)
    std::vector<float> same;  // one rank's biases of this rank's layers
    for (int64_t l : layers) same.insert(same.end(), want.begin() + (l - 1) * E, want.begin() + l * E);
    CHECK(bitwise_equal(got, same));
  }
  // Moved: not the loaded bias (the reference's non-zero values) any more.
  RankTrainer loaded(balancing(ref, 0.0, 1), tokens);
  CHECK(!bitwise_equal(correction_biases(loaded.trainer), want));
}

TEST_CASE("auxiliary-loss-free balancing: a resumed run moves the bias as an uninterrupted one", "[deepseek]") {
  if (g_mpi->world() != 1) return;
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("shardlab_test_deepseek_bias_{}", ::getpid());
  fs::remove_all(dir);
  const test::HfReference ref("hf_deepseek_v3_tiny", deepseek_spec_from_hf_config);
  const auto tokens = random_tokens(ref.B * ref.T * 12 + 1, ref.spec.vocab);
  struct Out {
    std::vector<float> losses, biases;
  };
  // The steps from where the run starts (a checkpoint's step on resume) to `steps`; with a
  // save_dir, run() and a checkpoint at the end.
  auto train = [&](int64_t steps, const std::string& save_dir, const std::string& resume) {
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    auto comm = make_sim_communicator(0, 1, pool);
    TrainConfig cfg = balancing(ref, 0.01, steps);
    cfg.save_dir = save_dir, cfg.resume = resume;
    if (!resume.empty()) cfg.init.clear();  // the checkpoint holds the model
    Trainer t(*be, pool, *comm, cfg, tokens);
    Out out;
    if (!save_dir.empty()) {
      std::FILE* sink = std::fopen("/dev/null", "w");
      t.run(sink);
      std::fclose(sink);
    } else {
      for (int64_t s = t.start_step(); s < steps; ++s) out.losses.push_back(t.step(s).loss);
    }
    out.biases = correction_biases(t);
    return out;
  };
  const Out whole = train(12, "", "");
  const Out first = train(6, dir.string(), "");
  const Out rest = train(12, "", (dir / "step_00000006").string());
  REQUIRE(rest.losses.size() == 6);
  CHECK(!bitwise_equal(first.biases, whole.biases));  // still moving after step 6
  for (size_t i = 0; i < 6; ++i) CHECK(rest.losses[i] == whole.losses[6 + i]);
  CHECK(bitwise_equal(rest.biases, whole.biases));
  fs::remove_all(dir);
}

TEST_CASE("DeepSeek-V3's memory: measured equals predicted, allocation by allocation", "[deepseek]") {
  // The prediction routes by round robin (no values); every buffer is sized for N k rows whatever
  // the routing, so the real step's allocations are the same. With a moving correction bias (its
  // edit allocates nothing) and checkpointing of attention.
  const int N = g_mpi->world();
  if (N > 2) return;
  TrainConfig cfg;
  cfg.spec = model_preset("deepseek-v3-tiny");
  cfg.steps = 2;
  cfg.batch = 4;
  cfg.seed = 7;
  if (N == 1) {
    check_measured_is_predicted(cfg, "deepseek-v3-tiny ddp f32");
    cfg.use_strategy(StrategyKind::zero3);
    cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = DType::bf16;
    cfg.checkpointing = Checkpointing::attention;
    check_measured_is_predicted(cfg, "deepseek-v3-tiny zero3 bf16, attention checkpointed");
  } else {
    cfg.layout.dims.pp = 2;  // the auxiliary channel (with every layer's loads) between the stages
    cfg.accum = 2;
    check_measured_is_predicted(cfg, "deepseek-v3-tiny pp 2");
  }
}
