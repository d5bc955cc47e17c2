// family.cpp — the registry: one entry per family folder. A family is added here, and nowhere
// else outside its folder.
#include "src/model/family.hpp"

#include <array>

#include "src/core/check.hpp"
#include "src/core/suggest.hpp"
#include "src/model/gpt2/gpt2.hpp"
#include "src/model/llama/llama.hpp"

namespace shardlab {
namespace {

// Indexed by FamilyId.
const std::array<const ModelFamily*, 2>& registry() {
  static const std::array<const ModelFamily*, 2> families = {&gpt2_family(), &llama_family()};
  return families;
}

// tp_degree 1 (the whole model on every rank) is all the units compute yet; the tensor-parallel
// issue fills in the rest.
void check_tp(int tp_degree, int tp_rank) {
  SHARD_REQUIRE(tp_degree >= 1 && tp_rank >= 0 && tp_rank < tp_degree,
                "tensor-parallel rank {} of {}: need 0 <= rank < degree", tp_rank, tp_degree);
  if (tp_degree != 1)
    throw InputError(fmt::format("tensor parallelism is not implemented yet (tensor-parallel degree {})", tp_degree));
}

}  // namespace

const char* tokenizer_name(TokenizerKind t) {
  switch (t) {
    case TokenizerKind::gpt2_bpe: return "gpt2-bpe";
    case TokenizerKind::hf_byte_bpe: return "hf-byte-bpe";
  }
  return "?";
}

std::vector<UnitLayout> ModelFamily::layout(const ModelSpec& spec, int tp_degree, int tp_rank) const {
  check_tp(tp_degree, tp_rank);
  return do_layout(spec, tp_degree, tp_rank);
}

std::vector<std::unique_ptr<Unit>> ModelFamily::make_units(const ModelSpec& spec, int tp_degree, int tp_rank) const {
  check_tp(tp_degree, tp_rank);
  return do_make_units(spec, tp_degree, tp_rank);
}

std::vector<std::string> ModelFamily::unit_names(const ModelSpec& spec) const {
  std::vector<std::string> names;
  for (const UnitLayout& u : layout(spec)) names.push_back(u.name);
  return names;
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
