#include "src/model/spec.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "src/core/check.hpp"
#include "src/core/rng.hpp"
#include "src/core/tensor.hpp"
#include "src/model/family.hpp"

namespace shardlab {

void ModelSpec::validate() const {
  SHARD_REQUIRE(layers >= 1, "--layers {}: a model needs at least one layer", layers);
  SHARD_REQUIRE(dim >= 1 && heads >= 1, "--dim {} --heads {}: both must be positive", dim, heads);
  SHARD_REQUIRE(head_dim != 0 || dim % heads == 0, "--dim {} is not divisible by --heads {}", dim, heads);
  SHARD_REQUIRE(head_dim >= 0 && head_dim <= 1024, "head_dim {}: must be in [0, 1024] (0: dim / heads)", head_dim);
  SHARD_REQUIRE(seq >= 1, "--seq {}: must be positive", seq);
  SHARD_REQUIRE(vocab >= 2, "--vocab {}: must be at least 2", vocab);
  // Bounds that keep every element count (V*C, 12*C^2, B*H*T*T) far inside 64 bits.
  SHARD_REQUIRE(layers <= 4096 && dim <= (1 << 17) && heads <= dim && seq <= (1 << 20) && vocab <= (1 << 24),
                "model too large to describe: layers {} (max 4096), dim {} (max 131072), seq {} (max 1048576), "
                "vocab {} (max 16777216)", layers, dim, seq, vocab);
  SHARD_REQUIRE(kv_heads >= 0 && heads % num_kv_heads() == 0, "kv_heads {}: must divide heads {} (0: as many)",
                kv_heads, heads);
  SHARD_REQUIRE(ffn_dim >= 0 && ffn_dim <= (1 << 20), "ffn_dim {}: must be in [0, 1048576] (0: 4 * dim)", ffn_dim);
  SHARD_REQUIRE(std::isfinite(norm_eps) && norm_eps > 0 && norm_eps < 1, "norm_eps {}: must be in (0, 1)", norm_eps);
  SHARD_REQUIRE(std::isfinite(rope_theta) && rope_theta >= 0, "rope_theta {}: must be 0 (none) or positive",
                rope_theta);
  if (rope_scaling.enabled()) {
    const RopeScaling& r = rope_scaling;
    // HF's llama3 formula divides by high_freq_factor - low_freq_factor and by each factor.
    SHARD_REQUIRE(rope_theta > 0, "rope_scaling needs a rotary embedding: rope_theta is {}", rope_theta);
    SHARD_REQUIRE(std::isfinite(r.factor) && r.factor > 0 && std::isfinite(r.low_freq_factor) &&
                      std::isfinite(r.high_freq_factor) && r.low_freq_factor > 0 &&
                      r.high_freq_factor > r.low_freq_factor && r.original_max_positions >= 1,
                  "rope_scaling factor {} low_freq_factor {} high_freq_factor {} original_max_position_embeddings {}: "
                  "need factor > 0, 0 < low_freq_factor < high_freq_factor and original positions >= 1",
                  r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_positions);
  }
  if (moe.enabled()) {
    SHARD_REQUIRE(moe.experts <= 4096 && moe.top_k >= 1 && moe.top_k <= moe.experts,
                  "experts {} (num_experts) top_k {} (num_experts_per_tok): need 1 <= top_k <= experts <= 4096",
                  moe.experts, moe.top_k);
    SHARD_REQUIRE(moe.ffn_dim >= 1 && moe.ffn_dim <= (1 << 20), "expert ffn_dim {}: must be in [1, 1048576]",
                  moe.ffn_dim);
    SHARD_REQUIRE(std::isfinite(moe.aux_coef) && moe.aux_coef >= 0, "router_aux_loss_coef {}: must be 0 or positive",
                  moe.aux_coef);
    SHARD_REQUIRE(moe.groups >= 1 && moe.experts % moe.groups == 0 && moe.topk_groups >= 1 &&
                      moe.topk_groups <= moe.groups && moe.top_k <= moe.topk_groups * (moe.experts / moe.groups),
                  "n_group {} topk_group {}: need groups dividing the {} experts, 1 <= topk_group <= n_group, and "
                  "the chosen groups holding at least top_k {} experts", moe.groups, moe.topk_groups, moe.experts,
                  moe.top_k);
    SHARD_REQUIRE(moe.groups == 1 || moe.sigmoid, "n_group {}: group-limited routing is the sigmoid router's",
                  moe.groups);
    SHARD_REQUIRE(moe.groups == 1 || moe.experts / moe.groups >= 2,
                  "n_group {}: a group scores its two best experts, so it needs at least 2 of the {} experts",
                  moe.groups, moe.experts);
    SHARD_REQUIRE(std::isfinite(moe.bias_rate) && moe.bias_rate >= 0 && moe.bias_rate <= 1,
                  "--moe-bias-update-rate {}: must be in [0, 1]", moe.bias_rate);
    SHARD_REQUIRE(moe.bias_rate == 0 || moe.sigmoid,
                  "--moe-bias-update-rate {}: the correction bias is the sigmoid router's (deepseek_v3), not {}'s",
                  moe.bias_rate, name);
    SHARD_REQUIRE(std::isfinite(moe.routed_scale) && moe.routed_scale > 0, "routed_scaling_factor {}: must be positive",
                  moe.routed_scale);
    SHARD_REQUIRE(moe.shared_ffn >= 0 && moe.shared_ffn <= (1 << 20),
                  "shared experts' width {}: must be in [0, 1048576]", moe.shared_ffn);
    SHARD_REQUIRE(moe.dense_layers >= 0 && moe.dense_layers <= layers,
                  "first_k_dense_replace {}: must be in [0, {}] (the layers)", moe.dense_layers, layers);
  }
  if (mla.enabled()) {
    SHARD_REQUIRE(mla.q_rank >= 0 && mla.kv_rank <= (1 << 16) && mla.q_rank <= (1 << 16) && mla.nope >= 1 &&
                      mla.rope >= 2 && mla.rope % 2 == 0 && mla.v >= 1 && mla.qk() <= 1024 && mla.v <= 1024,
                  "latent attention q_lora_rank {} kv_lora_rank {} qk_nope_head_dim {} qk_rope_head_dim {} v_head_dim "
                  "{}: need ranks in [0, 65536] (kv at least 1), a nope part of at least 1, an even rope part of at "
                  "least 2, head sizes up to 1024", mla.q_rank, mla.kv_rank, mla.nope, mla.rope, mla.v);
  }
  if (const YarnSpec& y = mla.yarn; y.enabled())
    SHARD_REQUIRE(std::isfinite(y.factor) && y.factor >= 1 && std::isfinite(y.mscale) && std::isfinite(y.mscale_all_dim) &&
                      std::isfinite(y.beta_fast) && std::isfinite(y.beta_slow) && y.beta_fast > 0 && y.beta_slow > 0 &&
                      y.original_max_positions >= 1,
                  "yarn factor {} mscale {} mscale_all_dim {} beta_fast {} beta_slow {} "
                  "original_max_position_embeddings {}: need a factor of at least 1, positive betas and original "
                  "positions", y.factor, y.mscale, y.mscale_all_dim, y.beta_fast, y.beta_slow, y.original_max_positions);
  SHARD_REQUIRE(std::isfinite(moe_capacity_factor) && moe_capacity_factor >= 0,
                "--moe-capacity-factor {}: must be 0 (dropless) or positive", moe_capacity_factor);
  SHARD_REQUIRE(moe_capacity_factor == 0 || moe.enabled(),
                "--moe-capacity-factor {}: {} has no experts", moe_capacity_factor, name);
  family_of(*this).check(*this);
}

std::string ModelSpec::describe() const {
  double p = static_cast<double>(num_params(family_of(*this).layout(*this)));
  // The fields past GPT-2's six only where they differ from GPT-2's, so its descriptions read as before.
  const ModelSpec d;
  std::string extra, rope;
  if (kv_heads != d.kv_heads) extra += fmt::format(" KV={}", kv_heads);
  if (ffn_dim != d.ffn_dim) extra += fmt::format(" F={}", ffn_dim);
  if (rope_theta != d.rope_theta) rope += fmt::format(", RoPE theta {}", rope_theta);
  if (rope_scaling.enabled())
    rope += fmt::format(" scaled llama3 x{} ({}, {}, {})", rope_scaling.factor, rope_scaling.low_freq_factor,
                        rope_scaling.high_freq_factor, rope_scaling.original_max_positions);
  if (tied_head != d.tied_head) rope += tied_head ? ", tied head" : ", untied head";
  if (head_dim != d.head_dim) extra += fmt::format(" hd={}", head_dim);
  if (moe.enabled()) extra += fmt::format(" E={} k={} Fe={}", moe.experts, moe.top_k, moe.ffn_dim);
  if (mla.enabled()) extra += fmt::format(" MLA q{} kv{} {}+{}/{}", mla.q_rank, mla.kv_rank, mla.nope, mla.rope, mla.v);
  return fmt::format("{} (L={} C={} H={}{} T={} V={}{}, {:.2f}M params)", name, layers, dim, heads, extra, seq, vocab,
                     rope, p / 1e6);
}

namespace {
RopeScaling rope_scaling_from_json(const nlohmann::json& r) {
  SHARD_REQUIRE(r.is_object(), "\"rope_scaling\" must be an object, got {}", r.dump());
  auto field = [&](const char* key) {
    SHARD_REQUIRE(r.contains(key) && r[key].is_number(), "\"rope_scaling\": \"{}\" must be a number", key);
    return r[key];
  };
  for (auto it = r.begin(); it != r.end(); ++it)
    SHARD_REQUIRE(it.key() == "factor" || it.key() == "low_freq_factor" || it.key() == "high_freq_factor" ||
                      it.key() == "original_max_position_embeddings",
                  "\"rope_scaling\": unknown field \"{}\"", it.key());
  RopeScaling s;
  s.factor = field("factor").get<double>();
  s.low_freq_factor = field("low_freq_factor").get<double>();
  s.high_freq_factor = field("high_freq_factor").get<double>();
  SHARD_REQUIRE(field("original_max_position_embeddings").is_number_integer(),
                "\"rope_scaling\": \"original_max_position_embeddings\" must be an integer");
  s.original_max_positions = r["original_max_position_embeddings"].get<int64_t>();
  SHARD_REQUIRE(s.enabled(), "\"rope_scaling\": factor 0 (leave rope_scaling out for none)");
  return s;
}
MoeSpec moe_from_json(const nlohmann::json& m) {
  SHARD_REQUIRE(m.is_object(), "\"moe\" must be an object, got {}", m.dump());
  for (auto it = m.begin(); it != m.end(); ++it)
    SHARD_REQUIRE(it.key() == "experts" || it.key() == "top_k" || it.key() == "ffn_dim" || it.key() == "norm_topk" ||
                      it.key() == "aux_coef" || it.key() == "aux_loss" || it.key() == "sigmoid" ||
                      it.key() == "groups" || it.key() == "topk_groups" || it.key() == "routed_scale" ||
                      it.key() == "shared_ffn" || it.key() == "dense_layers" || it.key() == "bias_rate",
                  "\"moe\": unknown field \"{}\"", it.key());
  auto integer = [&](const char* key) {
    SHARD_REQUIRE(m.contains(key) && m[key].is_number_integer() && m[key].get<int64_t>() >= 1,
                  "\"moe\": \"{}\" must be a positive integer", key);
    return m[key].get<int64_t>();
  };
  MoeSpec s;
  s.experts = integer("experts");
  s.top_k = integer("top_k");
  s.ffn_dim = integer("ffn_dim");
  SHARD_REQUIRE(m.contains("norm_topk") && m["norm_topk"].is_boolean(), "\"moe\": \"norm_topk\" must be a bool");
  s.norm_topk = m["norm_topk"].get<bool>();
  SHARD_REQUIRE(m.contains("aux_coef") && m["aux_coef"].is_number(), "\"moe\": \"aux_coef\" must be a number");
  s.aux_coef = m["aux_coef"].get<double>();
  if (m.contains("aux_loss")) {  // written when false (specs before it always had the term)
    SHARD_REQUIRE(m["aux_loss"].is_boolean(), "\"moe\": \"aux_loss\" must be a bool");
    s.aux_loss = m["aux_loss"].get<bool>();
  }
  // DeepSeek's router: each written when it differs from the softmax router's value.
  auto count = [&](const char* key, int64_t fallback) {
    if (!m.contains(key)) return fallback;
    SHARD_REQUIRE(m[key].is_number_integer() && m[key].get<int64_t>() >= 0, "\"moe\": \"{}\" must be an integer >= 0",
                  key);
    return m[key].get<int64_t>();
  };
  if (m.contains("sigmoid")) {
    SHARD_REQUIRE(m["sigmoid"].is_boolean(), "\"moe\": \"sigmoid\" must be a bool");
    s.sigmoid = m["sigmoid"].get<bool>();
  }
  s.groups = count("groups", 1), s.topk_groups = count("topk_groups", 1);
  s.shared_ffn = count("shared_ffn", 0), s.dense_layers = count("dense_layers", 0);
  if (m.contains("routed_scale")) {
    SHARD_REQUIRE(m["routed_scale"].is_number(), "\"moe\": \"routed_scale\" must be a number");
    s.routed_scale = m["routed_scale"].get<double>();
  }
  if (m.contains("bias_rate")) {
    SHARD_REQUIRE(m["bias_rate"].is_number(), "\"moe\": \"bias_rate\" must be a number");
    s.bias_rate = m["bias_rate"].get<double>();
  }
  return s;
}
MlaSpec mla_from_json(const nlohmann::json& m) {
  SHARD_REQUIRE(m.is_object(), "\"mla\" must be an object, got {}", m.dump());
  for (auto it = m.begin(); it != m.end(); ++it)
    SHARD_REQUIRE(it.key() == "q_rank" || it.key() == "kv_rank" || it.key() == "nope" || it.key() == "rope" ||
                      it.key() == "v" || it.key() == "interleave" || it.key() == "nextn" || it.key() == "yarn",
                  "\"mla\": unknown field \"{}\"", it.key());
  auto integer = [&](const char* key) {
    SHARD_REQUIRE(m.contains(key) && m[key].is_number_integer() && m[key].get<int64_t>() >= 0,
                  "\"mla\": \"{}\" must be an integer >= 0", key);
    return m[key].get<int64_t>();
  };
  MlaSpec s;
  s.q_rank = integer("q_rank"), s.kv_rank = integer("kv_rank"), s.nope = integer("nope"), s.rope = integer("rope");
  s.v = integer("v");
  SHARD_REQUIRE(m.contains("interleave") && m["interleave"].is_boolean(), "\"mla\": \"interleave\" must be a bool");
  s.interleave = m["interleave"].get<bool>();
  if (m.contains("nextn")) s.nextn = integer("nextn");
  if (m.contains("yarn")) {
    const nlohmann::json& y = m["yarn"];
    SHARD_REQUIRE(y.is_object(), "\"mla\": \"yarn\" must be an object, got {}", y.dump());
    for (auto it = y.begin(); it != y.end(); ++it)
      SHARD_REQUIRE(it.key() == "factor" || it.key() == "mscale" || it.key() == "mscale_all_dim" ||
                        it.key() == "beta_fast" || it.key() == "beta_slow" || it.key() == "original_max_positions" ||
                        it.key() == "truncate",
                    "\"mla\": \"yarn\": unknown field \"{}\"", it.key());
    auto number = [&](const char* key) {
      SHARD_REQUIRE(y.contains(key) && y[key].is_number(), "\"mla\": \"yarn\": \"{}\" must be a number", key);
      return y[key].get<double>();
    };
    s.yarn.factor = number("factor"), s.yarn.mscale = number("mscale"), s.yarn.mscale_all_dim = number("mscale_all_dim");
    s.yarn.beta_fast = number("beta_fast"), s.yarn.beta_slow = number("beta_slow");
    SHARD_REQUIRE(y.contains("original_max_positions") && y["original_max_positions"].is_number_integer(),
                  "\"mla\": \"yarn\": \"original_max_positions\" must be an integer");
    s.yarn.original_max_positions = y["original_max_positions"].get<int64_t>();
    SHARD_REQUIRE(y.contains("truncate") && y["truncate"].is_boolean(), "\"mla\": \"yarn\": \"truncate\" must be a bool");
    s.yarn.truncate = y["truncate"].get<bool>();
  }
  SHARD_REQUIRE(s.enabled(), "\"mla\": kv_rank 0 (leave \"mla\" out for none)");
  return s;
}
}  // namespace

AttentionKernel parse_attention_kernel(const std::string& s) {
  if (s == "flash") return AttentionKernel::flash;
  if (s == "naive") return AttentionKernel::naive;
  if (s == "cudnn") return AttentionKernel::cudnn;
  throw InputError(fmt::format("--attention '{}': expected flash (the fused kernel, O(T) memory), naive (the "
                               "(B, H, T, T) probabilities kept; the reference) or cudnn (cuDNN's fused attention, "
                               "on a GPU)", s));
}

const char* attention_kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::flash: return "flash";
    case AttentionKernel::naive: return "naive";
    case AttentionKernel::cudnn: return "cudnn";
  }
  return "?";
}

