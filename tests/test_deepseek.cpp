// DeepSeek-V3 against transformers' own DeepseekV3ForCausalLM (tests/reference/
// make_hf_deepseek_v3_dir.py, float64): two tiny models (3 layers, the first dense; latent attention
// with and without a query low rank; 8 experts in 2 groups, 2 per token, a shared expert; a non-zero
// correction bias). At one rank, the first step's loss and every gradient; on every axis (ep 2 and
// 4, zero3 over 2, ep 2 x zero3 over 4, tp 2 with and without sequence parallelism, pp 2, cp 2) ten
// AdamW steps' losses within 1e-4 of transformers'; the presets' sizes; config.json both ways.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "src/model/deepseek/deepseek.hpp"
#include "tests/grad_check.hpp"
#include "tests/hf_reference.hpp"
#include "tests/strategy_test_util.hpp"

using namespace shardlab;
using namespace shardlab::strategy_test;

namespace {

const char* const kModels[] = {"hf_deepseek_v3_tiny", "hf_deepseek_v3_tiny_nolora"};

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

}  // namespace

TEST_CASE("DeepSeek-V3 forward and backward match transformers' DeepseekV3ForCausalLM", "[deepseek]") {
  if (g_mpi->world() != 1) return;
  for (const char* name : kModels) {
    INFO(name);
    test::HfReference ref(name, deepseek_spec_from_hf_config);
    CHECK(ref.spec.family == FamilyId::deepseek_v3);
    CHECK(ref.spec.mla.v != ref.spec.mla.qk());  // values of their own head dimension
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
      const test::HfReference ref(name, deepseek_spec_from_hf_config);
      TrainConfig cfg = ref.training();
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
}
