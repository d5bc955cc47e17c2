// family.cpp — DeepSeek-V3 as a ModelFamily (deepseek.hpp): presets, config.json both ways, checks,
// FLOPs, RoPE's frequencies.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>
#include <string>
#include <vector>

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
  s.mla = {p.q_rank, p.kv_rank, p.nope, p.rope, p.v, true, 0, {}};
  s.moe = {p.E, p.k, p.Fe, true, 0.0, false};
  s.moe.sigmoid = true, s.moe.groups = p.groups, s.moe.topk_groups = p.topk_groups, s.moe.routed_scale = 2.5;
  s.moe.shared_ffn = p.shared * p.Fe, s.moe.dense_layers = p.dense;
  s.moe.bias_rate = 0.001;  // the paper's γ
  return s;
}

// YaRN's fields from a rope_parameters (or rope_scaling) object of type yarn, which becomes a
// default one holding only rope_theta for Llama's reader; none for another type.
YarnSpec take_yarn(nlohmann::json& j) {
  YarnSpec y;
  const char* where = j.contains("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!j.contains(where) || !j[where].is_object()) return y;
  nlohmann::json& r = j[where];
  const std::string type = r.value("rope_type", r.value("type", std::string("default")));
  if (type != "yarn") return y;
  auto number = [&](const char* key, double fallback) {
    if (!r.contains(key) || r[key].is_null()) return fallback;
    SHARD_REQUIRE(r[key].is_number(), "config.json: \"{}\".\"{}\" is {}, expected a number", where, key,
                  r[key].dump());
    return r[key].get<double>();
  };
  SHARD_REQUIRE(r.contains("original_max_position_embeddings") && r["original_max_position_embeddings"].is_number_integer(),
                "config.json: \"{}\" of type yarn needs an integer \"original_max_position_embeddings\"", where);
  y.original_max_positions = r["original_max_position_embeddings"].get<int64_t>();
  // transformers: no factor means max_position_embeddings over the original length.
  const double positions = j.value("max_position_embeddings", 0.0);
  y.factor = number("factor", positions / static_cast<double>(y.original_max_positions));
  SHARD_REQUIRE(y.factor >= 1, "config.json: \"{}\" of type yarn has factor {} (or none, and "
                "max_position_embeddings over original_max_position_embeddings {} gives it): expected 1 or more",
                where, y.factor, y.original_max_positions);
  y.mscale = number("mscale", 0), y.mscale_all_dim = number("mscale_all_dim", 0);
  y.beta_fast = number("beta_fast", 32), y.beta_slow = number("beta_slow", 1);
  if (y.beta_fast == 0) y.beta_fast = 32;  // transformers: `or 32`, `or 1`
  if (y.beta_slow == 0) y.beta_slow = 1;
  if (r.contains("truncate")) {
    SHARD_REQUIRE(r["truncate"].is_boolean(), "config.json: \"{}\".\"truncate\" is {}, expected a bool", where,
                  r["truncate"].dump());
    y.truncate = r["truncate"].get<bool>();
  }
  // The cos and sin are scaled by attention_factor in transformers; shardlab's RoPE does not scale
  // them, so only the configs where it is 1 (DeepSeek's: mscale equal to mscale_all_dim) load.
  const auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  const double attention_factor = number("attention_factor", y.mscale != 0 && y.mscale_all_dim != 0
                                                                 ? get_mscale(y.factor, y.mscale) /
                                                                       get_mscale(y.factor, y.mscale_all_dim)
                                                                 : get_mscale(y.factor, 1.0));
  SHARD_REQUIRE(attention_factor == 1.0,
                "config.json: \"{}\" of type yarn scales RoPE's cos and sin by attention_factor {} (factor {}, mscale "
                "{}, mscale_all_dim {}); shardlab computes YaRN where that factor is 1 (mscale equal to "
                "mscale_all_dim, as DeepSeek-V3's and V2's configs)", where, attention_factor, y.factor, y.mscale,
                y.mscale_all_dim);
  std::vector<std::string> unknown;
  for (auto it = r.begin(); it != r.end(); ++it)
    if (!std::set<std::string>{"rope_type", "type", "rope_theta", "factor", "mscale", "mscale_all_dim", "beta_fast",
                               "beta_slow", "original_max_position_embeddings", "truncate", "attention_factor"}
             .count(it.key()))
      unknown.push_back(it.key());
  SHARD_REQUIRE(unknown.empty(), "config.json: \"{}\" of type yarn: fields {} are not computed by shardlab", where,
                join_names(unknown));
  nlohmann::json plain = {{"rope_type", "default"}};
  if (r.contains("rope_theta")) plain["rope_theta"] = r["rope_theta"];
  r = plain;
  return y;
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

ModelSpec deepseek_spec_from_hf_config(const nlohmann::json& config) {
  nlohmann::json j = config;
  const YarnSpec yarn = take_yarn(j);
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
  a.yarn = yarn;
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
  if (const YarnSpec& y = a.yarn; y.enabled()) {
    j["rope_parameters"] = {{"rope_type", "yarn"},
                            {"rope_theta", s.rope_theta},
                            {"factor", y.factor},
                            {"mscale", y.mscale},
                            {"mscale_all_dim", y.mscale_all_dim},
                            {"beta_fast", y.beta_fast},
                            {"beta_slow", y.beta_slow},
                            {"original_max_position_embeddings", y.original_max_positions},
                            {"truncate", y.truncate}};
    j.erase("rope_theta"), j.erase("rope_scaling");
  }
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
  RopeFreqs f = llama_rope_freqs(r);
  const YarnSpec& y = s.mla.yarn;
  if (!y.enabled()) return f;
  // transformers' _compute_yarn_parameters, each tensor step in f32 as torch computes it (Python
  // scalars meet f32 tensors as f32); the band's ends in double, as Python's math.
  const int64_t dim = s.mla.rope;
  const double base = s.rope_theta;
  const auto correction = [&](double rotations) {
    return double(dim) * std::log(double(y.original_max_positions) / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(base));
  };
  double low = correction(y.beta_fast), high = correction(y.beta_slow);
  if (y.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;  // transformers: no singularity
  const auto factor = static_cast<float>(y.factor), lo = static_cast<float>(low), span = static_cast<float>(high - low);
  for (int64_t i = 0; i < f.half; ++i) {
    const float pos = std::pow(static_cast<float>(base), static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extrapolation = 1.f / pos, interpolation = 1.f / (factor * pos);
    const float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.f, 1.f);
    const float kept = 1.f - ramp;  // transformers' inv_freq_extrapolation_factor
    // This file is compiled with -ffp-contract=off (CMakeLists.txt): torch rounds each product.
    f.inv_freq[i] = interpolation * (1.f - kept) + extrapolation * kept;
  }
  return f;
}

}  // namespace shardlab
