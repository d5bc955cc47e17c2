// The model-family registry and GPT-2's family: presets, the spec from an HF config.json, layouts
// (tensor parallelism refused until it exists), HF names, FLOPs, and the spec fields its units honour.
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "src/model/gpt2/gpt2.hpp"
#include "src/model/model.hpp"

using namespace shardlab;
using nlohmann::json;

namespace {

// Hugging Face's openai-community/gpt2 config.json, as published.
json hf_gpt2_config() {
  return json::parse(R"({
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
    "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null,
    "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
    "summary_use_proj": true, "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
    "vocab_size": 50257})");
}

// Mean loss of one forward/backward of `spec` from a fixed initialisation and batch.
float loss_of(const ModelSpec& spec) {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  Model model(spec, *be, pool);
  model.init(5);
  const int64_t B = 2, T = spec.seq;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens[i] = static_cast<int32_t>((i * 37 + 11) % spec.vocab);
    targets[i] = static_cast<int32_t>((i * 53 + 5) % spec.vocab);
  }
  return model.forward_backward(Batch{tokens.data(), targets.data(), B, T}, 1.f);
}

}  // namespace

TEST_CASE("the registry finds GPT-2 by name and from a spec, and lists its presets", "[model][family]") {
  const ModelFamily& gpt2 = model_family("gpt2");
  CHECK(&gpt2 == &gpt2_family());
  CHECK(std::string(gpt2.name()) == "gpt2");
  CHECK(model_family_names() == std::vector<std::string>{"gpt2", "llama", "mixtral", "qwen3_moe", "qwen3", "deepseek_v3"});
  CHECK_THROWS_WITH(model_family("mamba"), "unknown model family 'mamba': expected one of gpt2, llama, mixtral, qwen3_moe, qwen3, deepseek_v3");
  CHECK(&family_of(model_preset("gpt2-xl")) == &gpt2);
  std::vector<std::string> names;
  for (const ModelPreset& p : gpt2.presets()) {
    names.push_back(p.spec.name);
    CHECK_FALSE(p.help.empty());
    CHECK(p.spec.family == FamilyId::gpt2);
  }
  const std::vector<std::string> all = model_preset_names();
  REQUIRE(all.size() >= names.size());
  CHECK(std::vector<std::string>(all.begin(), all.begin() + static_cast<long>(names.size())) == names);
  CHECK_THROWS_WITH(model_preset("gpt5"), Catch::Contains("unknown model 'gpt5': expected one of tiny, small, gpt2"));
  CHECK(gpt2.tokenizer() == TokenizerKind::gpt2_bpe);
  CHECK(std::string(tokenizer_name(gpt2.tokenizer())) == "gpt2-bpe");
}

TEST_CASE("GPT-2's layout, names and FLOPs through the family", "[model][family]") {
  const ModelSpec spec = model_preset("gpt2");
  const ModelFamily& f = family_of(spec);
  const auto layout = f.layout(spec);
  const auto direct = gpt2_layout(spec);
  REQUIRE(layout.size() == direct.size());
  for (size_t u = 0; u < layout.size(); ++u) {
    CHECK(layout[u].name == direct[u].name);
    CHECK(layout[u].numel == direct[u].numel);
  }
  CHECK(num_params(layout) == 124439808);
  CHECK(f.unit_names(spec).front() == "embedding");
  CHECK(f.unit_names(spec).back() == "head");
  CHECK(f.make_units(spec).size() == 14);
  // llm.c's count: 6N + 6LCT.
  CHECK(f.flops_per_token(spec) == 6.0 * 124439808 + 6.0 * 12 * 768 * 1024);
  const TensorDecl& qkv = layout[1].find("h.0.attn.c_attn.weight");
  CHECK(f.hf_name(qkv) == "h.0.attn.c_attn.weight");
  const std::vector<std::string> load_names = {"h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.weight"};
  CHECK(f.hf_load_names(qkv) == load_names);
  CHECK_THROWS_WITH(f.layout(spec, TpConfig{1, 1}), Catch::Contains("tensor-parallel rank 1 of 1"));
  CHECK_THROWS_WITH(f.layout(spec, TpConfig{5, 0}), Catch::Contains("--tp 5 must divide the attention heads (12)"));
}

