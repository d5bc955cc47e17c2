// llama.hpp — Llama (Meta's Llama 2 and 3, and the models of its shape: TinyLlama, SmolLM), as
// Hugging Face's LlamaForCausalLM computes it: a token embedding (no learned positions),
// pre-RMSNorm decoder layers of causal grouped-query attention with rotary position embeddings
// (HF's rotate_half convention, optionally Llama 3.1's frequency scaling) and a SwiGLU MLP, no
// biases anywhere, then a final RMSNorm and an LM head that is its own matrix unless tied to the
// embedding. Tensor names and layouts are HF's (nn.Linear weights stored (out, in)), so HF files
// load as they are.
//
// Everything outside this folder reaches Llama through llama_family() (family.hpp's registry);
// the parts are declared here for the family and for tests.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <vector>

#include "src/backend/ops/rope.hpp"
#include "src/model/family.hpp"

namespace shardlab {

class HfConfigReader;  // src/model/hf_config_reader.hpp

const ModelFamily& llama_family();

// family.cpp: llama-tiny (tests), llama-small (demos), and the published shapes llama2-7b,
// llama3-8b, llama3-70b, llama3-405b (Llama 3.1), tinyllama-1.1b, smollm-135m.
std::vector<ModelPreset> llama_presets();
// hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, vocab_size and
// max_position_embeddings required; what HF defaults when absent defaults as HF does
// (num_key_value_heads: heads, rms_norm_eps 1e-6, rope_theta 10000, tie_word_embeddings false).
// Rope parameters in either form: "rope_theta" + "rope_scaling", or transformers 5's
// "rope_parameters". Fields that change nothing shardlab computes (token ids, dropout, dtype,
// use_cache) ignored; unknown fields and values the units do not compute refused by name.
ModelSpec llama_spec_from_hf_config(const nlohmann::json& config);
nlohmann::json llama_hf_config(const ModelSpec& spec);
// The rope parameters of a Llama-shaped config (llama, mixtral, qwen3_moe), from transformers 5's
// "rope_parameters" or the classic "rope_theta" and "rope_scaling" (null or absent: none), into
// s.rope_theta and s.rope_scaling (s.seq read already); InputError for what the units do not compute.
void llama_read_rope(const nlohmann::json& j, const HfConfigReader& c, ModelSpec& s);
// What every Llama-shaped config.json (llama, mixtral, qwen3_moe) holds. The sizes: hidden_size,
// `width` (the MLP's or each expert's intermediate size) into width_out, num_hidden_layers,
// num_attention_heads, vocab_size, max_position_embeddings, each missing one remembered for
// c.check_missing(). Then, after it: num_key_value_heads (absent: as many as heads), rms_norm_eps
// (1e-6), tie_word_embeddings (false), and hidden_act, which must be silu.
void llama_read_sizes(HfConfigReader& c, ModelSpec& s, const char* width, int64_t& width_out);
void llama_read_shared(const nlohmann::json& j, HfConfigReader& c, ModelSpec& s);
// The fields of the configs built on Llama's (mixtral, qwen3_moe, qwen3) that change nothing
// shardlab computes: Llama's own, plus max_window_layers and layer_types (a sliding window's,
// which each family refuses where it is asked for).
const std::set<std::string>& llama_derived_ignored_fields();
// "head_dim" (qwen3, qwen3_moe): a positive integer; s.head_dim set where it is not dim / heads.
void llama_read_head_dim(const nlohmann::json& j, const HfConfigReader& c, ModelSpec& s);
// InputError unless RoPE can rotate the spec's heads (a positive base, an even head size).
void llama_check_rope(const ModelSpec& spec);
// 6N + 6L(H hd)T as GPT-2's (llm.c's) count (H hd = C unless a family sets head_dim), with N the
// parameters outside the token embedding (an untied LM head counts: it is a product per token; a
// lookup is not).
double llama_flops_per_token(const ModelSpec& spec);

// HF's inv_freq for the spec's head size, in f32 arithmetic as transformers computes it:
// 1 / theta^(arange(0, hd, 2) / hd), then Llama 3.1's scaling when the spec asks for it.
RopeFreqs llama_rope_freqs(const ModelSpec& spec);

// layout.cpp: units in execution order: embedding, layers.0 .. layers.{L-1}, head (model.norm
// and lm_head; a tied head borrows model.embed_tokens.weight).
std::vector<UnitLayout> llama_layout(const ModelSpec& spec, const TpConfig& tp = {}, const EpConfig& ep = {});

// The MoE families' tensor names of layer `prefix` ("model.layers.3."): the router, and expert e's
// gate, up and down projections (Mixtral: block_sparse_moe.gate, experts.e.w1 / w3 / w2; Qwen3-MoE:
// mlp.gate, mlp.experts.e.gate_proj / up_proj / down_proj).
enum class MoePart : uint8_t { router, gate, up, down };
std::string moe_tensor(const ModelSpec& spec, const std::string& prefix, MoePart part, int64_t expert = 0);
// Expert-parallel rank ep.rank's experts of layer `prefix` (gate, up, down each; HF's init), appended
// to the unit after every tensor the ep group holds whole, so those lie at the same offsets on each
// of its ranks.
void add_moe_experts(UnitLayout& unit, const ModelSpec& spec, const std::string& prefix, const EpConfig& ep);

// units.cpp. The embedding and the head alone: the families built around Llama's (deepseek/).
std::unique_ptr<Unit> make_llama_embedding(UnitLayout layout, const TpConfig& tp);
std::unique_ptr<Unit> make_llama_head(UnitLayout layout, bool tied, const TpConfig& tp);
std::vector<std::unique_ptr<Unit>> make_llama_units(const ModelSpec& spec, const TpConfig& tp = {},
                                                    const EpConfig& ep = {});

}  // namespace shardlab
