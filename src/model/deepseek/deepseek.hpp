// deepseek.hpp — DeepSeek-V3 (transformers' DeepseekV3ForCausalLM) and the models of its shape
// (DeepSeek-V2-Lite's, torchtitan's deepseek_v3 16B): Llama's embedding, pre-RMSNorm layers and
// head (llama/), with multi-head latent attention (MlaSpec; ops/mla.hpp) in every layer, a dense
// SwiGLU MLP in the first moe.dense_layers layers and in the others a mixture of experts with
// DeepSeek's sigmoid router (the correction bias, group-limited top-k, routed_scale; blocks/moe.hpp)
// beside shared experts (one SwiGLU MLP of moe.shared_ffn, added unweighted).
//
// Tensor names and layouts are HF's. Within a layer: input_layernorm, then the queries' path
// (q_a_proj, q_a_layernorm, q_b_proj; or q_proj), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj,
// o_proj, post_attention_layernorm, then the MLP (gate_proj, up_proj, down_proj adjacent: one
// stacked product) or the router (mlp.gate.weight), its correction bias
// (mlp.gate.e_score_correction_bias: a parameter whose gradient is always zero, so the optimizer
// leaves it; the Trainer moves it after each step by the layer's loads under --moe-bias-update-rate,
// blocks/moe.hpp), the shared experts and this expert-parallel rank's routed experts.
//
// Tensor parallelism splits the latent attention by heads: q_b_proj (q_proj) and kv_b_proj by rows,
// o_proj by columns; the low-rank down-projections and their norms are replicated, their gradients
// partial sums over the heads (reduced in the layer's backward). Multi-token prediction
// (num_nextn_predict_layers) is not trained, as transformers does not train it.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <vector>

#include "src/backend/ops/rope.hpp"
#include "src/model/family.hpp"

namespace shardlab {

const ModelFamily& deepseek_v3_family();

// deepseek-v3-tiny (the tests'), deepseek-v2-lite (15.7B), deepseek-v3 (671B).
std::vector<ModelPreset> deepseek_presets();
// The spec from an HF config.json (model_type deepseek_v3) and back.
ModelSpec deepseek_spec_from_hf_config(const nlohmann::json& config);
nlohmann::json deepseek_hf_config(const ModelSpec& spec);
// 6 N_active + 6 L H (qk + v) T / 2: the parameters a token meets outside the embedding (k of the
// routed experts), plus attention's scores and values.
double deepseek_flops_per_token(const ModelSpec& spec);
// RoPE's frequencies over the rope channels: 1 / theta^(2i / rope), in f32 as transformers.
RopeFreqs deepseek_rope_freqs(const ModelSpec& spec);

// layout.cpp, units.cpp
std::vector<UnitLayout> deepseek_layout(const ModelSpec& spec, const TpConfig& tp, const EpConfig& ep);
std::vector<std::unique_ptr<Unit>> make_deepseek_units(const ModelSpec& spec, const TpConfig& tp,
                                                       const EpConfig& ep);

}  // namespace shardlab
