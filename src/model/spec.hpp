// spec.hpp — ModelSpec (GPT-2 shape), presets, its JSON form, and the parameter layout: which
// tensors each Unit owns, in which order, with which shape, initialisation and weight-decay flag.
// Names and layouts are Hugging Face's (Conv1D weights stored (in, out)).
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shardlab {

struct ModelSpec {
  std::string name = "custom";
  int64_t layers = 0;  // L
  int64_t dim = 0;     // C
  int64_t heads = 0;   // H
  int64_t seq = 0;     // T, the longest sequence (rows of wpe)
  int64_t vocab = 0;   // V
  void validate() const;  // throws InputError naming the bad value
  std::string describe() const;  // "gpt2 (L=12 C=768 H=12 T=1024 V=50257, 124.44M params)"
};

// tiny (tests), small (the embedded demo), gpt2, gpt2-medium, gpt2-large, gpt2-xl.
ModelSpec model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

// {"name", "layers", "dim", "heads", "seq", "vocab"}: the form checkpoints and reports store.
nlohmann::json spec_to_json(const ModelSpec& spec);
// The inverse, validated: each size must be an integer (at least 1; vocab at least 2), a present
// "name" a string (absent: "custom"), and the whole pass ModelSpec::validate. Throws InputError.
ModelSpec spec_from_json(const nlohmann::json& j);

enum class Init : uint8_t { normal, zeros, ones };

struct TensorDecl {
  std::string name;              // HF name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;
  int64_t offset = 0;            // elements from the start of the unit's flat buffer
  int64_t numel = 0;
  bool decay = false;            // weight decay applies (tensors with >= 2 dims)
  Init init = Init::zeros;
  float std = 0.f;               // for Init::normal
  std::string shape_str() const;
};

struct UnitLayout {
  std::string name;  // "embedding", "h.0", ..., "head"
  std::vector<TensorDecl> tensors;
  int64_t numel = 0;
  const TensorDecl& find(std::string_view tensor) const;  // InternalError if absent
};

// Units in execution order: embedding, h.0 .. h.{L-1}, head (ln_f; the lm head is tied to wte).
std::vector<UnitLayout> gpt2_layout(const ModelSpec& spec);
int64_t num_params(const std::vector<UnitLayout>& layout);
std::vector<std::string> gpt2_unit_names(const ModelSpec& spec);  // "embedding", "h.0", ..., "head"
// Training FLOPs per token, llm.c's count: 6N + 6LCT (N parameters; no recomputation).
double flops_per_token(const ModelSpec& spec);

// GPT-2 initialisation of elements [first, first + out.size()) of a unit's flat buffer, as a
// function of (seed, tensor name, index in tensor) only: any shard initialises alone.
void init_flat_range(const UnitLayout& unit, uint64_t seed, int64_t first, std::span<float> out);

}  // namespace shardlab
