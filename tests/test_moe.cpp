// Mixture-of-experts models (Mixtral, Qwen3-MoE) against transformers' own MixtralForCausalLM and
// Qwen3MoeForCausalLM (tests/reference/make_hf_moe_dirs.py, float64): the first step's loss terms
// and every gradient of cross-entropy + router_aux_loss_coef x the load-balancing loss, ten AdamW
// steps' losses; the auxiliary loss's normalisation and the capacity rule.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "src/comm/sim_comm.hpp"
#include "src/data/data.hpp"
#include "src/model/blocks/moe.hpp"
#include "src/model/model.hpp"
#include "src/train/trainer.hpp"
#include "tests/grad_check.hpp"

using namespace shardlab;

namespace {

const std::string kRef = std::string(SHARDLAB_SOURCE_DIR) + "/tests/reference/";

struct Reference {
  explicit Reference(const std::string& name) : dir(kRef + name), file(kRef + name + ".safetensors") {
    spec = model_family(family_of_dir()).spec_from_hf_config(nlohmann::json::parse(file.metadata().at("hf_config")));
    const auto b = nlohmann::json::parse(file.metadata().at("batch"));
    B = b["B"], T = b["T"], steps = b["steps"], lr = b["lr"];
    tokens = nlohmann::json::parse(file.metadata().at("tokens")).get<std::vector<int32_t>>();
    ce = nlohmann::json::parse(file.metadata().at("ce")).get<std::vector<double>>();
    aux = nlohmann::json::parse(file.metadata().at("aux")).get<std::vector<double>>();
  }
  std::string family_of_dir() const {
    return nlohmann::json::parse(file.metadata().at("hf_config"))["model_type"].get<std::string>();
  }
  std::string dir;
  SafetensorsReader file;
  ModelSpec spec;
  int64_t B = 0, T = 0, steps = 0;
  double lr = 0;
  std::vector<int32_t> tokens;
  std::vector<double> ce, aux;
};

}  // namespace

TEST_CASE("MoE forward and backward match transformers' Mixtral and Qwen3-MoE", "[model][reference][moe]") {
  const std::string name = GENERATE(as<std::string>{}, "hf_qwen3_moe_tiny", "hf_mixtral_tiny");
  INFO("case " << name);
  Reference ref(name);
  CHECK(ref.spec.moe.experts == 4);
  CHECK(ref.spec.moe.top_k == 2);
  CHECK(ref.spec.moe.norm_topk == (name == "hf_mixtral_tiny"));
  CHECK(ref.spec.qk_norm == (name == "hf_qwen3_moe_tiny"));
  CHECK(ref.spec.head_size() == (name == "hf_qwen3_moe_tiny" ? 16 : 8));
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  Model model(ref.spec, *be, pool);
  model.load(ref.dir);  // the directory save_pretrained wrote: HF's per-expert names
  // The first batch: sequences 0 .. B-1 of T + 1 tokens.
  std::vector<int32_t> inputs, targets;
  for (int64_t j = 0; j < ref.B; ++j)
    for (int64_t t = 0; t < ref.T; ++t)
      inputs.push_back(ref.tokens[j * ref.T + t]), targets.push_back(ref.tokens[j * ref.T + t + 1]);
  const float loss = model.forward_backward(Batch{inputs.data(), targets.data(), ref.B, ref.T}, 1.f);
  const double ref_ce = std::stod(ref.file.metadata().at("loss_ce"));
  std::printf("moe reference %-18s: cross-entropy %.7f vs transformers %.7f\n", name.c_str(), loss, ref_ce);
  CHECK(std::fabs(loss - ref_ce) <= 2e-6 * ref_ce);

  const test::GradCheck g = test::check_grads(model, ref.file, 1e-6, 1e-4);
  std::printf("moe reference %-18s: %d gradients, worst error/tolerance %.3f (%s)\n", name.c_str(), g.compared,
              g.worst, g.worst_name.c_str());
  // Per layer: 2 norms, q k v o, a router, 3 per expert, and Qwen3's q_norm and k_norm; the
  // embedding, the final norm, lm_head.
  const int per_layer = 7 + 3 * 4 + (ref.spec.qk_norm ? 2 : 0);
  CHECK(g.compared == per_layer * 2 + 3);
  CHECK(g.failures == 0);
}

