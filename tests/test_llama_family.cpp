// Llama's family: presets with the published parameter counts, the layout in HF's names and
// shapes, FLOPs, the spec from an HF config.json (both rope forms, every bad field named) and back,
// the spec's JSON form with RoPE scaling, and what the family's check refuses.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "src/model/llama/llama.hpp"
#include "src/model/model.hpp"

using namespace shardlab;
using nlohmann::json;

namespace {

// meta-llama/Llama-3.1-8B's config.json, in the form published (classic rope_theta + rope_scaling).
json llama31_8b_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})");
}

// meta-llama/Llama-2-7b-hf's: no num_key_value_heads, no rope_theta (HF's defaults apply).
json llama2_7b_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "tie_word_embeddings": false,
    "torch_dtype": "float16", "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})");
}

// The shape of a small Llama as transformers 5 writes its config.json (rope_parameters).
json transformers5_config() {
  return json::parse(R"({
    "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "head_dim": 8,
    "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 88,
    "max_position_embeddings": 32, "mlp_bias": false, "model_type": "llama", "num_attention_heads": 4,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": null, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "tie_word_embeddings": false, "transformers_version": "5.23.0", "use_cache": true, "vocab_size": 256})");
}

ModelSpec named(ModelSpec s, const std::string& name) {
  s.name = name;
  return s;
}

}  // namespace

TEST_CASE("Llama's presets have the published parameter counts", "[model][family][llama]") {
  // transformers' LlamaForCausalLM built on the meta device from each model's config.json
  // (tied parameters once): the counts the model cards give.
  const std::map<std::string, int64_t> published = {
      {"llama2-7b", 6738415616},       {"llama3-8b", 8030261248},         {"llama3-70b", 70553706496},
      {"llama3-405b", 405853388800},   {"tinyllama-1.1b", 1100048384},    {"smollm-135m", 134515008},
      {"llama3.2-1b", 1235814400}};
  const ModelFamily& f = model_family("llama");
  for (const auto& [name, count] : published) {
    INFO(name);
    const ModelSpec s = model_preset(name);
    CHECK(&family_of(s) == &f);
    CHECK(num_params(f.layout(s)) == count);
  }
  std::set<std::string> names;
  for (const ModelPreset& p : f.presets()) {
    CHECK(p.spec.family == FamilyId::llama);
    CHECK_FALSE(p.help.empty());
    CHECK_NOTHROW(p.spec.validate());
    names.insert(p.spec.name);
  }
  CHECK(names.count("llama-tiny") == 1);
  CHECK(names.count("llama-small") == 1);
  // One registry for every family's presets: no name twice.
  const std::vector<std::string> all = model_preset_names();
  CHECK(std::set<std::string>(all.begin(), all.end()).size() == all.size());
  CHECK(model_preset("llama3-405b").rope_scaling == RopeScaling{8.0, 1.0, 4.0, 8192});
  CHECK(f.tokenizer() == TokenizerKind::hf_byte_bpe);
}

