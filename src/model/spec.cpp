#include "src/model/spec.hpp"

#include <cmath>
#include <nlohmann/json.hpp>

#include "src/core/check.hpp"
#include "src/core/rng.hpp"
#include "src/core/tensor.hpp"

namespace shardlab {

void ModelSpec::validate() const {
  SHARD_REQUIRE(layers >= 1, "--layers {}: a model needs at least one layer", layers);
  SHARD_REQUIRE(dim >= 1 && heads >= 1, "--dim {} --heads {}: both must be positive", dim, heads);
  SHARD_REQUIRE(dim % heads == 0, "--dim {} is not divisible by --heads {}", dim, heads);
  SHARD_REQUIRE(seq >= 1, "--seq {}: must be positive", seq);
  SHARD_REQUIRE(vocab >= 2, "--vocab {}: must be at least 2", vocab);
  // Bounds that keep every element count (V*C, 12*C^2, B*H*T*T) far inside 64 bits.
  SHARD_REQUIRE(layers <= 4096 && dim <= (1 << 17) && heads <= dim && seq <= (1 << 20) && vocab <= (1 << 24),
                "model too large to describe: layers {} (max 4096), dim {} (max 131072), seq {} (max 1048576), "
                "vocab {} (max 16777216)", layers, dim, seq, vocab);
}

double flops_per_token(const ModelSpec& s) {
  return 6.0 * static_cast<double>(num_params(gpt2_layout(s))) + 6.0 * double(s.layers) * double(s.dim) * double(s.seq);
}

std::string ModelSpec::describe() const {
  double p = static_cast<double>(num_params(gpt2_layout(*this)));
  return fmt::format("{} (L={} C={} H={} T={} V={}, {:.2f}M params)", name, layers, dim, heads, seq, vocab, p / 1e6);
}

ModelSpec model_preset(std::string_view name) {
  struct P {
    const char* name;
    int64_t L, C, H, T, V;
  };
  static const P presets[] = {{"tiny", 2, 32, 2, 32, 256},         {"small", 4, 128, 4, 128, 256},
                              {"gpt2", 12, 768, 12, 1024, 50257},  {"gpt2-medium", 24, 1024, 16, 1024, 50257},
                              {"gpt2-large", 36, 1280, 20, 1024, 50257}, {"gpt2-xl", 48, 1600, 25, 1024, 50257}};
  for (const P& p : presets)
    if (name == p.name) return ModelSpec{p.name, p.L, p.C, p.H, p.T, p.V};
  std::string names;
  for (const P& p : presets) names += std::string(names.empty() ? "" : ", ") + p.name;
  throw InputError(fmt::format("unknown model '{}': expected one of {}", name, names));
}

std::vector<std::string> model_preset_names() {
  return {"tiny", "small", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"};
}

nlohmann::json spec_to_json(const ModelSpec& s) {
  return {{"name", s.name}, {"layers", s.layers}, {"dim", s.dim}, {"heads", s.heads}, {"seq", s.seq}, {"vocab", s.vocab}};
}

ModelSpec spec_from_json(const nlohmann::json& j) {
  auto size = [&](const char* key, int64_t lo) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer())
      throw InputError(fmt::format("\"{}\" must be an integer", key));
    int64_t v = j[key].get<int64_t>();
    if (v < lo) throw InputError(fmt::format("\"{}\" is {}, below {}", key, v, lo));
    return v;
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
  s.validate();
  return s;
}

std::string TensorDecl::shape_str() const { return shardlab::shape_str(shape); }


const TensorDecl& UnitLayout::find(std::string_view tensor) const {
  for (const auto& t : tensors)
    if (t.name == tensor) return t;
  SHARD_CHECK(false, "unit {} has no tensor {}", name, tensor);
}

namespace {
void add(UnitLayout& u, std::string name, std::vector<int64_t> shape, Init init, float std = 0.f) {
  TensorDecl t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.numel = 1;
  for (int64_t d : t.shape) t.numel *= d;
  t.offset = u.numel;
  t.decay = t.shape.size() >= 2;
  t.init = init;
  t.std = std;
  u.numel += t.numel;
  u.tensors.push_back(std::move(t));
}
}  // namespace

std::vector<UnitLayout> gpt2_layout(const ModelSpec& s) {
  const int64_t C = s.dim;
  const float std = 0.02f;
  const float proj_std = 0.02f / std::sqrt(2.f * static_cast<float>(s.layers));  // GPT-2's residual scaling
  std::vector<UnitLayout> units;
  UnitLayout emb{"embedding", {}, 0};
  add(emb, "wte.weight", {s.vocab, C}, Init::normal, std);
  add(emb, "wpe.weight", {s.seq, C}, Init::normal, std);
  units.push_back(std::move(emb));
  for (int64_t l = 0; l < s.layers; ++l) {
    std::string p = "h." + std::to_string(l) + ".";
    UnitLayout b{"h." + std::to_string(l), {}, 0};
    add(b, p + "ln_1.weight", {C}, Init::ones);
    add(b, p + "ln_1.bias", {C}, Init::zeros);
    add(b, p + "attn.c_attn.weight", {C, 3 * C}, Init::normal, std);
    add(b, p + "attn.c_attn.bias", {3 * C}, Init::zeros);
    add(b, p + "attn.c_proj.weight", {C, C}, Init::normal, proj_std);
    add(b, p + "attn.c_proj.bias", {C}, Init::zeros);
    add(b, p + "ln_2.weight", {C}, Init::ones);
    add(b, p + "ln_2.bias", {C}, Init::zeros);
    add(b, p + "mlp.c_fc.weight", {C, 4 * C}, Init::normal, std);
    add(b, p + "mlp.c_fc.bias", {4 * C}, Init::zeros);
    add(b, p + "mlp.c_proj.weight", {4 * C, C}, Init::normal, proj_std);
    add(b, p + "mlp.c_proj.bias", {C}, Init::zeros);
    units.push_back(std::move(b));
  }
  UnitLayout head{"head", {}, 0};
  add(head, "ln_f.weight", {C}, Init::ones);
  add(head, "ln_f.bias", {C}, Init::zeros);
  units.push_back(std::move(head));
  return units;
}

int64_t num_params(const std::vector<UnitLayout>& layout) {
  int64_t n = 0;
  for (const auto& u : layout) n += u.numel;
  return n;
}

void init_flat_range(const UnitLayout& unit, uint64_t seed, int64_t first, std::span<float> out) {
  const int64_t last = first + static_cast<int64_t>(out.size());
  SHARD_CHECK(first >= 0, "init range starts at {}", first);
  // Elements past the last tensor are padding (sharded buffers round up): zero.
  std::fill(out.begin(), out.end(), 0.f);
  for (const TensorDecl& t : unit.tensors) {
    int64_t lo = std::max(first, t.offset), hi = std::min(last, t.offset + t.numel);
    if (lo >= hi) continue;
    std::span<float> dst = out.subspan(static_cast<size_t>(lo - first), static_cast<size_t>(hi - lo));
    switch (t.init) {
      case Init::zeros: std::fill(dst.begin(), dst.end(), 0.f); break;
      case Init::ones: std::fill(dst.begin(), dst.end(), 1.f); break;
      case Init::normal: Rng(seed, t.name).fill_normal(dst, static_cast<uint64_t>(lo - t.offset), 0.f, t.std); break;
    }
  }
}

std::vector<std::string> gpt2_unit_names(const ModelSpec& spec) {
  std::vector<std::string> names;
  for (const UnitLayout& u : gpt2_layout(spec)) names.push_back(u.name);
  return names;
}

}  // namespace shardlab
