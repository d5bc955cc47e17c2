// family.cpp — GPT-2 as a ModelFamily: presets, the spec from an HF config.json, what the units
// compute (the family's checks), HF tensor names, FLOPs per token and the tokenizer.
#include <nlohmann/json.hpp>
#include <set>

#include "src/core/check.hpp"
#include "src/model/gpt2/gpt2.hpp"
#include "src/model/hf_config_reader.hpp"

namespace shardlab {
namespace {

class Gpt2Family final : public ModelFamily {
 public:
  FamilyId id() const override { return FamilyId::gpt2; }
  const char* name() const override { return "gpt2"; }
  std::vector<ModelPreset> presets() const override { return gpt2_presets(); }
  const char* sized_preset() const override { return "small"; }
  ModelSpec spec_from_hf_config(const nlohmann::json& config) const override {
    return gpt2_spec_from_hf_config(config);
  }
  nlohmann::json hf_config(const ModelSpec& spec) const override { return gpt2_hf_config(spec); }

  void check(const ModelSpec& s) const override {
    SHARD_REQUIRE(s.num_kv_heads() == s.heads, "kv_heads {}: GPT-2 attends with as many K/V heads as heads ({})",
                  s.kv_heads, s.heads);
    SHARD_REQUIRE(s.rope_theta == 0, "rope_theta {}: GPT-2 learns its positions (wpe), it has no rotary embedding",
                  s.rope_theta);
    SHARD_REQUIRE(s.tied_head, "GPT-2's LM head is its token embedding (wte): tied_head must be true");
    SHARD_REQUIRE(!s.moe.enabled() && !s.qk_norm && s.head_dim == 0 && !s.mla.enabled(),
                  "{}: GPT-2 has a dense MLP, no query/key norms and heads of dim / heads", s.name);
  }

  // GPT-2's names are HF's; HF's GPT2LMHeadModel files prefix them with "transformer.".
  std::string hf_name(const TensorDecl& t) const override { return t.name; }
  std::vector<std::string> hf_load_names(const TensorDecl& t) const override {
    return {t.name, "transformer." + t.name};
  }
  double flops_per_token(const ModelSpec& s) const override { return gpt2_flops_per_token(s); }
  TokenizerKind tokenizer() const override { return TokenizerKind::gpt2_bpe; }
  // Two layer norms (read + write) and two bias-dropout-residuals (two reads, a write, a 1-byte
  // mask): 11 per hidden element; GeLU 2; softmax and dropout 4.5 per score (5.5 backward); the
  // lookup of the token and position embeddings and their sum 3.
  LayerCosts layer_costs() const override {
    return {.mlp_in_products = 1, .hidden_accesses = 11, .mlp_accesses = 2, .rope_accesses = 0,
            .score_accesses = 4.5, .score_accesses_bwd = 5.5, .embed_accesses = 3, .learned_positions = true};
  }