TEST_CASE("Llama's layout: HF's names and shapes, a tied head borrowing the embedding", "[model][family][llama]") {
  const ModelFamily& f = model_family("llama");
  const ModelSpec s = model_preset("llama3-8b");
  const auto layout = f.layout(s);
  REQUIRE(layout.size() == 34);
  CHECK(f.unit_names(s).front() == "embedding");
  CHECK(layout[1].name == "layers.0");
  CHECK(f.unit_names(s).back() == "head");
  const auto shape = [&](size_t u, const char* name) { return layout[u].find(name).shape; };
  using S = std::vector<int64_t>;
  CHECK(shape(0, "model.embed_tokens.weight") == S{128256, 4096});
  CHECK(shape(1, "model.layers.0.self_attn.q_proj.weight") == S{4096, 4096});
  CHECK(shape(1, "model.layers.0.self_attn.k_proj.weight") == S{1024, 4096});
  CHECK(shape(1, "model.layers.0.self_attn.v_proj.weight") == S{1024, 4096});
  CHECK(shape(1, "model.layers.0.self_attn.o_proj.weight") == S{4096, 4096});
  CHECK(shape(1, "model.layers.0.mlp.gate_proj.weight") == S{14336, 4096});
  CHECK(shape(1, "model.layers.0.mlp.up_proj.weight") == S{14336, 4096});
  CHECK(shape(1, "model.layers.0.mlp.down_proj.weight") == S{4096, 14336});
  CHECK(shape(1, "model.layers.0.input_layernorm.weight") == S{4096});
  CHECK(shape(1, "model.layers.0.post_attention_layernorm.weight") == S{4096});
  CHECK(shape(32, "model.layers.31.mlp.down_proj.weight") == S{4096, 14336});
  CHECK(shape(33, "model.norm.weight") == S{4096});
  CHECK(shape(33, "lm_head.weight") == S{128256, 4096});
  const TensorDecl& q = layout[1].find("model.layers.0.self_attn.q_proj.weight");
  CHECK((q.decay && q.init == Init::normal && q.std == 0.02f));
  const TensorDecl& norm = layout[1].find("model.layers.0.input_layernorm.weight");
  CHECK((!norm.decay && norm.init == Init::ones));
  CHECK(f.hf_name(q) == "model.layers.0.self_attn.q_proj.weight");
  CHECK(f.hf_load_names(q) == std::vector<std::string>{"model.layers.0.self_attn.q_proj.weight"});
  CHECK(f.make_units(s).back()->borrowed().empty());

  const ModelSpec tied = model_preset("smollm-135m");
  const auto units = f.make_units(tied);
  CHECK(units.back()->layout().tensors.size() == 1);  // model.norm only
  CHECK(units.back()->borrowed() == std::vector<std::string>{"model.embed_tokens.weight"});
  const auto borrowed = borrowed_tensors(units, units.size() - 1);
  REQUIRE(borrowed.size() == 1);
  CHECK(borrowed[0].owner == 0);
  // Recomputable layers, so --activation-checkpointing blocks applies; not the embedding or head.
  CHECK(units[1]->recomputable());
  CHECK_FALSE(units.front()->recomputable());
  CHECK_FALSE(units.back()->recomputable());
}

TEST_CASE("Llama's FLOPs per token: 6N + 6LCT, an untied embedding's lookup not counted", "[model][family][llama]") {
  const ModelFamily& f = model_family("llama");
  const ModelSpec s = model_preset("llama3-8b");
  const double n = 8030261248.0 - 128256.0 * 4096;  // the untied embedding: a lookup, no product
  CHECK(f.flops_per_token(s) == 6.0 * n + 6.0 * 32 * 4096 * 8192);
  const ModelSpec tied = model_preset("smollm-135m");  // the tied matrix counts once, as GPT-2's wte
  CHECK(f.flops_per_token(tied) == 6.0 * 134515008 + 6.0 * 30 * 576 * 2048);
}

