// family.cpp — DeepSeek-V3 as a ModelFamily (deepseek.hpp): presets, config.json both ways, checks,
// FLOPs, RoPE's frequencies.
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "src/core/check.hpp"
#include "src/model/blocks/moe.hpp"
#include "src/model/deepseek/deepseek.hpp"
#include "src/model/hf_config_reader.hpp"
#include "src/model/llama/llama.hpp"

namespace shardlab {
namespace {

// Fields read or checked below. Ignored besides Llama's: the hub config's fields for DeepSeek's own
// code (aux_loss_alpha, seq_aux, ep_size, auto_map), which change nothing transformers computes.
const std::set<std::string> kKnown = {"model_type",
                                      "hidden_size",
                                      "intermediate_size",
                                      "moe_intermediate_size",
                                      "num_hidden_layers",
                                      "num_attention_heads",
                                      "num_key_value_heads",
                                      "vocab_size",
                                      "max_position_embeddings",
                                      "rms_norm_eps",
                                      "rope_theta",
                                      "rope_scaling",
                                      "rope_parameters",
                                      "tie_word_embeddings",
                                      "hidden_act",
                                      "q_lora_rank",
                                      "kv_lora_rank",
                                      "qk_nope_head_dim",
                                      "qk_rope_head_dim",
                                      "v_head_dim",
                                      "qk_head_dim",
                                      "head_dim",
                                      "n_routed_experts",
                                      "n_shared_experts",
                                      "num_experts_per_tok",
                                      "n_group",
                                      "topk_group",
                                      "norm_topk_prob",
                                      "routed_scaling_factor",
                                      "first_k_dense_replace",
                                      "rope_interleave",
                                      "attention_bias",
                                      "num_nextn_predict_layers",
                                      "output_router_logits",
                                      "moe_layer_freq",
                                      "scoring_func",
                                      "topk_method",
                                      "quantization_config",
                                      "pretraining_tp",
                                      "attention_dropout"};
const std::set<std::string>& ignored_fields() {
  static const std::set<std::string> fields = [] {
    std::set<std::string> f = llama_derived_ignored_fields();
    f.insert({"aux_loss_alpha", "seq_aux", "ep_size", "auto_map", "router_aux_loss_coef"});
    return f;
  }();
  return fields;
}

class DeepseekFamily final : public ModelFamily {
 public:
  FamilyId id() const override { return FamilyId::deepseek_v3; }
  const char* name() const override { return "deepseek_v3"; }
  std::vector<ModelPreset> presets() const override { return deepseek_presets(); }
  const char* sized_preset() const override { return "deepseek-v3-tiny"; }
  ModelSpec spec_from_hf_config(const nlohmann::json& config) const override {
    return deepseek_spec_from_hf_config(config);
  }
  nlohmann::json hf_config(const ModelSpec& spec) const override { return deepseek_hf_config(spec); }
  void check(const ModelSpec& s) const override {
    const MlaSpec& a = s.mla;
    SHARD_REQUIRE(a.enabled() && s.moe.enabled() && s.moe.sigmoid && !s.qk_norm,
                  "{}: a deepseek_v3 model has latent attention and a sigmoid-routed mixture of experts", s.name);
    SHARD_REQUIRE(s.num_kv_heads() == s.heads && s.head_size() == a.qk(),
                  "{}: latent attention gives every head its own key and value (kv_heads {} for {} heads) of "
                  "qk_nope_head_dim + qk_rope_head_dim = {} channels (head_dim {})",
                  s.name, s.num_kv_heads(), s.heads, a.qk(), s.head_size());
    SHARD_REQUIRE(s.rope_theta > 0 && !s.rope_scaling.enabled() && a.rope / 2 <= RopeFreqs::kMaxHalf,
                  "{}: RoPE with a positive base (rope_theta {}), no llama3 scaling, over at most {} channels ({})",
                  s.name, s.rope_theta, 2 * RopeFreqs::kMaxHalf, a.rope);
    SHARD_REQUIRE(!s.moe.aux_loss,
                  "{}: DeepSeek-V3 balances its experts with the router's correction bias; "
                  "transformers adds no auxiliary loss (--moe-aux-loss on is not computed for it)",
                  s.name);
  }
  std::string hf_name(const TensorDecl& t) const override { return t.name; }
  std::vector<std::string> hf_load_names(const TensorDecl& t) const override { return {t.name}; }
  double flops_per_token(const ModelSpec& s) const override { return deepseek_flops_per_token(s); }
  TokenizerKind tokenizer() const override { return TokenizerKind::hf_byte_bpe; }
  // Llama's layer (plan's time model prices the products from the spec's sizes: heads of head_dim).
  LayerCosts layer_costs() const override { return llama_family().layer_costs(); }
  // The routing statistics: the experts' loads (no auxiliary term in the objective).
  std::unique_ptr<AuxChannel> aux_channel(const ModelSpec& s) const override { return std::make_unique<MoeBalance>(s); }