 protected:
  std::vector<UnitLayout> do_layout(const ModelSpec& s, const TpConfig& tp, const EpConfig&) const override {
    return gpt2_layout(s, tp);  // no experts: check_part refuses --ep
  }
  std::vector<std::unique_ptr<Unit>> do_make_units(const ModelSpec& s, const TpConfig& tp,
                                                   const EpConfig&) const override {
    return make_gpt2_units(s, tp);
  }
};

// Fields of HF's GPT2Config that change nothing shardlab computes: dropout (shardlab trains
// without), special token ids, the sequence-classification summary head, and bookkeeping.
const std::set<std::string> kIgnoredFields = {
    "_name_or_path", "architectures", "attn_pdrop", "bos_token_id", "embd_pdrop", "eos_token_id",
    "gradient_checkpointing", "id2label", "label2id", "pad_token_id", "resid_pdrop", "summary_activation",
    "summary_first_dropout", "summary_proj_to_labels", "summary_type", "summary_use_proj", "task_specific_params",
    "torch_dtype", "dtype", "transformers_version", "use_cache", "reorder_and_upcast_attn"};
// Fields read or checked below.
const std::set<std::string> kKnownFields = {
    "model_type", "n_embd", "n_layer", "n_head", "vocab_size", "n_positions", "n_ctx", "layer_norm_epsilon",
    "n_inner", "activation_function", "initializer_range", "tie_word_embeddings", "scale_attn_weights",
    "scale_attn_by_inverse_layer_idx", "add_cross_attention"};

}  // namespace

const ModelFamily& gpt2_family() {
  static const Gpt2Family family;
  return family;
}

std::vector<ModelPreset> gpt2_presets() {
  struct P {
    const char* name;
    int64_t L, C, H, T, V;
    const char* help;
  };
  static const P presets[] = {
      {"tiny", 2, 32, 2, 32, 256, "GPT-2 shape, 2 layers of 32 channels, bytes as tokens: the tests' model"},
      {"small", 4, 128, 4, 128, 256, "GPT-2 shape, 4 layers of 128 channels, bytes as tokens: the demo's model"},
      {"gpt2", 12, 768, 12, 1024, 50257, "GPT-2 124M"},
      {"gpt2-medium", 24, 1024, 16, 1024, 50257, "GPT-2 medium, 350M"},
      {"gpt2-large", 36, 1280, 20, 1024, 50257, "GPT-2 large, 774M"},
      {"gpt2-xl", 48, 1600, 25, 1024, 50257, "GPT-2 XL, 1.5B"}};
  std::vector<ModelPreset> out;
  for (const P& p : presets) {
    ModelSpec s;
    s.name = p.name, s.layers = p.L, s.dim = p.C, s.heads = p.H, s.seq = p.T, s.vocab = p.V;
    out.push_back({s, p.help});
  }
  return out;
}

ModelSpec gpt2_spec_from_hf_config(const nlohmann::json& j) {
  HfConfigReader c(j, "GPT-2", kKnownFields, kIgnoredFields);
  c.expect("model_type", "gpt2", "this is the gpt2 family");
  ModelSpec s;
  s.name = "hf-config";
  s.dim = c.integer("n_embd", 1);
  s.layers = c.integer("n_layer", 1);
  s.heads = c.integer("n_head", 1);
  s.vocab = c.integer("vocab_size", 2);
  if (c.has("n_positions") && c.has("n_ctx"))
    SHARD_REQUIRE(j["n_positions"] == j["n_ctx"], "config.json: \"n_positions\" {} and \"n_ctx\" {} differ",
                  j["n_positions"].dump(), j["n_ctx"].dump());
  if (c.has("n_positions") || c.has("n_ctx")) s.seq = c.integer(c.has("n_positions") ? "n_positions" : "n_ctx", 1);
  else c.add_missing("n_positions (or n_ctx)");
  s.norm_eps = c.number("layer_norm_epsilon");
  c.check_missing();
  if (c.has("n_inner")) s.ffn_dim = c.integer("n_inner", 1);
  // GPT-2's "gelu_new" is the tanh approximation, which PyTorch calls gelu_pytorch_tanh.
  if (c.has("activation_function") && j["activation_function"] != "gelu_pytorch_tanh")
    c.expect("activation_function", "gelu_new", "GELU, tanh approximation");
  c.expect("initializer_range", 0.02, "the initialisation's standard deviation");
  c.expect("tie_word_embeddings", true, "the LM head is wte");
  c.expect("scale_attn_weights", true, "scores scaled by 1/sqrt(head size)");
  c.expect("scale_attn_by_inverse_layer_idx", false, "no per-layer score scaling");
  c.expect("add_cross_attention", false, "a decoder only");
  s.validate();
  return s;
}

nlohmann::json gpt2_hf_config(const ModelSpec& s) {
  nlohmann::json j = {{"model_type", "gpt2"},
                      {"architectures", {"GPT2LMHeadModel"}},
                      {"n_embd", s.dim},
                      {"n_layer", s.layers},
                      {"n_head", s.heads},
                      {"vocab_size", s.vocab},
                      {"n_positions", s.seq},
                      {"n_ctx", s.seq},
                      {"layer_norm_epsilon", s.norm_eps},
                      {"activation_function", "gelu_new"},
                      {"initializer_range", 0.02},
                      {"tie_word_embeddings", true},
                      {"scale_attn_weights", true},
                      {"scale_attn_by_inverse_layer_idx", false},
                      {"add_cross_attention", false},
                      {"torch_dtype", "float32"}};
  if (s.ffn_dim > 0) j["n_inner"] = s.ffn_dim;
  // GPT2Config's default bos/eos is 50256 (<|endoftext|>), outside a smaller vocabulary (tiny's
  // bytes), which transformers warns about: such a model has none.
  const nlohmann::json endoftext = s.vocab > 50256 ? nlohmann::json(50256) : nlohmann::json(nullptr);
  j["bos_token_id"] = endoftext;
  j["eos_token_id"] = endoftext;
  return j;
}

double gpt2_flops_per_token(const ModelSpec& s) {
  return 6.0 * static_cast<double>(num_params(gpt2_layout(s))) + 6.0 * double(s.layers) * double(s.dim) * double(s.seq);
}

}  // namespace shardlab
