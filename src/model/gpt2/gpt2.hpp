// gpt2.hpp — GPT-2 (OpenAI's, as Hugging Face's GPT2LMHeadModel holds it): learned token and
// position embeddings, pre-LayerNorm blocks of causal multi-head attention and a GELU (tanh) MLP,
// and a final LayerNorm whose LM head is tied to the token embedding. Tensor names and layouts are
// HF's (Conv1D weights stored (in, out)), so HF files load as they are.
//
// Everything outside this folder reaches GPT-2 through gpt2_family() (family.hpp's registry);
// the parts are declared here for the family and for tests.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <vector>

#include "src/model/family.hpp"

namespace shardlab {

const ModelFamily& gpt2_family();

// family.cpp: tiny (tests), small (the embedded demo), gpt2, gpt2-medium, gpt2-large, gpt2-xl.
std::vector<ModelPreset> gpt2_presets();
// n_embd, n_layer, n_head, vocab_size, n_positions (or n_ctx), layer_norm_epsilon required; the
// fields that change nothing shardlab computes (dropouts, token ids, the summary head) ignored.
ModelSpec gpt2_spec_from_hf_config(const nlohmann::json& config);
nlohmann::json gpt2_hf_config(const ModelSpec& spec);
// llm.c's count: 6N + 6LCT (N parameters; no recomputation).
double gpt2_flops_per_token(const ModelSpec& spec);

// layout.cpp: units in execution order: embedding, h.0 .. h.{L-1}, head (ln_f; the LM head is wte).
std::vector<UnitLayout> gpt2_layout(const ModelSpec& spec, const TpConfig& tp = {});

// units.cpp
std::vector<std::unique_ptr<Unit>> make_gpt2_units(const ModelSpec& spec, const TpConfig& tp = {});

}  // namespace shardlab
