// family.hpp — ModelFamily: everything shardlab knows about one kind of model, and the registry
// that finds a family by name or from a ModelSpec.
//
// A family is a folder under src/model/ (gpt2/, llama/) with the same few parts: presets and the
// spec from a Hugging Face config.json, the unit layout (for a tensor-parallel degree and rank),
// the units, the state-dict adapter to HF tensor names, FLOPs per token, the layer's costs for
// plan's time model and the tokenizer it uses. Everything else (runner, strategies, trainer, checkpoints, predictions) asks
// family_of(spec) and never names a model, as torchtitan's trainer never names models/llama3/.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/model/aux.hpp"
#include "src/model/spec.hpp"
#include "src/model/unit.hpp"

namespace shardlab {

struct ModelPreset {
  ModelSpec spec;
  std::string help;  // one line for --help: what the preset is for
};

// The tokenizer a family's checkpoints expect (src/data/tokenizer.hpp implements them).
enum class TokenizerKind : uint8_t {
  gpt2_bpe,     // GPT-2's byte-level BPE (encoder.json, vocab.bpe)
  hf_byte_bpe,  // a Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, Llama 3, SmolLM)
};
const char* tokenizer_name(TokenizerKind t);  // "gpt2-bpe", "hf-byte-bpe"

// What plan's time model (src/plan/plan_time.hpp) needs of a family's layer beyond the spec's
// sizes: its products' shapes follow from the spec, these from what the layer computes. Accesses
// are element reads and writes of one forward (the model charges the backward twice, scores apart).
struct LayerCosts {
  int mlp_in_products = 1;       // products that read the MLP's input: 1 (GeLU), 2 (SwiGLU's gate and up)
  double hidden_accesses = 0;    // per token x hidden element: norms, residual adds, biases and dropout
  double mlp_accesses = 0;       // per token x MLP element: the activation
  double rope_accesses = 0;      // per query and key element: the rotary embedding (0 without)
  double score_accesses = 0;     // per attention score, forward (softmax, dropout)
  double score_accesses_bwd = 0; // per attention score, backward
  double embed_accesses = 0;     // per token x hidden element of the first stage's embedding lookup
  bool learned_positions = false;  // a (seq, hidden) position table beside the token embedding
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  virtual FamilyId id() const = 0;
  virtual const char* name() const = 0;  // "gpt2": as specs and manifests spell it
  virtual std::vector<ModelPreset> presets() const = 0;
  // The preset that size flags change when a command is given the family instead of a model
  // (plan --family): a small one.
  virtual const char* sized_preset() const = 0;
  // A spec from a Hugging Face config.json. InputError naming each missing field, and each field
  // shardlab does not know or whose value its units do not compute.
  virtual ModelSpec spec_from_hf_config(const nlohmann::json& config) const = 0;
  // The inverse: the config.json an exported HF model directory carries, which transformers loads
  // (its model_type, architectures and every field spec_from_hf_config reads) and
  // spec_from_hf_config reads back to the same spec (its name aside).
  virtual nlohmann::json hf_config(const ModelSpec& spec) const = 0;
  // InputError when the spec asks for something this family does not compute (ModelSpec::validate
  // calls it after the model-neutral checks).
  virtual void check(const ModelSpec& spec) const = 0;

  // Units in execution order with the tensors tensor-parallel rank tp.rank of tp.degree holds
  // (Megatron's layout: attention column-parallel by heads, its output projection row-parallel,
  // the MLP's first linears column-parallel and its second row-parallel, the vocabulary split
  // over the embedding and the head). InputError when the degree does not divide the heads, the
  // KV heads or the MLP width, naming them. A mixture of experts' units hold expert-parallel rank
  // ep.rank's block of experts (EpConfig; every expert by default).
  std::vector<UnitLayout> layout(const ModelSpec& spec, const TpConfig& tp = {}, const EpConfig& ep = {}) const;
  std::vector<std::unique_ptr<Unit>> make_units(const ModelSpec& spec, const TpConfig& tp = {},
                                                const EpConfig& ep = {}) const;
  std::vector<std::string> unit_names(const ModelSpec& spec) const;  // as layout(spec) names them

  // The state-dict adapter (safetensors save, load, export): the name a layout tensor has in an
  // HF file, and the names a load accepts for it, preferred first.
  virtual std::string hf_name(const TensorDecl& t) const = 0;
  virtual std::vector<std::string> hf_load_names(const TensorDecl& t) const = 0;
  // Training FLOPs per token (forward and backward, no recomputation): what MFU divides by.
  virtual double flops_per_token(const ModelSpec& spec) const = 0;
  virtual TokenizerKind tokenizer() const = 0;
  virtual LayerCosts layer_costs() const = 0;
  // A training micro-step's auxiliary channel (src/model/aux.hpp), or none.
  virtual std::unique_ptr<AuxChannel> aux_channel(const ModelSpec&) const { return nullptr; }

 protected:
  // layout() and make_units() check the tensor- and expert-parallel arguments, then call these.
  virtual std::vector<UnitLayout> do_layout(const ModelSpec& spec, const TpConfig& tp, const EpConfig& ep) const = 0;
  virtual std::vector<std::unique_ptr<Unit>> do_make_units(const ModelSpec& spec, const TpConfig& tp,
                                                           const EpConfig& ep) const = 0;
};

// Why the model cannot be split over `degree` tensor-parallel ranks (the InputError message
// layout() and make_units() throw: "--tp 4 must divide the MLP width (510) of small"), or nothing
// when it can. The one rule: the planner asks it before proposing a --tp, so plan never proposes a
// degree train refuses.
std::optional<std::string> tp_split_problem(const ModelSpec& spec, int degree);

const ModelFamily& family_of(const ModelSpec& spec);
const ModelFamily& model_family(std::string_view name);  // InputError naming the families otherwise
std::vector<std::string> model_family_names();

}  // namespace shardlab