nlohmann::json spec_to_json(const ModelSpec& s) {
  nlohmann::json j = {{"family", family_of(s).name()}, {"name", s.name}, {"layers", s.layers}, {"dim", s.dim},
                      {"heads", s.heads},  {"seq", s.seq},   {"vocab", s.vocab}};
  const ModelSpec d;  // the defaults: GPT-2's, left out so a GPT-2 spec reads as it always did
  if (s.kv_heads != d.kv_heads) j["kv_heads"] = s.kv_heads;
  if (s.ffn_dim != d.ffn_dim) j["ffn_dim"] = s.ffn_dim;
  if (s.norm_eps != d.norm_eps) j["norm_eps"] = s.norm_eps;
  if (s.rope_theta != d.rope_theta) j["rope_theta"] = s.rope_theta;
  if (s.tied_head != d.tied_head) j["tied_head"] = s.tied_head;
  if (s.rope_scaling.enabled())
    j["rope_scaling"] = {{"factor", s.rope_scaling.factor},
                         {"low_freq_factor", s.rope_scaling.low_freq_factor},
                         {"high_freq_factor", s.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", s.rope_scaling.original_max_positions}};
  if (s.head_dim != d.head_dim) j["head_dim"] = s.head_dim;
  if (s.qk_norm) j["qk_norm"] = true;
  if (s.moe.enabled())
    j["moe"] = {{"experts", s.moe.experts}, {"top_k", s.moe.top_k}, {"ffn_dim", s.moe.ffn_dim},
                {"norm_topk", s.moe.norm_topk}, {"aux_coef", s.moe.aux_coef}};
  if (s.moe.enabled() && !s.moe.aux_loss) j["moe"]["aux_loss"] = false;
  if (s.moe.enabled()) {
    const MoeSpec m;
    nlohmann::json& o = j["moe"];
    if (s.moe.sigmoid) o["sigmoid"] = true;
    if (s.moe.groups != m.groups) o["groups"] = s.moe.groups;
    if (s.moe.topk_groups != m.topk_groups) o["topk_groups"] = s.moe.topk_groups;
    if (s.moe.routed_scale != m.routed_scale) o["routed_scale"] = s.moe.routed_scale;
    if (s.moe.shared_ffn != m.shared_ffn) o["shared_ffn"] = s.moe.shared_ffn;
    if (s.moe.dense_layers != m.dense_layers) o["dense_layers"] = s.moe.dense_layers;
    if (s.moe.bias_rate != m.bias_rate) o["bias_rate"] = s.moe.bias_rate;
  }
  if (s.mla.enabled())
    j["mla"] = {{"q_rank", s.mla.q_rank}, {"kv_rank", s.mla.kv_rank}, {"nope", s.mla.nope},
                {"rope", s.mla.rope},     {"v", s.mla.v},             {"interleave", s.mla.interleave}};
  if (s.mla.nextn > 0) j["mla"]["nextn"] = s.mla.nextn;
  if (const YarnSpec& y = s.mla.yarn; y.enabled())
    j["mla"]["yarn"] = {{"factor", y.factor},       {"mscale", y.mscale},
                        {"mscale_all_dim", y.mscale_all_dim}, {"beta_fast", y.beta_fast},
                        {"beta_slow", y.beta_slow}, {"original_max_positions", y.original_max_positions},
                        {"truncate", y.truncate}};
  return j;
}

ModelSpec spec_from_json(const nlohmann::json& j) {
  auto size = [&](const char* key, int64_t lo) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer())
      throw InputError(fmt::format("\"{}\" must be an integer", key));
    int64_t v = j[key].get<int64_t>();
    if (v < lo) throw InputError(fmt::format("\"{}\" is {}, below {}", key, v, lo));
    return v;
  };
  auto number = [&](const char* key, double fallback) {
    if (!j.contains(key)) return fallback;
    SHARD_REQUIRE(j[key].is_number(), "\"{}\" must be a number", key);
    return j[key].get<double>();
  };
  ModelSpec s;
  s.layers = size("layers", 1);
  s.dim = size("dim", 1);
  s.heads = size("heads", 1);
  s.seq = size("seq", 1);
  s.vocab = size("vocab", 2);
  if (j.contains("name")) {
    SHARD_REQUIRE(j["name"].is_string(), "\"name\" must be a string");
    s.name = j["name"].get<std::string>();
  }
  if (j.contains("family")) {
    SHARD_REQUIRE(j["family"].is_string(), "\"family\" must be a string");
    s.family = model_family(j["family"].get<std::string>()).id();
  }
  if (j.contains("kv_heads")) s.kv_heads = size("kv_heads", 0);
  if (j.contains("ffn_dim")) s.ffn_dim = size("ffn_dim", 0);
  s.norm_eps = number("norm_eps", s.norm_eps);
  s.rope_theta = number("rope_theta", s.rope_theta);
  if (j.contains("tied_head")) {
    SHARD_REQUIRE(j["tied_head"].is_boolean(), "\"tied_head\" must be true or false");
    s.tied_head = j["tied_head"].get<bool>();
  }
  if (j.contains("rope_scaling")) s.rope_scaling = rope_scaling_from_json(j["rope_scaling"]);
  if (j.contains("head_dim")) s.head_dim = size("head_dim", 0);
  if (j.contains("qk_norm")) {
    SHARD_REQUIRE(j["qk_norm"].is_boolean(), "\"qk_norm\" must be true or false");
    s.qk_norm = j["qk_norm"].get<bool>();
  }
  if (j.contains("moe")) s.moe = moe_from_json(j["moe"]);
  if (j.contains("mla")) s.mla = mla_from_json(j["mla"]);
  s.validate();
  return s;
}