// Every element of every whole tensor is held by exactly one tensor-parallel rank, in the place
// Megatron's layout puts it, and a rank's initial values are the whole model's at those places.
TEST_CASE("tensor-parallel layouts split every tensor exactly once", "[model][family][tp]") {
  ModelSpec gpt2 = model_preset("tiny");
  gpt2.vocab = 67;  // divisible by neither 2 nor 4: padded
  ModelSpec llama = model_preset("llama-tiny");
  llama.vocab = 67;
  for (const ModelSpec& spec : {gpt2, llama}) {
    const ModelFamily& f = family_of(spec);
    const std::vector<UnitLayout> whole = f.layout(spec);
    for (int T : {2, 4}) {
      if (spec.num_kv_heads() % T != 0 || spec.heads % T != 0) continue;
      INFO(spec.name << " tp " << T);
      std::vector<std::vector<int>> seen(whole.size());
      for (size_t u = 0; u < whole.size(); ++u) seen[u].assign(static_cast<size_t>(whole[u].numel), 0);
      int64_t padding = 0;
      for (int r = 0; r < T; ++r) {
        const std::vector<UnitLayout> part = f.layout(spec, TpConfig{T, r});
        REQUIRE(part.size() == whole.size());
        for (size_t u = 0; u < part.size(); ++u) {
          std::vector<float> full_init(static_cast<size_t>(whole[u].numel)), part_init(static_cast<size_t>(part[u].numel));
          init_flat_range(whole[u], 7, 0, full_init);
          init_flat_range(part[u], 7, 0, part_init);
          for (size_t t = 0; t < part[u].tensors.size(); ++t) {
            const TensorDecl& local = part[u].tensors[t];
            const TensorDecl& full = whole[u].tensors[t];
            REQUIRE(local.name == full.name);
            CHECK(local.full_shape == full.shape);
            int64_t covered = 0;
            for (const TpRun& run : tp_runs(local, T, r)) {
              CHECK(run.local == covered);
              covered += run.len;
              for (int64_t i = 0; i < run.len; ++i) {
                const float v = part_init[static_cast<size_t>(local.offset + run.local + i)];
                if (run.full < 0) {
                  ++padding;
                  CHECK(v == 0.f);
                  continue;
                }
                ++seen[u][static_cast<size_t>(full.offset + run.full + i)];
                CHECK(v == full_init[static_cast<size_t>(full.offset + run.full + i)]);
              }
            }
            CHECK(covered == local.numel);
            if (!local.tp.split()) CHECK(local.shape == full.shape);
          }
        }
      }
      // Replicated tensors are seen T times, split ones once.
      const std::vector<UnitLayout> rank0 = f.layout(spec, TpConfig{T, 0});
      for (size_t u = 0; u < whole.size(); ++u)
        for (const TensorDecl& t : rank0[u].tensors)
          for (int64_t i = 0; i < t.numel && !t.tp.split(); ++i)
            CHECK(seen[u][static_cast<size_t>(whole[u].find(t.name).offset + i)] == T);
      for (size_t u = 0; u < whole.size(); ++u)
        for (const TensorDecl& t : rank0[u].tensors) {
          if (!t.tp.split()) continue;
          const TensorDecl& full = whole[u].find(t.name);
          int ones = 0;
          for (int64_t i = 0; i < full.numel; ++i) ones += seen[u][static_cast<size_t>(full.offset + i)] == 1;
          CHECK(ones == full.numel);
        }
      // 67 rows padded to a multiple of T, once for the tied embedding, twice when the head is untied.
      const int64_t pad_rows = (67 + T - 1) / T * T - 67;
      CHECK(padding == pad_rows * spec.dim * (spec.tied_head ? 1 : 2));
    }
  }
}

TEST_CASE("GPT-2's exported config.json reads back to the same spec", "[model][family]") {
  const ModelFamily& f = model_family("gpt2");
  for (ModelSpec p : {model_preset("gpt2"), model_preset("tiny")}) {
    p.ffn_dim = p.name == "tiny" ? 100 : 0;
    const ModelSpec s = f.spec_from_hf_config(f.hf_config(p));
    CHECK(spec_to_json(s).dump() == spec_to_json([&] {
            ModelSpec q = p;
            q.name = s.name;
            return q;
          }()).dump());
  }
}

