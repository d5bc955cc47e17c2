// Qwen3 dense against transformers' own Qwen3ForCausalLM (tests/reference/make_hf_qwen3_dir.py,
// float64): at one rank, the first step's loss and every gradient from the directory
// save_pretrained wrote, and ten AdamW steps' losses; under tensor parallelism (tp 2, the heads and
// their q/k norms split) the same ten steps; the preset's published size; config.json both ways.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "src/model/qwen3/qwen3.hpp"
#include "tests/grad_check.hpp"
#include "tests/hf_reference.hpp"
#include "tests/strategy_test_util.hpp"

using namespace shardlab;
using namespace shardlab::strategy_test;

namespace {
test::HfReference qwen3_reference() { return test::HfReference("hf_qwen3_tiny", qwen3_spec_from_hf_config); }
}  // namespace

TEST_CASE("Qwen3 forward and backward match transformers' Qwen3ForCausalLM", "[qwen3]") {
  if (g_mpi->world() != 1) return;
  test::HfReference ref = qwen3_reference();
  CHECK(ref.spec.family == FamilyId::qwen3);
  CHECK(ref.spec.qk_norm);
  CHECK(ref.spec.head_size() == 16);  // not hidden / heads = 8
  CHECK_FALSE(ref.spec.moe.enabled());
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  Model model(ref.spec, *be, pool);
  const auto [loss, want] = ref.first_step(model);
  std::printf("qwen3 reference: cross-entropy %.7f vs transformers %.7f\n", loss, want);
  CHECK(std::fabs(loss - want) <= 2e-6 * want);
  const test::GradCheck g = test::check_grads(model, ref.file, 1e-6, 1e-4);
  std::printf("qwen3 reference: %d gradients, worst error/tolerance %.3f (%s)\n", g.compared, g.worst,
              g.worst_name.c_str());
  CHECK(g.compared == 11 * 2 + 3);  // per layer 2 norms, q k v o, q_norm k_norm, 3 MLP; embedding, norm, head
  CHECK(g.failures == 0);
}

TEST_CASE("Qwen3 trains as transformers does: ten AdamW steps, at one rank and under tp 2", "[qwen3]") {
  const int N = g_mpi->world();
  if (N > 2) return;
  const test::HfReference ref = qwen3_reference();
  TrainConfig cfg = ref.training();
  cfg.layout.dims.tp = N;
  RankTrainer r(cfg, std::make_shared<TokenStream>(TokenStream(ref.tokens, "qwen3 reference")));
  double worst = 0;
  for (int64_t s = 0; s < ref.steps; ++s)
    worst = std::max(worst, std::fabs(r.trainer.step(s).loss - ref.ce[s]) / ref.ce[s]);
  if (g_mpi->rank() == 0)
    std::printf("qwen3 training at tp %d: worst relative loss error over %lld steps %.2g\n", N,
                static_cast<long long>(ref.steps), worst);
  CHECK(worst <= 1e-4);
}

TEST_CASE("the qwen3-8b preset has the published size; config.json goes both ways", "[qwen3]") {
  if (g_mpi->world() != 1) return;
  // transformers' Qwen3ForCausalLM built on the meta device from Qwen/Qwen3-8B's config.json.
  const ModelSpec s = model_preset("qwen3-8b");
  CHECK(num_params(family_of(s).layout(s)) == 8190735360);
  const ModelSpec back = qwen3_spec_from_hf_config(qwen3_hf_config(s));
  CHECK(back.dim == s.dim);
  CHECK(back.head_size() == 128);
  CHECK(back.num_kv_heads() == 8);
  CHECK(back.ffn_dim == s.ffn_dim);
  CHECK(back.qk_norm);
  nlohmann::json sliding = qwen3_hf_config(s);
  sliding["use_sliding_window"] = true;
  CHECK_THROWS_WITH(qwen3_spec_from_hf_config(sliding), Catch::Contains("use_sliding_window"));
}