double YarnSpec::softmax_scale() const {
  if (!enabled() || mscale_all_dim == 0 || factor <= 1) return 1.0;
  const double m = 0.1 * mscale_all_dim * std::log(factor) + 1.0;  // transformers' yarn_get_mscale
  return m * m;
}

std::string TensorDecl::shape_str() const { return shardlab::shape_str(shape); }

const TensorDecl& UnitLayout::find(std::string_view tensor) const {
  for (const auto& t : tensors)
    if (t.name == tensor) return t;
  SHARD_CHECK(false, "unit {} has no tensor {}", name, tensor);
}

void add_tensor(UnitLayout& u, std::string name, std::vector<int64_t> shape, Init init, float std, TpSplit tp) {
  TensorDecl t;
  t.name = std::move(name);
  t.full_shape = shape;
  t.shape = std::move(shape);
  if (tp.split()) {
    SHARD_CHECK(tp.dim < static_cast<int>(t.shape.size()) && tp.parts >= 1 && t.shape[tp.dim] % tp.parts == 0,
                "{}: tensor-parallel split of dimension {} in {} parts for shape {}", t.name, tp.dim, tp.parts,
                t.shape_str());
    const int64_t block = t.shape[tp.dim] / tp.parts, T = u.tp_degree;
    if (!tp.pad && block % T != 0)
      throw InputError(fmt::format("--tp {} does not divide {}'s {} {} (dimension {} of {})", T, t.name,
                                   tp.parts > 1 ? "blocks of" : "size", block, tp.dim, t.shape_str()));
    t.shape[tp.dim] = tp.parts * ((block + T - 1) / T);
  }
  t.tp = tp;
  t.numel = 1;
  for (int64_t d : t.shape) t.numel *= d;
  t.offset = u.numel;
  t.decay = t.shape.size() >= 2;
  t.init = init;
  t.std = std;
  u.numel += t.numel;
  u.tensors.push_back(std::move(t));
}