TEST_CASE("MoE models train as transformers does: ten AdamW steps' cross-entropy and auxiliary loss",
          "[train][reference][moe]") {
  const std::string name = GENERATE(as<std::string>{}, "hf_qwen3_moe_tiny", "hf_mixtral_tiny");
  INFO("case " << name);
  Reference ref(name);
  TrainConfig cfg;
  cfg.spec = ref.spec;
  cfg.init = ref.dir;
  cfg.steps = ref.steps;
  cfg.batch = ref.B;
  cfg.spec.seq = ref.T;
  cfg.schedule.kind = ScheduleKind::constant;
  cfg.schedule.lr = static_cast<float>(ref.lr);
  cfg.grad_clip = 0;
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  auto comm = make_sim_communicator(0, 1, pool);
  auto stream = std::make_shared<TokenStream>(TokenStream(ref.tokens, "reference"));
  Trainer t(*be, pool, *comm, cfg, stream);
  double worst_ce = 0, worst_aux = 0;
  for (int64_t s = 0; s < ref.steps; ++s) {
    const StepStats st = t.step(s);
    REQUIRE(st.aux_loss.has_value());
    worst_ce = std::max(worst_ce, std::fabs(st.loss - ref.ce[s]) / ref.ce[s]);
    worst_aux = std::max(worst_aux, std::fabs(*st.aux_loss - ref.aux[s]) / ref.aux[s]);
    std::printf("  %s step %2lld: ce %.6f vs %.6f, aux %.6f vs %.6f\n", name.c_str(), static_cast<long long>(s + 1),
                st.loss, ref.ce[s], *st.aux_loss, ref.aux[s]);
  }
  std::printf("moe training %-18s: worst relative error over %lld steps: ce %.2g, aux %.2g\n", name.c_str(),
              static_cast<long long>(ref.steps), worst_ce, worst_aux);
  CHECK(worst_ce <= 1e-4);
  CHECK(worst_aux <= 1e-4);
}

TEST_CASE("the load-balancing loss is k under uniform routing; capacity is ceil(F T k / E)", "[moe]") {
  // transformers' normalisation: E sum_e f_e P_e with f_e summing to k over the experts.
  for (const auto& [E, k] : {std::pair<int64_t, int64_t>{8, 2}, {4, 1}, {128, 8}}) {
    ModelSpec spec = model_preset("qwen3-moe-tiny");
    spec.moe.experts = E, spec.moe.top_k = k;
    MoeBalance b(spec);
    b.rows = 1024;
    for (int64_t e = 0; e < E; ++e) b.counts[e] = 1024.0 * k / E, b.prob_sums[e] = 1024.0 / E;
    b.finish(1.f / 1024);
    CHECK(b.aux == Approx(static_cast<double>(k)).epsilon(1e-12));
  }
  CHECK(blocks::moe_capacity(1.25, 4096, 2, 8) == 1280);
  CHECK(blocks::moe_capacity(1.0, 10, 1, 4) == 3);  // rounded up
}

TEST_CASE("MoE presets have the published parameter counts; configs refuse what is not computed", "[moe][family]") {
  // transformers' MixtralForCausalLM and Qwen3MoeForCausalLM built on the meta device from each
  // model's config.json on the hub.
  CHECK(num_params(family_of(model_preset("mixtral-8x7b")).layout(model_preset("mixtral-8x7b"))) == 46702792704);
  CHECK(num_params(family_of(model_preset("qwen3-30b-a3b")).layout(model_preset("qwen3-30b-a3b"))) == 30532122624);
  // Active parameters per token (the FLOPs' N): 12.88B and 3.34B as the model cards say (within
  // rounding), the embedding's lookup aside.
  const ModelSpec mx = model_preset("mixtral-8x7b"), q = model_preset("qwen3-30b-a3b");
  const auto active = [](const ModelSpec& s) {
    return (family_of(s).flops_per_token(s) - 6.0 * double(s.layers) * double(s.heads * s.head_size()) * double(s.seq)) / 6;
  };
  CHECK(active(mx) + 32000.0 * 4096 == Approx(12.88e9).epsilon(0.01));
  CHECK(active(q) + 151936.0 * 2048 == Approx(3.34e9).epsilon(0.02));
  // A config's choice shardlab does not compute is refused by name.
  Reference ref("hf_qwen3_moe_tiny");
  nlohmann::json c = nlohmann::json::parse(ref.file.metadata().at("hf_config"));
  const ModelFamily& f = model_family("qwen3_moe");
  CHECK(f.spec_from_hf_config(c).moe.experts == 4);
  nlohmann::json bad = c;
  bad["mlp_only_layers"] = {1};
  CHECK_THROWS_WITH(f.spec_from_hf_config(bad), Catch::Contains("mlp_only_layers"));
  bad = c;
  bad["use_sliding_window"] = true;
  CHECK_THROWS_WITH(f.spec_from_hf_config(bad), Catch::Contains("use_sliding_window"));
  bad = c;
  bad["num_experts"] = 8;  // beside num_local_experts 4
  CHECK_THROWS_WITH(f.spec_from_hf_config(bad), Catch::Contains("differ"));
  Reference mref("hf_mixtral_tiny");
  nlohmann::json mc = nlohmann::json::parse(mref.file.metadata().at("hf_config"));
  mc["router_jitter_noise"] = 0.1;
  CHECK_THROWS_WITH(model_family("mixtral").spec_from_hf_config(mc), Catch::Contains("router_jitter_noise"));
}
