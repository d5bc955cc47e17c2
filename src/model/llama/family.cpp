// family.cpp — Llama as a ModelFamily: presets, the spec from an HF config.json and back, what the
// units compute (the family's checks), HF tensor names, RoPE frequencies, FLOPs per token and the
// tokenizer.
#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>

#include "src/core/check.hpp"
#include "src/core/suggest.hpp"
#include "src/model/hf_config_reader.hpp"
#include "src/model/llama/llama.hpp"

namespace shardlab {
namespace {

class LlamaFamily final : public ModelFamily {
 public:
  FamilyId id() const override { return FamilyId::llama; }
  const char* name() const override { return "llama"; }
  std::vector<ModelPreset> presets() const override { return llama_presets(); }
  const char* sized_preset() const override { return "llama-small"; }
  ModelSpec spec_from_hf_config(const nlohmann::json& config) const override {
    return llama_spec_from_hf_config(config);
  }
  nlohmann::json hf_config(const ModelSpec& spec) const override { return llama_hf_config(spec); }

  void check(const ModelSpec& s) const override {
    llama_check_rope(s);
    SHARD_REQUIRE(!s.moe.enabled() && !s.qk_norm && s.head_dim == 0 && !s.mla.enabled(),
                  "{}: a llama model has a dense MLP, no query/key norms and heads of dim / heads (the mixtral and "
                  "qwen3_moe families have experts)", s.name);
  }

  // The layout's names are HF's LlamaForCausalLM state-dict names.
  std::string hf_name(const TensorDecl& t) const override { return t.name; }
  std::vector<std::string> hf_load_names(const TensorDecl& t) const override { return {t.name}; }
  double flops_per_token(const ModelSpec& s) const override { return llama_flops_per_token(s); }
  // Llama 3 and SmolLM ship an HF tokenizer.json with a byte-level BPE; Llama 2's and TinyLlama's
  // SentencePiece model is not one (the tokenizer refuses it by name).
  TokenizerKind tokenizer() const override { return TokenizerKind::hf_byte_bpe; }
  // Two RMS norms and two residual adds: 10 per hidden element; SwiGLU 3; RoPE 2 per query and key
  // element; softmax 2 per score (3 backward); the token embedding's lookup 2.
  LayerCosts layer_costs() const override {
    return {.mlp_in_products = 2, .hidden_accesses = 10, .mlp_accesses = 3, .rope_accesses = 2,
            .score_accesses = 2, .score_accesses_bwd = 3, .embed_accesses = 2, .learned_positions = false};
  }