std::vector<TpRun> tp_runs(const TensorDecl& t, int tp_degree, int tp_rank) {
  if (!t.tp.split() || tp_degree == 1) return {TpRun{0, 0, t.numel}};
  const size_t d = static_cast<size_t>(t.tp.dim);
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < d; ++i) outer *= t.full_shape[i];
  for (size_t i = d + 1; i < t.full_shape.size(); ++i) inner *= t.full_shape[i];
  const int64_t block = t.full_shape[d] / t.tp.parts, chunk = t.shape[d] / t.tp.parts;
  const int64_t valid = std::clamp<int64_t>(block - tp_rank * chunk, 0, chunk);
  std::vector<TpRun> runs;
  auto push = [&](int64_t local, int64_t full, int64_t len) {
    if (len == 0) return;
    if (!runs.empty()) {
      TpRun& b = runs.back();
      const bool both_pad = b.full < 0 && full < 0, adjacent = b.full >= 0 && full == b.full + b.len;
      if (b.local + b.len == local && (both_pad || adjacent)) {
        b.len += len;
        return;
      }
    }
    runs.push_back({local, full, len});
  };
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t b = 0; b < t.tp.parts; ++b) {
      const int64_t local = (o * t.shape[d] + b * chunk) * inner;
      push(local, (o * t.full_shape[d] + b * block + tp_rank * chunk) * inner, valid * inner);
      push(local + valid * inner, -1, (chunk - valid) * inner);
    }
  return runs;
}

