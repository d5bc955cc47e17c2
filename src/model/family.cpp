// family.cpp — the registry: one entry per family folder. A family is added here, and nowhere
// else outside its folder.
#include "src/model/family.hpp"

#include <array>

#include "src/core/check.hpp"
#include "src/core/suggest.hpp"
#include "src/model/deepseek/deepseek.hpp"
#include "src/model/gpt2/gpt2.hpp"
#include "src/model/llama/llama.hpp"
#include "src/model/moe/moe.hpp"
#include "src/model/qwen3/qwen3.hpp"

namespace shardlab {
namespace {

// Indexed by FamilyId.
const std::array<const ModelFamily*, 6>& registry() {
  static const std::array<const ModelFamily*, 6> families = {&gpt2_family(),       &llama_family(), &mixtral_family(),
                                                             &qwen3_moe_family(), &qwen3_family(), &deepseek_v3_family()};
  return families;
}

void check_part(const ModelSpec& spec, const TpConfig& tp, const EpConfig& ep) {
  SHARD_REQUIRE(tp.degree >= 1 && tp.rank >= 0 && tp.rank < tp.degree,
                "tensor-parallel rank {} of {}: need 0 <= rank < degree", tp.rank, tp.degree);
  if (auto why = tp_split_problem(spec, tp.degree)) throw InputError(*why);
  SHARD_REQUIRE(ep.degree >= 1 && ep.rank >= 0 && ep.rank < ep.degree,
                "expert-parallel rank {} of {}: need 0 <= rank < degree", ep.rank, ep.degree);
  if (ep.degree > 1) {
    SHARD_REQUIRE(spec.moe.enabled(), "--ep {}: {} has no experts to split (expert parallelism needs a mixture of "
                  "experts: the mixtral, qwen3_moe and deepseek_v3 families)", ep.degree, spec.name);
    SHARD_REQUIRE(spec.moe.experts % ep.degree == 0, "--ep {} must divide the {} experts of {}", ep.degree,
                  spec.moe.experts, spec.name);
  }
}

}  // namespace

const char* tokenizer_name(TokenizerKind t) {
  switch (t) {
    case TokenizerKind::gpt2_bpe: return "gpt2-bpe";
    case TokenizerKind::hf_byte_bpe: return "hf-byte-bpe";
  }
  return "?";
}

std::vector<UnitLayout> ModelFamily::layout(const ModelSpec& spec, const TpConfig& tp, const EpConfig& ep) const {
  check_part(spec, tp, ep);
  std::vector<UnitLayout> units = do_layout(spec, tp, ep);
  for (const UnitLayout& u : units)
    SHARD_CHECK(u.tp_degree == tp.degree && u.tp_rank == tp.rank && u.ep == ep,
                "unit {} laid out for tp rank {} of {} (ep {} of {}), asked {} of {} (ep {} of {})", u.name, u.tp_rank,
                u.tp_degree, u.ep.rank, u.ep.degree, tp.rank, tp.degree, ep.rank, ep.degree);
  return units;
}

std::vector<std::unique_ptr<Unit>> ModelFamily::make_units(const ModelSpec& spec, const TpConfig& tp,
                                                           const EpConfig& ep) const {
  check_part(spec, tp, ep);
  return do_make_units(spec, tp, ep);
}

std::vector<std::string> ModelFamily::unit_names(const ModelSpec& spec) const {
  std::vector<std::string> names;
  for (const UnitLayout& u : layout(spec)) names.push_back(u.name);
  return names;
}

// The divisibility every family's tensor-parallel layout needs, said in the model's terms (the
// layouts check each tensor too, in the tensors' terms).
std::optional<std::string> tp_split_problem(const ModelSpec& spec, int degree) {
  if (degree < 1) return fmt::format("--tp {}: expected 1 or more", degree);
  if (degree == 1) return std::nullopt;
  const int64_t T = degree;
  if (spec.heads % T != 0 || spec.num_kv_heads() % T != 0)
    return fmt::format("--tp {} must divide the attention heads ({}) and the KV heads ({}) of {}", T, spec.heads,
                       spec.num_kv_heads(), spec.name);
  if (spec.ffn_hidden() % T != 0)
    return fmt::format("--tp {} must divide the MLP width ({}) of {}", T, spec.ffn_hidden(), spec.name);
  if (spec.moe.enabled() && spec.moe.ffn_dim % T != 0)
    return fmt::format("--tp {} must divide each expert's MLP width ({}) of {}", T, spec.moe.ffn_dim, spec.name);
  return std::nullopt;
}

const ModelFamily& family_of(const ModelSpec& spec) {
  const auto i = static_cast<size_t>(spec.family);
  SHARD_CHECK(i < registry().size() && registry()[i]->id() == spec.family, "model spec '{}' has no family ({})",
              spec.name, i);
  return *registry()[i];
}

const ModelFamily& model_family(std::string_view name) {
  for (const ModelFamily* f : registry())
    if (name == f->name()) return *f;
  throw InputError(fmt::format("unknown model family '{}': expected one of {}", name, join_names(model_family_names())));
}

std::vector<std::string> model_family_names() {
  std::vector<std::string> names;
  for (const ModelFamily* f : registry()) names.push_back(f->name());
  return names;
}

ModelSpec model_preset(std::string_view name) {
  for (const ModelFamily* f : registry())
    for (const ModelPreset& p : f->presets())
      if (name == p.spec.name) return p.spec;
  throw InputError(fmt::format("unknown model '{}': expected one of {}", name, join_names(model_preset_names())));
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const ModelFamily* f : registry())
    for (const ModelPreset& p : f->presets()) names.push_back(p.spec.name);
  return names;
}

}  // namespace shardlab
