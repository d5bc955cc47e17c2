// qwen3.hpp — Qwen3 dense (Qwen3ForCausalLM): Llama's decoder (llama/: the embedding, grouped-query
// attention with RoPE, RMSNorms, SwiGLU MLP and head) with an RMSNorm of each query and key head
// before RoPE and a head size of its own: the qwen3_moe family's attention without experts. The
// layout and units are Llama's, which read spec.qk_norm and spec.head_dim; this folder holds what
// differs: presets, config.json both ways, FLOPs per token.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <vector>

#include "src/model/family.hpp"

namespace shardlab {

const ModelFamily& qwen3_family();

// qwen3-tiny (the tests'), qwen3-8b (the hub's Qwen/Qwen3-8B config.json).
std::vector<ModelPreset> qwen3_presets();

// The spec from an HF config.json (transformers 5's form, or 4.x's rope_theta) and back. Refused by
// name: sliding-window attention, biases, another activation.
ModelSpec qwen3_spec_from_hf_config(const nlohmann::json& config);
nlohmann::json qwen3_hf_config(const ModelSpec& spec);

}  // namespace shardlab