 protected:
  std::vector<UnitLayout> do_layout(const ModelSpec& s, const TpConfig& tp, const EpConfig& ep) const override {
    return llama_layout(s, tp, ep);
  }
  std::vector<std::unique_ptr<Unit>> do_make_units(const ModelSpec& s, const TpConfig& tp,
                                                   const EpConfig& ep) const override {
    return make_llama_units(s, tp, ep);
  }
};

// Fields of HF's LlamaConfig that change nothing shardlab computes: special token ids, dropout
// (shardlab trains without; HF's default is 0), storage dtype, the generation cache, bookkeeping,
// and initializer_range, which only a fresh HF initialisation reads (a directory brings weights).
const std::set<std::string> kIgnoredFields = {
    "_name_or_path", "architectures", "attention_dropout", "bos_token_id", "eos_token_id", "pad_token_id",
    "torch_dtype", "dtype", "transformers_version", "use_cache", "initializer_range"};
}  // namespace

const std::set<std::string>& llama_derived_ignored_fields() {
  static const std::set<std::string> fields = [] {
    std::set<std::string> f = kIgnoredFields;
    f.insert({"max_window_layers", "layer_types"});
    return f;
  }();
  return fields;
}

namespace {

// Fields read or checked below.
const std::set<std::string> kKnownFields = {
    "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters", "tie_word_embeddings", "hidden_act", "attention_bias", "mlp_bias", "head_dim", "pretraining_tp"};

}  // namespace

void llama_read_rope(const nlohmann::json& j, const HfConfigReader& c, ModelSpec& s) {
  const bool has_params = c.has("rope_parameters"), has_scaling = c.has("rope_scaling");
  SHARD_REQUIRE(!(has_params && has_scaling),
                "config.json: both \"rope_parameters\" and \"rope_scaling\" are given; expected one of them");
  const char* where = has_params ? "rope_parameters" : "rope_scaling";
  const nlohmann::json r = has_params ? j["rope_parameters"] : has_scaling ? j["rope_scaling"] : nlohmann::json::object();
  SHARD_REQUIRE(r.is_object(), "config.json: \"{}\" is {}, expected an object", where, r.dump());
  // HF's default base when a config names none.
  double theta = c.number_or("rope_theta", 10000.0);
  if (r.contains("rope_theta")) {
    SHARD_REQUIRE(r["rope_theta"].is_number(), "config.json: \"{}\".\"rope_theta\" is {}, expected a number", where,
                  r["rope_theta"].dump());
    SHARD_REQUIRE(!c.has("rope_theta") || j["rope_theta"] == r["rope_theta"],
                  "config.json: \"rope_theta\" {} and \"{}\".\"rope_theta\" {} differ", j["rope_theta"].dump(), where,
                  r["rope_theta"].dump());
    theta = r["rope_theta"].get<double>();
  }
  s.rope_theta = theta;
  // Older files name the type "type".
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})
    if (r.contains(key)) {
      SHARD_REQUIRE(r[key].is_string(), "config.json: \"{}\".\"{}\" is {}, expected a string", where, key, r[key].dump());
      type = r[key].get<std::string>();
    }
  std::set<std::string> allowed = {"rope_type", "type", "rope_theta"};
  if (type == "llama3") {
    auto number = [&](const char* key) {
      SHARD_REQUIRE(r.contains(key) && r[key].is_number(), "config.json: \"{}\" of type llama3 needs a number \"{}\"",
                    where, key);
      return r[key].get<double>();
    };
    s.rope_scaling.factor = number("factor");
    s.rope_scaling.low_freq_factor = number("low_freq_factor");
    s.rope_scaling.high_freq_factor = number("high_freq_factor");
    // HF falls back to max_position_embeddings (read by the caller: s.seq).
    s.rope_scaling.original_max_positions = s.seq;
    if (r.contains("original_max_position_embeddings")) {
      SHARD_REQUIRE(r["original_max_position_embeddings"].is_number_integer(),
                    "config.json: \"{}\".\"original_max_position_embeddings\" is {}, expected an integer", where,
                    r["original_max_position_embeddings"].dump());
      s.rope_scaling.original_max_positions = r["original_max_position_embeddings"].get<int64_t>();
    }
    allowed.insert({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  } else if (type != "default") {
    throw InputError(fmt::format("config.json: \"{}\" has type \"{}\"; shardlab's Llama computes the default RoPE "
                                 "and llama3's frequency scaling only",
                                 where, type));
  }
  if (r.contains("partial_rotary_factor") && r["partial_rotary_factor"] == 1.0) allowed.insert("partial_rotary_factor");
  std::vector<std::string> unknown;
  for (auto it = r.begin(); it != r.end(); ++it)
    if (!allowed.count(it.key())) unknown.push_back(it.key());
  SHARD_REQUIRE(unknown.empty(), "config.json: \"{}\" of type {}: fields {} are not computed by shardlab's Llama",
                where, type, join_names(unknown));
}

void llama_read_sizes(HfConfigReader& c, ModelSpec& s, const char* width, int64_t& width_out) {
  s.dim = c.integer("hidden_size", 1);
  width_out = c.integer(width, 1);
  s.layers = c.integer("num_hidden_layers", 1);
  s.heads = c.integer("num_attention_heads", 1);
  s.vocab = c.integer("vocab_size", 2);
  s.seq = c.integer("max_position_embeddings", 1);
}

void llama_read_shared(const nlohmann::json& j, HfConfigReader& c, ModelSpec& s) {
  // Older configs (Llama 1 and 2) have no num_key_value_heads: HF then gives every head its own.
  s.kv_heads = c.has("num_key_value_heads") ? c.integer("num_key_value_heads", 1) : s.heads;
  s.norm_eps = c.number_or("rms_norm_eps", 1e-6);  // HF's defaults
  s.tied_head = false;
  if (c.has("tie_word_embeddings")) {
    SHARD_REQUIRE(j["tie_word_embeddings"].is_boolean(), "config.json: \"tie_word_embeddings\" is {}, expected a bool",
                  j["tie_word_embeddings"].dump());
    s.tied_head = j["tie_word_embeddings"].get<bool>();
  }
  c.expect("hidden_act", "silu", "SwiGLU's gate is SiLU");
}

void llama_check_rope(const ModelSpec& s) {
  SHARD_REQUIRE(s.rope_theta > 0, "rope_theta {}: Llama rotates its queries and keys (RoPE), the base must be positive",
                s.rope_theta);
  const int64_t hd = s.head_size();
  SHARD_REQUIRE(hd % 2 == 0 && hd / 2 <= RopeFreqs::kMaxHalf,
                "head size {} ({}): RoPE needs an even head size of at most {}", hd,
                s.head_dim > 0 ? "head_dim" : fmt::format("--dim {} / --heads {}", s.dim, s.heads),
                2 * RopeFreqs::kMaxHalf);
}

const ModelFamily& llama_family() {
  static const LlamaFamily family;
  return family;
}

std::vector<ModelPreset> llama_presets() {
  struct P {
    const char* name;
    int64_t L, C, H, KV, F, T, V;
    double theta, eps;
    bool tied;
    const char* help;
  };
  // The published shapes, from each model's config.json on the Hugging Face hub.
  static const P presets[] = {
      {"llama-tiny", 2, 32, 4, 2, 88, 32, 256, 10000, 1e-5, false,
       "Llama shape, 2 layers of 32 channels, 4 heads sharing 2 K/V heads, bytes as tokens: the tests' model"},
      {"llama-small", 4, 128, 4, 2, 352, 128, 256, 10000, 1e-5, false,
       "Llama shape, 4 layers of 128 channels, 4 heads sharing 2 K/V heads, bytes as tokens: a demo model"},
      {"llama2-7b", 32, 4096, 32, 32, 11008, 4096, 32000, 10000, 1e-5, false, "Llama 2 7B (6.74B)"},
      {"llama3-8b", 32, 4096, 32, 8, 14336, 8192, 128256, 500000, 1e-5, false, "Llama 3 8B (8.03B)"},
      {"llama3-70b", 80, 8192, 64, 8, 28672, 8192, 128256, 500000, 1e-5, false, "Llama 3 70B (70.55B)"},
      {"llama3-405b", 126, 16384, 128, 8, 53248, 131072, 128256, 500000, 1e-5, false,
       "Llama 3.1 405B (405.85B), 128K positions with llama3 RoPE scaling"},
      {"llama3.2-1b", 16, 2048, 32, 8, 8192, 131072, 128256, 500000, 1e-5, true,
       "Llama 3.2 1B (1.24B, tied head), 128K positions with llama3 RoPE scaling"},
      {"tinyllama-1.1b", 22, 2048, 32, 4, 5632, 2048, 32000, 10000, 1e-5, false, "TinyLlama 1.1B"},
      {"smollm-135m", 30, 576, 9, 3, 1536, 2048, 49152, 10000, 1e-5, true, "SmolLM 135M (tied head)"}};
  std::vector<ModelPreset> out;
  for (const P& p : presets) {
    ModelSpec s;
    s.family = FamilyId::llama;
    s.name = p.name, s.layers = p.L, s.dim = p.C, s.heads = p.H, s.seq = p.T, s.vocab = p.V;
    s.kv_heads = p.KV, s.ffn_dim = p.F, s.rope_theta = p.theta, s.norm_eps = p.eps, s.tied_head = p.tied;
    if (s.name == "llama3-405b") s.rope_scaling = {8.0, 1.0, 4.0, 8192};  // Llama 3.1's
    if (s.name == "llama3.2-1b") s.rope_scaling = {32.0, 1.0, 4.0, 8192};  // Llama 3.2's
    out.push_back({s, p.help});
  }
  return out;
}

ModelSpec llama_spec_from_hf_config(const nlohmann::json& j) {
  HfConfigReader c(j, "Llama", kKnownFields, kIgnoredFields);
  c.expect("model_type", "llama", "this is the llama family");
  ModelSpec s;
  s.family = FamilyId::llama;
  s.name = "hf-config";
  llama_read_sizes(c, s, "intermediate_size", s.ffn_dim);
  c.check_missing();
  llama_read_shared(j, c, s);
  c.expect("attention_bias", false, "no biases in the attention's projections");
  c.expect("mlp_bias", false, "no biases in the MLP");
  c.expect("pretraining_tp", 1, "HF's slicing of the projections for tensor-parallel pretraining changes rounding");
  if (c.has("head_dim") && s.heads > 0 && j["head_dim"] != nlohmann::json(s.dim / s.heads))
    throw InputError(fmt::format("config.json: \"head_dim\" is {}; shardlab's Llama needs hidden_size / "
                                 "num_attention_heads = {}",
                                 j["head_dim"].dump(), s.dim / s.heads));
  llama_read_rope(j, c, s);
  s.validate();
  return s;
}

void llama_read_head_dim(const nlohmann::json& j, const HfConfigReader& c, ModelSpec& s) {
  if (c.has("head_dim")) {
    SHARD_REQUIRE(j["head_dim"].is_number_integer() && j["head_dim"].get<int64_t>() >= 1,
                  "config.json: \"head_dim\" is {}, expected a positive integer", j["head_dim"].dump());
    const int64_t hd = j["head_dim"].get<int64_t>();
    if (hd * s.heads != s.dim) s.head_dim = hd;  // else the default, dim / heads
  }
}

nlohmann::json llama_hf_config(const ModelSpec& s) {
  // The classic form ("rope_theta" and "rope_scaling"): transformers 5 reads it as well as 4 does.
  nlohmann::json j = {{"model_type", "llama"},
                      {"architectures", {"LlamaForCausalLM"}},
                      {"hidden_size", s.dim},
                      {"intermediate_size", s.ffn_hidden()},
                      {"num_hidden_layers", s.layers},
                      {"num_attention_heads", s.heads},
                      {"num_key_value_heads", s.num_kv_heads()},
                      {"head_dim", s.dim / s.heads},
                      {"vocab_size", s.vocab},
                      {"max_position_embeddings", s.seq},
                      {"rms_norm_eps", s.norm_eps},
                      {"rope_theta", s.rope_theta},
                      {"rope_scaling", nullptr},
                      {"tie_word_embeddings", s.tied_head},
                      {"hidden_act", "silu"},
                      {"attention_bias", false},
                      {"mlp_bias", false},
                      {"pretraining_tp", 1},
                      {"initializer_range", 0.02},
                      {"torch_dtype", "float32"}};
  if (s.rope_scaling.enabled())
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.rope_scaling.factor},
                         {"low_freq_factor", s.rope_scaling.low_freq_factor},
                         {"high_freq_factor", s.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", s.rope_scaling.original_max_positions}};
  return j;
}

double llama_flops_per_token(const ModelSpec& s) {
  // GPT-2's count takes every parameter once, its token embedding included as the tied LM head's
  // product. The same here: a tied matrix counts once, and an untied embedding (a lookup, no
  // product) not at all.
  const double embedding = s.tied_head ? 0.0 : double(s.vocab) * double(s.dim);
  const double n = static_cast<double>(num_params(llama_layout(s))) - embedding;
  return 6.0 * n + 6.0 * double(s.layers) * double(s.heads * s.head_size()) * double(s.seq);
}

RopeFreqs llama_rope_freqs(const ModelSpec& s) {
  const int64_t hd = s.head_size();
  SHARD_CHECK(hd % 2 == 0 && hd / 2 <= RopeFreqs::kMaxHalf, "head size {} for RoPE", hd);
  RopeFreqs f;
  f.half = hd / 2;
  // transformers: 1 / (theta ** (arange(0, hd, 2).float() / hd)), every step in f32.
  const float base = static_cast<float>(s.rope_theta);
  for (int64_t i = 0; i < f.half; ++i)
    f.inv_freq[i] = 1.f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(hd));
  if (!s.rope_scaling.enabled()) return f;
  // transformers' _compute_llama3_parameters, in f32 as it computes (Python scalars meet f32
  // tensors as f32): long wavelengths divided by factor, short ones kept, the band between
  // interpolated by how many original contexts fit in the wavelength.
  const RopeScaling& r = s.rope_scaling;
  const auto old_context = static_cast<float>(r.original_max_positions);
  const auto low_wavelen = static_cast<float>(static_cast<double>(r.original_max_positions) / r.low_freq_factor);
  const auto high_wavelen = static_cast<float>(static_cast<double>(r.original_max_positions) / r.high_freq_factor);
  const auto factor = static_cast<float>(r.factor), low = static_cast<float>(r.low_freq_factor);
  const auto band = static_cast<float>(r.high_freq_factor - r.low_freq_factor);
  for (int64_t i = 0; i < f.half; ++i) {
    const float inv = f.inv_freq[i];
    const float wavelen = static_cast<float>(2 * std::numbers::pi) / inv;
    if (wavelen > low_wavelen) {
      f.inv_freq[i] = inv / factor;
    } else if (!(wavelen < high_wavelen)) {
      const float smooth = (old_context / wavelen - low) / band;
      const float stretched = (1.f - smooth) * inv / factor;
      // This file is compiled with -ffp-contract=off (CMakeLists.txt): a fused multiply-add here
      // rounds once where transformers rounds twice (Llama 3.1 405B's 30th frequency, one ulp).
      f.inv_freq[i] = stretched + smooth * inv;
    }
  }
  return f;
}

}  // namespace shardlab