VocabShard vocab_shard(int64_t vocab, int tp_degree, int tp_rank) {
  VocabShard v;
  v.rows = (vocab + tp_degree - 1) / tp_degree;
  v.begin = tp_rank * v.rows;
  v.valid = std::clamp<int64_t>(vocab - v.begin, 0, v.rows);
  return v;
}

int64_t num_params(const std::vector<UnitLayout>& layout) {
  int64_t n = 0;
  for (const auto& u : layout) n += u.numel;
  return n;
}

void init_flat_range(const UnitLayout& unit, uint64_t seed, int64_t first, std::span<float> out) {
  const int64_t last = first + static_cast<int64_t>(out.size());
  SHARD_CHECK(first >= 0, "init range starts at {}", first);
  // Elements past the last tensor are padding (sharded buffers round up): zero, as is the padding
  // of tensor-parallel parts.
  std::fill(out.begin(), out.end(), 0.f);
  for (const TensorDecl& t : unit.tensors) {
    if (std::max(first, t.offset) >= std::min(last, t.offset + t.numel)) continue;
    for (const TpRun& r : tp_runs(t, unit.tp_degree, unit.tp_rank)) {
      int64_t lo = std::max(first, t.offset + r.local), hi = std::min(last, t.offset + r.local + r.len);
      if (lo >= hi || r.full < 0) continue;
      std::span<float> dst = out.subspan(static_cast<size_t>(lo - first), static_cast<size_t>(hi - lo));
      switch (t.init) {
        case Init::zeros: std::fill(dst.begin(), dst.end(), 0.f); break;
        case Init::ones: std::fill(dst.begin(), dst.end(), 1.f); break;
        case Init::normal:
          Rng(seed, t.name).fill_normal(dst, static_cast<uint64_t>(lo - t.offset - r.local + r.full), 0.f, t.std);
          break;
      }
    }
  }
}

}  // namespace shardlab
