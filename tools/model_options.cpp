// model_options.cpp — the model group of the command lines (options.hpp's ModelOptions): the preset
// or shape, the attention kernel, the loss head's chunks and the mixture-of-experts flags.
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "src/backend/ops/cudnn_attention.hpp"
#include "src/core/suggest.hpp"
#include "src/model/family.hpp"
#include "src/model/resolve.hpp"
#include "tools/options.hpp"

namespace shardlab::cli {

// ---- model --------------------------------------------------------------------------------------

namespace {

// The five dimensions of a shape, each flag declared here only; 0 means meaning0[i] where given.
void add_dims(Desc& g, ModelOptions& m, const char* const (&shown)[5], const char* const (&meaning0)[5]) {
  constexpr const char* kFlags[5] = {"layers", "dim", "heads", "seq", "vocab"};
  constexpr const char* kMeaning[5] = {"transformer blocks L", "channels C", "attention heads H",
                                       "sequence length T, also the model's positions", "vocabulary V"};
  int64_t* fields[5] = {&m.layers, &m.dim, &m.heads, &m.seq, &m.vocab};
  for (int i = 0; i < 5; ++i) {
    auto* v = po::value(fields[i]);
    if (shown[i]) v->default_value(*fields[i], shown[i]);
    else v->default_value(*fields[i]);
    const std::string help = meaning0[i] ? fmt::format("{} (0 = {})", kMeaning[i], meaning0[i]) : kMeaning[i];
    g.add_options()(kFlags[i], v, help.c_str());
  }
}

}  // namespace

void ModelOptions::add(Desc& d) {
  Desc g("model");
  g.add_options()("model", po::value(&preset)->default_value(preset, "small"),
                  ("preset: " + join_names(model_preset_names()) + " (not with --init DIR, whose config.json gives the model)").c_str());
  const char* const shown[5] = {};
  const char* const preset_s[5] = {"the preset's", "the preset's", "the preset's", "the preset's", "the preset's"};
  add_dims(g, *this, shown, preset_s);
  g.add_options()("kv-heads", po::value(&kv_heads)->default_value(0),
                  "K/V heads of grouped-query attention, dividing --heads (0 = the preset's; GPT-2: as many as heads)")(
      "ffn-dim", po::value(&ffn_dim)->default_value(0), "the MLP's hidden width (0 = the preset's; GPT-2: 4C)")(
      "attention", po::value(&attention)->default_value(attention),
      "attention kernel: flash (fused, online softmax: O(T) memory), naive (keeps the (B, H, T, T) probabilities; "
      "the reference), cudnn (cuDNN's fused attention on a GPU, bf16 inside; CUDA builds with cuDNN) or auto: cudnn "
      "on CUDA with --param-dtype bf16 where this build has it and the heads suit it (not under --cp; plan: flash), "
      "flash elsewhere; KV-cached decoding (sample) goes through the same kernel (cudnn: the fused one)")(
      "loss-chunk", po::value(&loss_chunk)->default_value(loss_chunk),
      "training and evaluation: the head's logits, cross-entropy and their gradient this many positions at a time, "
      "the product run again in backward, so no (B*T, V) logits are held (0 = whole; under --tp each chunk's "
      "vocabulary-parallel loss)")(
      "activation-dtype", po::value(&activation_dtype)->default_value(activation_dtype),
      "training: the dtype the step keeps each unit's saved activations in between its forward and its backward: "
      "f32, bf16 (half their memory, as Megatron keeps them; the norms' and attention's statistics stay f32, as does "
      "the residual stream between units) or auto: bf16 on CUDA with --param-dtype bf16 (where the kernels write "
      "and read them in bf16), f32 elsewhere")(
      "moe-capacity-factor", po::value(&moe_capacity_factor)->default_value(moe_capacity_factor),
      "mixture-of-experts models (mixtral, qwen3_moe): each expert takes at most ceil(F x tokens x k / experts) of a "
      "micro-batch's tokens per layer, the rest dropped (their slot adds nothing; counted in the progress line and "
      "the log) (0 = dropless)")(
      "moe-aux-loss", po::value(&moe_aux_loss)->default_value(moe_aux_loss),
      "mixture-of-experts models: whether the objective adds router_aux_loss_coef x the load-balancing loss: model "
      "(as the model says: a config.json's output_router_logits, false when absent, as transformers; presets and "
      "shardlab's checkpoints on), on, or off. The loss is computed and logged either way")(
      "moe-bias-update-rate", po::value(&moe_bias_rate)->default_value(moe_bias_rate),
      "deepseek_v3 models: auxiliary-loss-free balancing; after each step every MoE layer's correction bias moves by "
      "this rate x sign(mean load - the expert's load), the loads counted over the global batch: model (as the model "
      "says: 0.001, the paper's, for presets and config.json imports; a checkpoint's own), 0 (the bias stays as "
      "loaded, as transformers trains), or a rate in (0, 1]");
  d.add(g);
}

void ModelOptions::add_shape(Desc& d, const char* const (&shown)[5], const char* const (&meaning0)[5]) {
  Desc g("model shape");
  add_dims(g, *this, shown, meaning0);
  d.add(g);
}

ModelSpec ModelOptions::spec(const std::string& init) const {
  return computing(resolve_model(ModelRequest{preset, layers, dim, heads, seq, vocab, kv_heads, ffn_dim, init}));
}

DType ModelOptions::activation_dtype_on(Device device, DType param_dtype) const {
  SHARD_REQUIRE(activation_dtype == "auto" || activation_dtype == "f32" || activation_dtype == "bf16",
                "--activation-dtype '{}': expected f32, bf16 or auto", activation_dtype);
  if (activation_dtype != "auto") return parse_dtype(activation_dtype);
  return device == Device::cuda && param_dtype == DType::bf16 ? DType::bf16 : DType::f32;
}

AttentionKernel ModelOptions::attention_on(const ModelSpec& spec, Device device, DType param_dtype, bool cp) const {
  if (attention != "auto") return parse_attention_kernel(attention);
  if (device != Device::cuda || param_dtype != DType::bf16 || cp) return AttentionKernel::flash;
  const int64_t hd = spec.mla.enabled() ? spec.mla.qk() : spec.head_size();
  const int64_t vd = spec.mla.enabled() ? spec.mla.v : hd;
  return cudnn_attention_refusal(device, true, hd, vd).empty() ? AttentionKernel::cudnn : AttentionKernel::flash;
}

ModelSpec ModelOptions::computing(ModelSpec s) const {
  SHARD_REQUIRE(loss_chunk >= 0 && loss_chunk <= (1 << 30), "--loss-chunk {}: expected 0 (whole) or positions", loss_chunk);
  s.attention = attention == "auto" ? AttentionKernel::flash : parse_attention_kernel(attention);
  s.loss_chunk = loss_chunk;
  s.activation_dtype = activation_dtype_on(Device::cpu, DType::f32);
  s.moe_capacity_factor = moe_capacity_factor;
  SHARD_REQUIRE(moe_aux_loss == "model" || moe_aux_loss == "on" || moe_aux_loss == "off",
                "--moe-aux-loss '{}': expected model, on or off", moe_aux_loss);
  SHARD_REQUIRE(moe_aux_loss == "model" || s.moe.enabled(), "--moe-aux-loss {}: {} has no experts (a mixture of "
                "experts' balancing loss: the mixtral and qwen3_moe families)", moe_aux_loss, s.name);
  if (moe_aux_loss != "model") s.moe.aux_loss = moe_aux_loss == "on";
  if (moe_bias_rate != "model") {
    double rate = -1;
    try {
      size_t used = 0;
      rate = std::stod(moe_bias_rate, &used);
      if (used != moe_bias_rate.size()) rate = -1;
    } catch (const std::exception&) {
    }
    SHARD_REQUIRE(std::isfinite(rate) && rate >= 0 && rate <= 1,
                  "--moe-bias-update-rate '{}': expected model or a rate in [0, 1]", moe_bias_rate);
    SHARD_REQUIRE(s.moe.sigmoid, "--moe-bias-update-rate {}: {} has no correction bias to move (DeepSeek-V3's "
                  "sigmoid router: the deepseek_v3 family)", moe_bias_rate, s.name);
    s.moe.bias_rate = rate;
  }
  s.validate();  // --moe-capacity-factor against the model
  return s;
}

bool ModelOptions::given() const {
  return !preset.empty() || layers || dim || heads || seq || vocab || kv_heads || ffn_dim;
}

}  // namespace shardlab::cli
