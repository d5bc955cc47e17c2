// family.cpp — Mixtral and Qwen3-MoE as ModelFamilies (moe.hpp): presets, config.json both ways,
// checks, FLOPs; layout and units are Llama's (llama/), which compute spec.moe and spec.qk_norm.
#include <nlohmann/json.hpp>
#include <set>

#include "src/core/check.hpp"
#include "src/model/blocks/moe.hpp"
#include "src/model/hf_config_reader.hpp"
#include "src/model/llama/llama.hpp"
#include "src/model/moe/moe.hpp"

namespace shardlab {
namespace {

const std::set<std::string> kCommon = {
    "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters", "tie_word_embeddings", "hidden_act", "head_dim", "num_experts", "num_local_experts",
    "num_experts_per_tok", "router_aux_loss_coef", "output_router_logits", "sliding_window"};

// What both configs share: sizes, experts, rope; `expert_width` names the field of each expert's
// MLP width (Mixtral's intermediate_size, Qwen3's moe_intermediate_size).
ModelSpec read_common(const nlohmann::json& j, HfConfigReader& c, FamilyId family, const char* expert_width) {
  ModelSpec s;
  s.family = family;
  s.name = "hf-config";
  llama_read_sizes(c, s, expert_width, s.moe.ffn_dim);
  s.moe.top_k = c.integer("num_experts_per_tok", 1);
  const bool both = c.has("num_experts") && c.has("num_local_experts");
  SHARD_REQUIRE(!both || j["num_experts"] == j["num_local_experts"],
                "config.json: \"num_experts\" {} and \"num_local_experts\" {} differ", j["num_experts"].dump(),
                j["num_local_experts"].dump());
  s.moe.experts = c.integer(c.has("num_experts") ? "num_experts" : "num_local_experts", 1);
  c.check_missing();
  llama_read_shared(j, c, s);
  s.moe.aux_coef = c.number_or("router_aux_loss_coef", 0.001);
  // transformers adds router_aux_loss_coef x the balancing loss to its loss only with
  // output_router_logits (false when absent): the objective follows the config as written.
  s.moe.aux_loss = c.flag_or("output_router_logits", false);
  llama_read_head_dim(j, c, s);
  llama_read_rope(j, c, s);
  return s;
}

class MoeFamily final : public ModelFamily {
 public:
  explicit MoeFamily(FamilyId id) : id_(id) {}
  FamilyId id() const override { return id_; }
  const char* name() const override { return id_ == FamilyId::mixtral ? "mixtral" : "qwen3_moe"; }
  std::vector<ModelPreset> presets() const override {
    return id_ == FamilyId::mixtral ? mixtral_presets() : qwen3_moe_presets();
  }
  const char* sized_preset() const override { return id_ == FamilyId::mixtral ? "mixtral-tiny" : "qwen3-moe-small"; }
  ModelSpec spec_from_hf_config(const nlohmann::json& config) const override {
    return id_ == FamilyId::mixtral ? mixtral_spec_from_hf_config(config) : qwen3_moe_spec_from_hf_config(config);
  }
  nlohmann::json hf_config(const ModelSpec& spec) const override { return moe_hf_config(spec); }
  void check(const ModelSpec& s) const override {
    llama_check_rope(s);
    SHARD_REQUIRE(s.moe.enabled(), "{}: a {} model needs experts (moe.experts >= 1)", s.name, name());
    SHARD_REQUIRE(s.qk_norm == (id_ == FamilyId::qwen3_moe), "{}: {} normalises query and key heads {}", s.name, name(),
                  id_ == FamilyId::qwen3_moe ? "always" : "never");
    SHARD_REQUIRE(id_ != FamilyId::mixtral || s.moe.norm_topk, "{}: Mixtral always renormalises its top-k weights",
                  s.name);
    SHARD_REQUIRE(!s.mla.enabled() && !s.moe.sigmoid && s.moe.groups == 1 && s.moe.routed_scale == 1.0 &&
                      s.moe.shared_ffn == 0 && s.moe.dense_layers == 0,
                  "{}: {} routes every layer by a softmax over its experts, with no shared experts and plain "
                  "attention (the deepseek_v3 family has latent attention and a sigmoid router)", s.name, name());
  }
  std::string hf_name(const TensorDecl& t) const override { return t.name; }
  std::vector<std::string> hf_load_names(const TensorDecl& t) const override { return {t.name}; }
  double flops_per_token(const ModelSpec& s) const override { return moe_flops_per_token(s); }
  TokenizerKind tokenizer() const override { return TokenizerKind::hf_byte_bpe; }
  // Llama's layer (plan's time model prices the experts' products from spec.moe).
  LayerCosts layer_costs() const override { return llama_family().layer_costs(); }
  // The routing statistics behind the balancing loss (blocks/moe.hpp).
  std::unique_ptr<AuxChannel> aux_channel(const ModelSpec& s) const override { return std::make_unique<MoeBalance>(s); }

