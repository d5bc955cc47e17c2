// layout.cpp — DeepSeek-V3's parameters (deepseek.hpp): which tensors each unit owns, in HF's names
// and shapes, with HF's initialisation (matrices normal(0, 0.02), norm weights ones, the correction
// bias zeros). The embedding and the head are Llama's (llama/layout.cpp).
#include "src/model/deepseek/deepseek.hpp"
#include "src/model/blocks/moe.hpp"
#include "src/model/llama/llama.hpp"

namespace shardlab {

std::vector<UnitLayout> deepseek_layout(const ModelSpec& s, const TpConfig& tp, const EpConfig& ep) {
  const MlaSpec& a = s.mla;
  const int64_t C = s.dim, H = s.heads;
  const float std = 0.02f;
  const TpSplit rows{0}, cols{1}, whole{-1, 1, false, true}, vocab{0, 1, true};
  std::vector<UnitLayout> out;
  UnitLayout emb{"embedding", {}, 0, tp.degree, tp.rank, ep};
  add_tensor(emb, "model.embed_tokens.weight", {s.vocab, C}, Init::normal, std, vocab);
  out.push_back(std::move(emb));
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    UnitLayout b{"layers." + std::to_string(l), {}, 0, tp.degree, tp.rank, ep};
    add_tensor(b, p + "input_layernorm.weight", {C}, Init::ones);
    if (a.q_rank > 0) {
      add_tensor(b, p + "self_attn.q_a_proj.weight", {a.q_rank, C}, Init::normal, std);
      add_tensor(b, p + "self_attn.q_a_layernorm.weight", {a.q_rank}, Init::ones);
      add_tensor(b, p + "self_attn.q_b_proj.weight", {H * a.qk(), a.q_rank}, Init::normal, std, rows);
    } else {
      add_tensor(b, p + "self_attn.q_proj.weight", {H * a.qk(), C}, Init::normal, std, rows);
    }
    add_tensor(b, p + "self_attn.kv_a_proj_with_mqa.weight", {a.kv_rank + a.rope, C}, Init::normal, std);
    add_tensor(b, p + "self_attn.kv_a_layernorm.weight", {a.kv_rank}, Init::ones);
    add_tensor(b, p + "self_attn.kv_b_proj.weight", {H * (a.nope + a.v), a.kv_rank}, Init::normal, std, rows);
    add_tensor(b, p + "self_attn.o_proj.weight", {C, H * a.v}, Init::normal, std, cols);
    add_tensor(b, p + "post_attention_layernorm.weight", {C}, Init::ones);
    if (s.moe.sparse(l)) {
      // The router whole on every rank (as Qwen3-MoE's), its bias too; then what the ep group holds
      // whole (the shared experts), then this ep rank's experts (at the same offsets on each rank).
      add_tensor(b, moe_tensor(s, p, MoePart::router), {s.moe.experts, C}, Init::normal, std, whole);
      add_tensor(b, p + std::string(kCorrectionBias), {s.moe.experts}, Init::zeros, 0.f, whole);
      const int64_t Fs = s.moe.shared_ffn;
      if (Fs > 0) {
        add_tensor(b, p + "mlp.shared_experts.gate_proj.weight", {Fs, C}, Init::normal, std, rows);
        add_tensor(b, p + "mlp.shared_experts.up_proj.weight", {Fs, C}, Init::normal, std, rows);
        add_tensor(b, p + "mlp.shared_experts.down_proj.weight", {C, Fs}, Init::normal, std, cols);
      }
      add_moe_experts(b, s, p, ep);
    } else {
      const int64_t F = s.ffn_hidden();
      add_tensor(b, p + "mlp.gate_proj.weight", {F, C}, Init::normal, std, rows);
      add_tensor(b, p + "mlp.up_proj.weight", {F, C}, Init::normal, std, rows);
      add_tensor(b, p + "mlp.down_proj.weight", {C, F}, Init::normal, std, cols);
    }
    out.push_back(std::move(b));
  }
  UnitLayout head{"head", {}, 0, tp.degree, tp.rank, ep};
  add_tensor(head, "model.norm.weight", {C}, Init::ones);
  if (!s.tied_head) add_tensor(head, "lm_head.weight", {s.vocab, C}, Init::normal, std, vocab);
  out.push_back(std::move(head));
  return out;
}

}  // namespace shardlab