TEST_CASE("a Llama spec from published config.json files, both rope forms", "[model][family][llama]") {
  const ModelFamily& f = model_family("llama");
  const ModelSpec l31 = f.spec_from_hf_config(llama31_8b_config());
  CHECK(l31.family == FamilyId::llama);
  const ModelSpec l3 = model_preset("llama3-8b");
  CHECK((l31.layers == l3.layers && l31.dim == l3.dim && l31.heads == l3.heads && l31.kv_heads == 8 &&
         l31.ffn_dim == 14336 && l31.vocab == l3.vocab && l31.rope_theta == 500000 && !l31.tied_head));
  CHECK(l31.seq == 131072);
  CHECK(l31.rope_scaling == RopeScaling{8.0, 1.0, 4.0, 8192});
  CHECK(num_params(f.layout(l31)) == 8030261248);

  const ModelSpec l2 = f.spec_from_hf_config(llama2_7b_config());
  CHECK(num_params(f.layout(l2)) == 6738415616);
  CHECK(l2.rope_theta == 10000);  // absent: HF's default base
  CHECK_FALSE(l2.rope_scaling.enabled());
  json old = llama2_7b_config();
  old.erase("num_key_value_heads");  // Llama 1's configs: every head its own K/V
  CHECK(f.spec_from_hf_config(old).num_kv_heads() == 32);
  old.erase("rms_norm_eps");
  CHECK(f.spec_from_hf_config(old).norm_eps == 1e-6);  // HF's default

  const ModelSpec t5 = f.spec_from_hf_config(transformers5_config());
  ModelSpec tiny = model_preset("llama-tiny");
  CHECK(spec_to_json(t5) == spec_to_json(named(tiny, t5.name)));
  // transformers 5's form with llama3 scaling, and its older "type" key.
  json c = transformers5_config();
  c["max_position_embeddings"] = 512;
  c["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 10000.0}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 256}};
  CHECK(f.spec_from_hf_config(c).rope_scaling == RopeScaling{8.0, 1.0, 4.0, 256});
  c["rope_parameters"].erase("original_max_position_embeddings");  // HF falls back to max_position_embeddings
  CHECK(f.spec_from_hf_config(c).rope_scaling.original_max_positions == 512);
  json typed = llama31_8b_config();
  typed["rope_scaling"].erase("rope_type");
  typed["rope_scaling"]["type"] = "llama3";
  CHECK(f.spec_from_hf_config(typed).rope_scaling.factor == 8.0);
}

TEST_CASE("a Llama config.json: every missing, unknown or unsupported field named", "[model][family][llama]") {
  const ModelFamily& f = model_family("llama");
  CHECK_THROWS_WITH(f.spec_from_hf_config(json{{"model_type", "llama"}, {"hidden_size", 64}}),
                    "config.json: missing intermediate_size, num_hidden_layers, num_attention_heads, vocab_size, "
                    "max_position_embeddings");
  auto refused = [&](const char* key, json value) {
    json c = llama31_8b_config();
    c[key] = std::move(value);
    try {
      f.spec_from_hf_config(c);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(refused("attention_bias", true), Catch::Contains("\"attention_bias\" is true"));
  CHECK_THAT(refused("mlp_bias", true), Catch::Contains("\"mlp_bias\" is true"));
  CHECK_THAT(refused("hidden_act", "gelu"), Catch::Contains("\"hidden_act\" is \"gelu\""));
  CHECK_THAT(refused("head_dim", 256), Catch::Contains("\"head_dim\" is 256; shardlab's Llama needs hidden_size / "
                                                       "num_attention_heads = 128"));
  CHECK_THAT(refused("pretraining_tp", 2), Catch::Contains("\"pretraining_tp\" is 2"));
  CHECK_THAT(refused("model_type", "mistral"), Catch::Contains("\"model_type\" is \"mistral\""));
  CHECK_THAT(refused("sliding_window", 4096), Catch::Contains("unknown fields sliding_window"));
  CHECK_THAT(refused("rope_scaling", json{{"rope_type", "yarn"}, {"factor", 4.0}}),
             Catch::Contains("\"rope_scaling\" has type \"yarn\""));
  CHECK_THAT(refused("rope_scaling", json{{"rope_type", "llama3"}, {"factor", 8.0}}),
             Catch::Contains("needs a number \"low_freq_factor\""));
  CHECK_THAT(refused("rope_parameters", json{{"rope_type", "default"}, {"rope_theta", 1.0}}),
             Catch::Contains("both \"rope_parameters\" and \"rope_scaling\""));
  CHECK_THAT(refused("num_key_value_heads", 5), Catch::Contains("kv_heads 5: must divide heads 32"));
  json c = transformers5_config();
  c["rope_parameters"]["partial_rotary_factor"] = 0.5;
  CHECK_THROWS_WITH(f.spec_from_hf_config(c), Catch::Contains("fields partial_rotary_factor are not computed"));
  c = transformers5_config();
  c["rope_theta"] = 500000.0;
  CHECK_THROWS_WITH(f.spec_from_hf_config(c), Catch::Contains("\"rope_theta\" 500000.0 and \"rope_parameters\".\"rope_theta\" 10000.0 differ"));
}

TEST_CASE("Llama's exported config.json reads back to the same spec", "[model][family][llama]") {
  const ModelFamily& f = model_family("llama");
  for (const ModelPreset& p : f.presets()) {
    INFO(p.spec.name);
    const json config = f.hf_config(p.spec);
    CHECK(config["model_type"] == "llama");
    CHECK(config["architectures"] == json{"LlamaForCausalLM"});
    const ModelSpec s = f.spec_from_hf_config(config);
    CHECK(spec_to_json(s) == spec_to_json(named(p.spec, s.name)));
  }
}

TEST_CASE("the spec's JSON carries RoPE scaling; GPT-2's reads as before", "[model][family][llama]") {
  const ModelSpec big = model_preset("llama3-405b");
  const json j = spec_to_json(big);
  CHECK(j["family"] == "llama");
  CHECK(j["rope_scaling"] == json{{"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                  {"original_max_position_embeddings", 8192}});
  CHECK(spec_to_json(spec_from_json(j)) == j);
  CHECK(spec_to_json(spec_from_json(spec_to_json(model_preset("smollm-135m")))) ==
        spec_to_json(model_preset("smollm-135m")));
  const ModelSpec gpt2 = model_preset("gpt2");
  CHECK(spec_to_json(gpt2).dump() ==
        R"({"dim":768,"family":"gpt2","heads":12,"layers":12,"name":"gpt2","seq":1024,"vocab":50257})");
  CHECK(gpt2.describe() == "gpt2 (L=12 C=768 H=12 T=1024 V=50257, 124.44M params)");
  CHECK(model_preset("llama3-8b").describe() ==
        "llama3-8b (L=32 C=4096 H=32 KV=8 F=14336 T=8192 V=128256, RoPE theta 500000, untied head, 8030.26M params)");
  CHECK(big.describe() == "llama3-405b (L=126 C=16384 H=128 KV=8 F=53248 T=131072 V=128256, RoPE theta 500000 "
                          "scaled llama3 x8 (1, 4, 8192), untied head, 405853.39M params)");

  json bad = j;
  bad["rope_scaling"]["high_freq_factor"] = 0.5;
  CHECK_THROWS_WITH(spec_from_json(bad), Catch::Contains("need factor > 0, 0 < low_freq_factor < high_freq_factor"));
  bad = j;
  bad["rope_scaling"]["beta"] = 1;
  CHECK_THROWS_WITH(spec_from_json(bad), Catch::Contains("unknown field \"beta\""));
  // GPT-2 has no rotary embedding to scale.
  json g = spec_to_json(gpt2);
  g["rope_scaling"] = j["rope_scaling"];
  CHECK_THROWS_WITH(spec_from_json(g), Catch::Contains("rope_scaling needs a rotary embedding: rope_theta is 0"));
}

TEST_CASE("the Llama family refuses what its units do not compute", "[model][family][llama]") {
  ModelSpec s = model_preset("llama-tiny");
  s.rope_theta = 0;
  CHECK_THROWS_WITH(s.validate(), Catch::Contains("rope_theta 0: Llama rotates its queries and keys"));
  s = model_preset("llama-tiny");
  s.heads = 32;  // head size 1
  s.kv_heads = 0;
  CHECK_THROWS_WITH(s.validate(), Catch::Contains("head size 1 (--dim 32 / --heads 32): RoPE needs an even head size"));
  // GPT-2 refuses grouped heads, RoPE and an untied head (its check, unchanged).
  ModelSpec g = model_preset("tiny");
  g.tied_head = false;
  CHECK_THROWS_WITH(g.validate(), Catch::Contains("tied_head must be true"));
}

TEST_CASE("RoPE frequencies: HF's inv_freq, and Llama 3.1's bands", "[model][family][llama]") {
  ModelSpec s = model_preset("llama-tiny");  // head size 8
  RopeFreqs f = llama_rope_freqs(s);
  REQUIRE(f.half == 4);
  for (int i = 0; i < 4; ++i) CHECK(f.inv_freq[i] == Approx(std::pow(10000.0, -2.0 * i / 8)).epsilon(3e-7));
  // Llama 3.1 405B's head size 128, theta 500000, factor 8 over an 8192 context: long wavelengths
  // (past 8192) divided by 8, short ones (below 2048) kept, between them interpolated.
  const ModelSpec big = model_preset("llama3-405b");
  ModelSpec plain = big;
  plain.rope_scaling = {};
  const RopeFreqs scaled = llama_rope_freqs(big), unscaled = llama_rope_freqs(plain);
  REQUIRE(scaled.half == 64);
  int kept = 0, divided = 0, between = 0;
  for (int i = 0; i < 64; ++i) {
    const double inv = unscaled.inv_freq[i], wavelen = 2 * M_PI / inv;
    if (wavelen < 2048) {
      CHECK(scaled.inv_freq[i] == unscaled.inv_freq[i]);
      ++kept;
    } else if (wavelen > 8192) {
      CHECK(scaled.inv_freq[i] == Approx(inv / 8).epsilon(1e-6));
      ++divided;
    } else {
      const double smooth = (8192 / wavelen - 1) / 3;
      CHECK(scaled.inv_freq[i] == Approx((1 - smooth) * inv / 8 + smooth * inv).epsilon(1e-6));
      ++between;
    }
  }
  CHECK((kept > 0 && divided > 0 && between > 0));
  // Bit for bit as transformers 5.23 computes it (LlamaRotaryEmbedding's inv_freq for this config):
  // an interpolated frequency, where a fused multiply-add would land one ulp lower.
  CHECK(scaled.inv_freq[29] == 0.0021665706299245358f);
}