TEST_CASE("a GPT-2 spec from an HF config.json, every bad field named", "[model][family]") {
  const ModelFamily& f = model_family("gpt2");
  const ModelSpec s = f.spec_from_hf_config(hf_gpt2_config());
  const ModelSpec p = model_preset("gpt2");
  CHECK(s.family == FamilyId::gpt2);
  CHECK((s.layers == p.layers && s.dim == p.dim && s.heads == p.heads && s.seq == p.seq && s.vocab == p.vocab));
  CHECK(s.norm_eps == 1e-5);
  CHECK(s.ffn_hidden() == 4 * 768);
  CHECK(num_params(f.layout(s)) == num_params(f.layout(p)));

  CHECK_THROWS_WITH(f.spec_from_hf_config(json{{"n_embd", 64}}),
                    "config.json: missing n_layer, n_head, vocab_size, n_positions (or n_ctx), layer_norm_epsilon");
  json c = hf_gpt2_config();
  c["rope_scaling"] = nullptr;
  c["rotary_dim"] = 64;
  CHECK_THROWS_WITH(f.spec_from_hf_config(c), Catch::Contains("unknown fields rope_scaling, rotary_dim"));
  c = hf_gpt2_config();
  c["activation_function"] = "relu";
  CHECK_THROWS_WITH(f.spec_from_hf_config(c), Catch::Contains("\"activation_function\" is \"relu\""));
  c = hf_gpt2_config();
  c["tie_word_embeddings"] = false;
  CHECK_THROWS_WITH(f.spec_from_hf_config(c), Catch::Contains("\"tie_word_embeddings\" is false"));
  c = hf_gpt2_config();
  c["n_ctx"] = 2048;
  CHECK_THROWS_WITH(f.spec_from_hf_config(c), Catch::Contains("\"n_positions\" 1024 and \"n_ctx\" 2048 differ"));
  c = hf_gpt2_config();
  c["n_head"] = 7;
  CHECK_THROWS_WITH(f.spec_from_hf_config(c), "--dim 768 is not divisible by --heads 7");
  c = hf_gpt2_config();
  c.erase("n_positions");
  c["n_ctx"] = 512;  // older configs name the positions n_ctx only
  CHECK(f.spec_from_hf_config(c).seq == 512);
  c["n_inner"] = 1000;
  CHECK(f.spec_from_hf_config(c).ffn_hidden() == 1000);
}

TEST_CASE("GPT-2's units honour the spec's MLP width and LayerNorm epsilon", "[model][family]") {
  ModelSpec spec = model_preset("tiny");
  spec.seq = 8;
  const float base = loss_of(spec);
  CHECK(std::isfinite(base));
  ModelSpec narrow = spec;
  narrow.ffn_dim = 40;  // narrower than 3C: backward's shared buffer must still hold d(qkv)
  CHECK(family_of(narrow).layout(narrow)[1].find("h.0.mlp.c_fc.weight").shape == std::vector<int64_t>{32, 40});
  const float narrow_loss = loss_of(narrow);
  CHECK(std::isfinite(narrow_loss));
  CHECK(narrow_loss != base);
  ModelSpec eps = spec;
  eps.norm_eps = 0.25;
  CHECK(loss_of(eps) != base);
  CHECK(loss_of(spec) == base);  // deterministic: the differences above are the fields'
}

TEST_CASE("gradients handed out as zeros are claimed once per tensor, across copies of the set", "[model]") {
  // A product may write a bias gradient rather than add to it only while it still holds zeros
  // (ParamSet::claim_zeroed, Backend::gemm_bias_grad): the first producer claims it, later ones add.
  UnitLayout own;
  own.name = "h.0";
  add_tensor(own, "h.0.attn.c_attn.bias", {6}, Init::zeros);
  add_tensor(own, "h.0.mlp.c_fc.bias", {8}, Init::zeros);
  ParamSet g;
  CHECK_FALSE(g.claim_zeroed("h.0.mlp.c_fc.bias"));  // nothing said zeroed: every producer adds
  g.set_zeroed(own);
  const ParamSet copy = g;
  CHECK(copy.claim_zeroed("h.0.mlp.c_fc.bias"));
  CHECK_FALSE(g.claim_zeroed("h.0.mlp.c_fc.bias"));  // the copy claimed it
  CHECK(g.claim_zeroed("h.0.attn.c_attn.bias"));
  CHECK_FALSE(g.claim_zeroed("wte.weight"));  // not the unit's own (a borrowed tensor)
}

TEST_CASE("a tensor its unit reads only through its GEMMs has no f32 view to read", "[model]") {
  // Strategy::compute_views on a GPU under mixed precision widens only what a unit reads in f32
  // (Unit::gemm_only): an f32 read of another tensor would see memory never written.
  std::vector<float> f32(4), low(4);
  ParamSet p, bf16;
  p.set("h.0.mlp.c_fc.weight", Tensor::flat(f32.data(), DType::f32, 2));
  p.set("h.0.mlp.c_fc.bias", Tensor::flat(f32.data() + 2, DType::f32, 2));
  bf16.set("h.0.mlp.c_fc.weight", Tensor::flat(low.data(), DType::bf16, 2));
  bf16.set("h.0.mlp.c_fc.bias", Tensor::flat(low.data() + 2, DType::bf16, 2));
  p.set_low(bf16, std::make_shared<const std::set<std::string>>(std::set<std::string>{"h.0.mlp.c_fc.weight"}));
  CHECK(p.gemm("h.0.mlp.c_fc.weight").data() == low.data());
  CHECK(p("h.0.mlp.c_fc.bias").data() == f32.data() + 2);
  CHECK_THROWS_WITH(p("h.0.mlp.c_fc.weight"), Catch::Contains("no f32 copy was made"));
}
