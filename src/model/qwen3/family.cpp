// family.cpp — Qwen3 dense as a ModelFamily (qwen3.hpp): presets, config.json both ways, checks,
// FLOPs; layout and units are Llama's (llama/), which compute spec.qk_norm and spec.head_dim.
#include <nlohmann/json.hpp>
#include <set>

#include "src/core/check.hpp"
#include "src/model/hf_config_reader.hpp"
#include "src/model/llama/llama.hpp"
#include "src/model/qwen3/qwen3.hpp"

namespace shardlab {
namespace {

// Fields read or checked below.
const std::set<std::string> kKnown = {
    "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters", "tie_word_embeddings", "hidden_act", "head_dim", "attention_bias", "use_sliding_window",
    "sliding_window"};

class Qwen3Family final : public ModelFamily {
 public:
  FamilyId id() const override { return FamilyId::qwen3; }
  const char* name() const override { return "qwen3"; }
  std::vector<ModelPreset> presets() const override { return qwen3_presets(); }
  const char* sized_preset() const override { return "qwen3-tiny"; }
  ModelSpec spec_from_hf_config(const nlohmann::json& config) const override {
    return qwen3_spec_from_hf_config(config);
  }
  nlohmann::json hf_config(const ModelSpec& spec) const override { return qwen3_hf_config(spec); }
  void check(const ModelSpec& s) const override {
    llama_check_rope(s);
    SHARD_REQUIRE(!s.moe.enabled() && s.qk_norm && !s.mla.enabled(),
                  "{}: a qwen3 model has a dense MLP and normalises its query and key heads (the qwen3_moe family "
                  "has experts)", s.name);
  }
  std::string hf_name(const TensorDecl& t) const override { return t.name; }
  std::vector<std::string> hf_load_names(const TensorDecl& t) const override { return {t.name}; }
  double flops_per_token(const ModelSpec& s) const override { return llama_flops_per_token(s); }
  TokenizerKind tokenizer() const override { return TokenizerKind::hf_byte_bpe; }
  LayerCosts layer_costs() const override { return llama_family().layer_costs(); }

 protected:
  std::vector<UnitLayout> do_layout(const ModelSpec& s, const TpConfig& tp, const EpConfig& ep) const override {
    return llama_layout(s, tp, ep);
  }
  std::vector<std::unique_ptr<Unit>> do_make_units(const ModelSpec& s, const TpConfig& tp,
                                                   const EpConfig& ep) const override {
    return make_llama_units(s, tp, ep);
  }
};

ModelSpec with(const char* name, int64_t L, int64_t C, int64_t H, int64_t KV, int64_t hd, int64_t F, int64_t T,
               int64_t V, bool tied) {
  ModelSpec s;
  s.family = FamilyId::qwen3;
  s.name = name, s.layers = L, s.dim = C, s.heads = H, s.kv_heads = KV, s.seq = T, s.vocab = V;
  s.head_dim = hd * H == C ? 0 : hd;
  s.ffn_dim = F, s.rope_theta = 1e6, s.norm_eps = 1e-6, s.tied_head = tied;
  s.qk_norm = true;
  return s;
}

}  // namespace

const ModelFamily& qwen3_family() {
  static const Qwen3Family family;
  return family;
}

std::vector<ModelPreset> qwen3_presets() {
  return {{with("qwen3-tiny", 2, 32, 4, 2, 16, 64, 32, 256, false),
           "Qwen3 shape, 2 layers of 32 channels, heads of 16, bytes as tokens: the tests'"},
          {with("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 40960, 151936, false), "Qwen3-8B (8.19B)"}};
}

ModelSpec qwen3_spec_from_hf_config(const nlohmann::json& j) {
  HfConfigReader c(j, "Qwen3", kKnown, llama_derived_ignored_fields());
  c.expect("model_type", "qwen3", "this is the qwen3 family");
  ModelSpec s;
  s.family = FamilyId::qwen3;
  s.name = "hf-config";
  llama_read_sizes(c, s, "intermediate_size", s.ffn_dim);
  c.check_missing();
  llama_read_shared(j, c, s);
  llama_read_head_dim(j, c, s);
  llama_read_rope(j, c, s);
  s.qk_norm = true;
  c.expect("attention_bias", false, "no biases in the attention's projections");
  c.expect("use_sliding_window", false, "attention is causal over the whole sequence");
  if (c.has("sliding_window"))
    SHARD_REQUIRE(j["sliding_window"].is_null() || !j.value("use_sliding_window", false),
                  "config.json: \"sliding_window\" is {} with use_sliding_window; shardlab attends causally over the "
                  "whole sequence", j["sliding_window"].dump());
  s.validate();
  return s;
}

nlohmann::json qwen3_hf_config(const ModelSpec& s) {
  nlohmann::json j = llama_hf_config(s);  // the sizes, rope and head fields Llama's writer names
  for (const char* key : {"mlp_bias", "pretraining_tp"}) j.erase(key);
  j["model_type"] = "qwen3";
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["head_dim"] = s.head_size();
  j["attention_bias"] = false;
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["max_window_layers"] = s.layers;
  return j;
}

}  // namespace shardlab