 protected:
  std::vector<UnitLayout> do_layout(const ModelSpec& s, const TpConfig& tp, const EpConfig& ep) const override {
    return deepseek_layout(s, tp, ep);
  }
  std::vector<std::unique_ptr<Unit>> do_make_units(const ModelSpec& s, const TpConfig& tp,
                                                   const EpConfig& ep) const override {
    return make_deepseek_units(s, tp, ep);
  }
};

struct Shape {
  const char* name;
  int64_t L, C, H, q_rank, kv_rank, nope, rope, v, F, Fe, E, shared, k, groups, topk_groups, dense, V, T;
};

ModelSpec with(const Shape& p) {
  ModelSpec s;
  s.family = FamilyId::deepseek_v3;
  s.name = p.name, s.layers = p.L, s.dim = p.C, s.heads = p.H, s.seq = p.T, s.vocab = p.V;
  s.head_dim = p.nope + p.rope;
  s.ffn_dim = p.F, s.rope_theta = 10000, s.norm_eps = 1e-6, s.tied_head = false;
  s.mla = {p.q_rank, p.kv_rank, p.nope, p.rope, p.v, true};
  s.moe = {p.E, p.k, p.Fe, true, 0.0, false};
  s.moe.sigmoid = true, s.moe.groups = p.groups, s.moe.topk_groups = p.topk_groups, s.moe.routed_scale = 2.5;
  s.moe.shared_ffn = p.shared * p.Fe, s.moe.dense_layers = p.dense;
  s.moe.bias_rate = 0.001;  // the paper's γ
  return s;
}

const nlohmann::json& field(const nlohmann::json& j, const char* key) { return j[key]; }

}  // namespace

const ModelFamily& deepseek_v3_family() {
  static const DeepseekFamily family;
  return family;
}

std::vector<ModelPreset> deepseek_presets() {
  ModelSpec lite =
      with({"deepseek-v2-lite", 27, 2048, 16, 0, 512, 128, 64, 128, 10944, 1408, 64, 2, 6, 1, 1, 1, 102400, 4096});
  lite.moe.routed_scale = 1.0;
  ModelSpec v3 =
      with({"deepseek-v3", 61, 7168, 128, 1536, 512, 128, 64, 128, 18432, 2048, 256, 1, 8, 8, 4, 3, 129280, 4096});
  v3.mla.nextn = 1;  // its multi-token prediction module: not built (nor counted in its 671B)
  return {{with({"deepseek-v3-tiny", 3, 32, 4, 16, 16, 8, 4, 6, 64, 24, 8, 1, 2, 2, 1, 1, 256, 32}),
           "DeepSeek-V3 shape: 3 layers of 32 channels (the first dense), latent attention with a query low rank, "
           "8 experts of width 24 in 2 groups, 2 per token, a shared expert: the tests'"},
          {lite,
           "DeepSeek-V2-Lite's shape (15.7B, torchtitan's deepseek_v3 16B): 27 layers, no query low rank, 64 "
           "experts + 2 shared, 6 per token, sigmoid-routed as V3"},
          {v3,
           "DeepSeek-V3 (671B, 37B active per token), at its 4,096-token pretraining length, default RoPE"}};
}

ModelSpec deepseek_spec_from_hf_config(const nlohmann::json& j) {
  HfConfigReader c(j, "DeepSeek-V3", kKnown, ignored_fields());
  c.expect("model_type", "deepseek_v3", "this is the deepseek_v3 family");
  ModelSpec s;
  s.family = FamilyId::deepseek_v3;
  s.name = "hf-config";
  llama_read_sizes(c, s, "intermediate_size", s.ffn_dim);
  MlaSpec& a = s.mla;
  a.q_rank = c.has("q_lora_rank") ? c.integer("q_lora_rank", 1) : 0;  // null: one q_proj
  a.kv_rank = c.integer("kv_lora_rank", 1);
  a.nope = c.integer("qk_nope_head_dim", 1);
  a.rope = c.integer("qk_rope_head_dim", 2);
  a.v = c.integer("v_head_dim", 1);
  MoeSpec& m = s.moe;
  m.experts = c.integer("n_routed_experts", 1);
  m.top_k = c.integer("num_experts_per_tok", 1);
  m.ffn_dim = c.integer("moe_intermediate_size", 1);
  c.check_missing();
  llama_read_shared(j, c, s);
  llama_read_rope(j, c, s);
  a.interleave = c.flag_or("rope_interleave", true);
  s.head_dim = a.qk();
  SHARD_REQUIRE(s.kv_heads == s.heads,
                "config.json: \"num_key_value_heads\" is {}; latent attention gives each of "
                "the {} heads its own keys and values",
                s.kv_heads, s.heads);
  if (c.has("qk_head_dim"))
    SHARD_REQUIRE(field(j, "qk_head_dim") == a.qk(),
                  "config.json: \"qk_head_dim\" is {}, not qk_nope_head_dim + "
                  "qk_rope_head_dim = {}",
                  field(j, "qk_head_dim").dump(), a.qk());
  if (c.has("head_dim"))  // transformers writes the rotary part's size there
    SHARD_REQUIRE(field(j, "head_dim") == a.rope || field(j, "head_dim") == a.qk(),
                  "config.json: \"head_dim\" is {}, expected qk_rope_head_dim {} (as transformers writes it) or "
                  "qk_nope_head_dim + qk_rope_head_dim {}", field(j, "head_dim").dump(), a.rope, a.qk());
  m.sigmoid = true, m.norm_topk = c.flag_or("norm_topk_prob", true), m.aux_loss = false;
  m.groups = c.has("n_group") ? c.integer("n_group", 1) : 1;
  m.topk_groups = c.has("topk_group") ? c.integer("topk_group", 1) : 1;
  m.routed_scale = c.number_or("routed_scaling_factor", 1.0);
  m.shared_ffn = (c.has("n_shared_experts") ? c.integer("n_shared_experts", 0) : 0) * m.ffn_dim;
  m.dense_layers = c.has("first_k_dense_replace") ? c.integer("first_k_dense_replace", 0) : 0;
  m.bias_rate = 0.001;  // not a config.json field: the paper's γ (--moe-bias-update-rate)
  a.nextn = c.has("num_nextn_predict_layers") ? c.integer("num_nextn_predict_layers", 0) : 0;
  c.check_missing();
  c.expect("attention_bias", false, "no biases in the attention's projections");
  c.expect("moe_layer_freq", 1, "every layer after the dense ones has experts");
  c.expect("scoring_func", "sigmoid", "DeepSeek-V3's router scores with a sigmoid");
  c.expect("topk_method", "noaux_tc", "the router chooses by the biased scores within the best groups");
  c.expect("pretraining_tp", 1, "HF's slicing of the projections changes rounding");
  c.expect("attention_dropout", 0.0, "no dropout");
  SHARD_REQUIRE(!c.has("quantization_config"),
                "config.json: \"quantization_config\" is {}; shardlab reads f32, bf16 "
                "or f16 weights (dequantize an FP8 checkpoint first)",
                field(j, "quantization_config").dump());
  s.validate();
  return s;
}

nlohmann::json deepseek_hf_config(const ModelSpec& s) {
  const MlaSpec& a = s.mla;
  const MoeSpec& m = s.moe;
  nlohmann::json j = llama_hf_config(s);  // the sizes, rope and norm fields Llama's writer names
  for (const char* key : {"mlp_bias", "pretraining_tp"}) j.erase(key);
  j["model_type"] = "deepseek_v3";
  j["architectures"] = {"DeepseekV3ForCausalLM"};
  j["head_dim"] = a.rope;  // as transformers writes it: the rotary part
  j["qk_head_dim"] = a.qk();
  j["q_lora_rank"] = a.q_rank > 0 ? nlohmann::json(a.q_rank) : nlohmann::json();
  j["kv_lora_rank"] = a.kv_rank;
  j["qk_nope_head_dim"] = a.nope;
  j["qk_rope_head_dim"] = a.rope;
  j["v_head_dim"] = a.v;
  j["rope_interleave"] = a.interleave;
  j["moe_intermediate_size"] = m.ffn_dim;
  j["n_routed_experts"] = m.experts;
  j["n_shared_experts"] = m.shared_ffn / m.ffn_dim;
  j["num_experts_per_tok"] = m.top_k;
  j["n_group"] = m.groups;
  j["topk_group"] = m.topk_groups;
  j["norm_topk_prob"] = m.norm_topk;
  j["routed_scaling_factor"] = m.routed_scale;
  j["first_k_dense_replace"] = m.dense_layers;
  j["num_nextn_predict_layers"] = a.nextn;  // none built: the directory has no weights for them
  return j;
}

double deepseek_flops_per_token(const ModelSpec& s) {
  // Every parameter a token meets once (an untied embedding is a lookup: none), the routed experts
  // but k of each layer's E idle, the correction biases no product.
  const double embedding = s.tied_head ? 0.0 : double(s.vocab) * double(s.dim);
  const double expert = 3.0 * double(s.moe.ffn_dim) * double(s.dim);
  const double sparse = double(s.layers - s.moe.dense_layers);
  const double idle = sparse * (double(s.moe.experts - s.moe.top_k) * expert + double(s.moe.experts));
  const double n = double(num_params(deepseek_layout(s, {}, {}))) - embedding - idle;
  // Scores and values: 2 T H (qk + v) a token forward, three times with backward, half under the mask.
  return 6.0 * n + 3.0 * double(s.layers) * double(s.heads) * double(s.mla.qk() + s.mla.v) * double(s.seq);
}

RopeFreqs deepseek_rope_freqs(const ModelSpec& s) {
  ModelSpec r = s;  // Llama's frequencies over the rotary channels only
  r.head_dim = s.mla.rope;
  r.rope_scaling = {};
  return llama_rope_freqs(r);
}

}  // namespace shardlab
