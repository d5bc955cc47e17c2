// resolve.cpp — a model from a preset and size flags, or from an HF directory's config.json
// (resolve.hpp).
#include "src/model/resolve.hpp"

#include <fmt/format.h>

#include <map>
#include <tuple>

#include "src/core/check.hpp"
#include "src/model/family.hpp"
#include "src/model/hf_dir.hpp"

namespace shardlab {
namespace {

// --layers N (fewer) and --seq T (shorter) on an HF directory's model: every tensor the smaller
// model has must be in the directory with the same shape (GPT-2's wpe has a row per position).
void check_loadable(const ModelSpec& hf, const ModelSpec& s, const std::string& init) {
  std::map<std::string, std::vector<int64_t>> shapes;
  const ModelFamily& family = family_of(hf);
  for (const UnitLayout& u : family.layout(hf))
    for (const TensorDecl& t : u.tensors) shapes[t.name] = t.shape;
  for (const UnitLayout& u : family.layout(s))
    for (const TensorDecl& t : u.tensors) {
      auto it = shapes.find(t.name);
      SHARD_CHECK(it != shapes.end(), "a model with fewer layers has tensor {}, which the whole model lacks", t.name);
      SHARD_REQUIRE(it->second == t.shape,
                    "--seq {} with --init {}: tensor '{}' would have shape {}, the directory's has {}; leave --seq "
                    "out (the weights fix it)",
                    s.seq, init, t.name, t.shape_str(), shape_str(it->second));
    }
}

}  // namespace

ModelSpec resolve_model(const ModelRequest& r) {
  const std::string& init = r.init;
  const std::string& preset = r.preset;
  const bool hf = is_hf_model_dir(init);
  SHARD_REQUIRE(!hf || preset.empty(),
                "--model {} with --init {}: the directory's config.json gives the model; leave --model out", preset,
                init);
  const std::string base = preset.empty() ? "small" : preset;
  const ModelSpec given = hf ? read_hf_config(init) : model_preset(base);
  ModelSpec s = given;
  bool custom = false;
  struct Dim {
    const char* flag;
    int64_t* field;
    int64_t value;
    bool may_shrink;  // with --init DIR
  };
  for (const Dim& d : {Dim{"layers", &s.layers, r.layers, true}, Dim{"dim", &s.dim, r.dim, false},
                       Dim{"heads", &s.heads, r.heads, false}, Dim{"seq", &s.seq, r.seq, true},
                       Dim{"vocab", &s.vocab, r.vocab, false}}) {
    SHARD_REQUIRE(d.value >= 0, "model dimensions must be positive, got {}", d.value);
    if (d.value == 0 || d.value == *d.field) continue;
    if (hf)
      SHARD_REQUIRE(d.may_shrink && d.value < *d.field,
                    "--{} {} with --init {}: the directory's config.json fixes the shape ({} {}); leave --{} out{}",
                    d.flag, d.value, init, d.flag, *d.field, d.flag,
                    d.may_shrink ? fmt::format(" or give at most {}", *d.field) : "");
    *d.field = d.value;
    custom = true;
  }
  // With a directory these must be what its config gives (kv_heads 0 and ffn_dim 0 stand for H and 4C).
  for (auto [flag, field, value, effective] : {std::tuple{"kv-heads", &s.kv_heads, r.kv_heads, s.num_kv_heads()},
                                               std::tuple{"ffn-dim", &s.ffn_dim, r.ffn_dim, s.ffn_hidden()}}) {
    SHARD_REQUIRE(value >= 0, "--kv-heads and --ffn-dim must be positive, got {}", value);
    if (hf) {
      SHARD_REQUIRE(value == 0 || value == effective,
                    "--{} {} with --init {}: the directory's config.json fixes the shape ({} {}); leave --{} out", flag,
                    value, init, flag, effective, flag);
    } else if (value > 0 && value != *field) {
      *field = value;
      custom = true;
    }
  }
  if (custom) s.name = (hf ? s.name : base) + "+custom";
  s.validate();
  if (hf && custom) check_loadable(given, s, init);
  return s;
}

}  // namespace shardlab
