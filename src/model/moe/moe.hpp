// moe.hpp — the mixture-of-experts families Mixtral (MixtralForCausalLM) and Qwen3-MoE
// (Qwen3MoeForCausalLM): Llama's decoder (llama/: the same embedding, grouped-query attention with
// RoPE, RMSNorms and head) with a mixture of experts in place of every layer's MLP
// (blocks/moe.hpp), and for Qwen3 an RMSNorm of each query and key head and a head size of its
// own. Their layouts and units are Llama's, which read spec.moe and spec.qk_norm; this folder holds
// what differs: presets, config.json both ways, HF names, FLOPs per token.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <vector>

#include "src/model/family.hpp"

namespace shardlab {

const ModelFamily& mixtral_family();
const ModelFamily& qwen3_moe_family();

// mixtral-tiny (tests), mixtral-8x7b; qwen3-moe-tiny (tests), qwen3-moe-small (a laptop's),
// qwen3-30b-a3b. Published shapes from each model's config.json on the Hugging Face hub.
std::vector<ModelPreset> mixtral_presets();
std::vector<ModelPreset> qwen3_moe_presets();

// The spec from an HF config.json and back (the form transformers 5 writes and 4.x reads).
// Refused by name: sliding-window attention, router jitter, dense layers among the sparse ones
// (Qwen3's mlp_only_layers, decoder_sparse_step), biases.
ModelSpec mixtral_spec_from_hf_config(const nlohmann::json& config);
ModelSpec qwen3_moe_spec_from_hf_config(const nlohmann::json& config);
nlohmann::json moe_hf_config(const ModelSpec& spec);

// 6 N_active + 6 L H hd T: the parameters a token meets (outside the token embedding; an untied
// head counts), with only k of the E experts of each layer, plus attention's scores as Llama's.
double moe_flops_per_token(const ModelSpec& spec);

}  // namespace shardlab