 protected:
  std::vector<UnitLayout> do_layout(const ModelSpec& s, const TpConfig& tp, const EpConfig& ep) const override {
    return llama_layout(s, tp, ep);
  }
  std::vector<std::unique_ptr<Unit>> do_make_units(const ModelSpec& s, const TpConfig& tp,
                                                   const EpConfig& ep) const override {
    return make_llama_units(s, tp, ep);
  }

 private:
  FamilyId id_;
};

ModelSpec with(FamilyId f, const char* name, int64_t L, int64_t C, int64_t H, int64_t KV, int64_t hd, int64_t T,
               int64_t V, int64_t E, int64_t k, int64_t Fe, int64_t F, double theta, double eps) {
  ModelSpec s;
  s.family = f;
  s.name = name, s.layers = L, s.dim = C, s.heads = H, s.kv_heads = KV, s.seq = T, s.vocab = V;
  s.head_dim = hd * H == C ? 0 : hd;
  s.ffn_dim = F, s.rope_theta = theta, s.norm_eps = eps, s.tied_head = false;
  s.qk_norm = f == FamilyId::qwen3_moe;
  s.moe = {E, k, Fe, true, 0.001};
  return s;
}

}  // namespace

const ModelFamily& mixtral_family() {
  static const MoeFamily family(FamilyId::mixtral);
  return family;
}
const ModelFamily& qwen3_moe_family() {
  static const MoeFamily family(FamilyId::qwen3_moe);
  return family;
}

std::vector<ModelPreset> mixtral_presets() {
  const FamilyId m = FamilyId::mixtral;
  return {{with(m, "mixtral-tiny", 2, 32, 4, 2, 8, 32, 256, 4, 2, 24, 24, 1e6, 1e-5),
           "Mixtral shape, 2 layers of 32 channels, 4 experts of width 24, 2 per token, bytes as tokens: the tests'"},
          {with(m, "mixtral-8x7b", 32, 4096, 32, 8, 128, 32768, 32000, 8, 2, 14336, 14336, 1e6, 1e-5),
           "Mixtral 8x7B (46.70B, 12.88B active per token)"}};
}

std::vector<ModelPreset> qwen3_moe_presets() {
  const FamilyId q = FamilyId::qwen3_moe;
  return {{with(q, "qwen3-moe-tiny", 2, 32, 4, 2, 16, 32, 256, 4, 2, 24, 64, 1e6, 1e-6),
           "Qwen3-MoE shape, 2 layers of 32 channels, heads of 16, 4 experts of width 24, 2 per token: the tests'"},
          {with(q, "qwen3-moe-small", 4, 256, 8, 2, 32, 256, 256, 16, 4, 128, 768, 1e6, 1e-6),
           "Qwen3-MoE shape, 4 layers of 256 channels, 16 experts of width 128, 4 per token, bytes as tokens: a "
           "laptop's demo"},
          {with(q, "qwen3-30b-a3b", 48, 2048, 32, 4, 128, 40960, 151936, 128, 8, 768, 6144, 1e6, 1e-6),
           "Qwen3-30B-A3B (30.53B, 3.34B active per token)"}};
}

ModelSpec mixtral_spec_from_hf_config(const nlohmann::json& j) {
  std::set<std::string> known = kCommon;
  known.insert("router_jitter_noise");
  HfConfigReader c(j, "Mixtral", known, llama_derived_ignored_fields());
  c.expect("model_type", "mixtral", "this is the mixtral family");
  ModelSpec s = read_common(j, c, FamilyId::mixtral, "intermediate_size");
  s.ffn_dim = s.moe.ffn_dim;  // Mixtral's one MLP width is its experts'
  s.moe.norm_topk = true;
  if (c.has("router_jitter_noise"))
    SHARD_REQUIRE(j["router_jitter_noise"] == 0 || j["router_jitter_noise"] == 0.0,
                  "config.json: \"router_jitter_noise\" is {}; shardlab's Mixtral routes without noise (0)",
                  j["router_jitter_noise"].dump());
  SHARD_REQUIRE(!c.has("sliding_window"), "config.json: \"sliding_window\" is {}; shardlab attends causally over "
                "the whole sequence (null)", j.value("sliding_window", nlohmann::json()).dump());
  s.validate();
  return s;
}

ModelSpec qwen3_moe_spec_from_hf_config(const nlohmann::json& j) {
  std::set<std::string> known = kCommon;
  known.insert({"moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                "use_sliding_window", "attention_bias"});
  HfConfigReader c(j, "Qwen3-MoE", known, llama_derived_ignored_fields());
  c.expect("model_type", "qwen3_moe", "this is the qwen3_moe family");
  ModelSpec s = read_common(j, c, FamilyId::qwen3_moe, "moe_intermediate_size");
  s.ffn_dim = c.has("intermediate_size") ? c.integer("intermediate_size", 1) : 0;  // unused: every layer is sparse
  s.qk_norm = true;
  if (c.has("norm_topk_prob")) {
    SHARD_REQUIRE(j["norm_topk_prob"].is_boolean(), "config.json: \"norm_topk_prob\" is {}, expected a bool",
                  j["norm_topk_prob"].dump());
    s.moe.norm_topk = j["norm_topk_prob"].get<bool>();
  }
  c.expect("attention_bias", false, "no biases in the attention's projections");
  c.expect("decoder_sparse_step", 1, "every layer is a mixture of experts");
  c.expect("use_sliding_window", false, "attention is causal over the whole sequence");
  if (c.has("mlp_only_layers"))
    SHARD_REQUIRE(j["mlp_only_layers"].is_array() && j["mlp_only_layers"].empty(),
                  "config.json: \"mlp_only_layers\" is {}; shardlab's Qwen3-MoE has experts in every layer ([])",
                  j["mlp_only_layers"].dump());
  s.validate();
  return s;
}

nlohmann::json moe_hf_config(const ModelSpec& s) {
  nlohmann::json j = llama_hf_config(s);  // the sizes, rope and head fields Llama's writer names
  for (const char* key : {"mlp_bias", "pretraining_tp", "attention_bias", "intermediate_size"}) j.erase(key);
  j["head_dim"] = s.head_size();
  j["num_experts_per_tok"] = s.moe.top_k;
  j["router_aux_loss_coef"] = s.moe.aux_coef;
  j["output_router_logits"] = s.moe.aux_loss;  // transformers' loss has the auxiliary term as the run's had
  j["sliding_window"] = nullptr;
  if (s.family == FamilyId::mixtral) {
    j["model_type"] = "mixtral";
    j["architectures"] = {"MixtralForCausalLM"};
    j["intermediate_size"] = s.moe.ffn_dim;
    j["num_local_experts"] = s.moe.experts;
    j["router_jitter_noise"] = 0.0;
  } else {
    j["model_type"] = "qwen3_moe";
    j["architectures"] = {"Qwen3MoeForCausalLM"};
    j["intermediate_size"] = s.ffn_hidden();
    j["moe_intermediate_size"] = s.moe.ffn_dim;
    j["num_experts"] = s.moe.experts;  // transformers 5 maps it to num_local_experts; 4.x reads it
    j["norm_topk_prob"] = s.moe.norm_topk;
    j["attention_bias"] = false;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::json::array();
    j["use_sliding_window"] = false;
  }
  return j;
}

double moe_flops_per_token(const ModelSpec& s) {
  // Llama's count less the experts a token does not meet (integers below 2^53: exact either way).
  const double expert = 3.0 * double(s.moe.ffn_dim) * double(s.dim);
  const double idle = double(s.layers) * double(s.moe.experts - s.moe.top_k) * expert;
  return llama_flops_per_token(s) - 6.0 * idle;
}

}  // namespace shardlab
