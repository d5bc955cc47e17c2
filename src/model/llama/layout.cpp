// layout.cpp — Llama's parameters: which tensors each unit owns, in HF's names and shapes
// (nn.Linear weights (out, in)), with HF's initialisation (_init_weights: every matrix normal(0,
// initializer_range 0.02), RMSNorm weights ones; no residual scaling, unlike GPT-2).
//
// Mixtral and Qwen3-MoE are this layout with a mixture of experts in place of the MLP (blocks/moe.hpp:
// the router, then each expert's gate, up and down; router and experts normal(0, 0.02) as HF's
// _init_weights), and for Qwen3 an RMSNorm of each query and key head (q_norm, k_norm: ones).
//
// Within a layer, q_proj, k_proj and v_proj follow one another in the unit's flat buffer, as do
// gate_proj and up_proj: stacked, they are the ((H + 2 KV) hd, C) and (2F, C) matrices one GEMM
// each multiplies by (units.cpp).
//
// Tensor parallelism (Megatron; nn.Linear is (out, in)): q/k/v_proj and gate/up_proj split by
// output rows (column-parallel: each rank holds its heads, its KV heads, its slice of the MLP
// width, still adjacent and stacked), o_proj and down_proj by input columns (row-parallel),
// embed_tokens and lm_head by vocabulary rows (padded). The RMSNorm weights are replicated.
// Expert parallelism: a rank's units hold its block of experts (EpConfig), the rest whole.
#include "src/model/llama/llama.hpp"

namespace shardlab {

std::vector<UnitLayout> llama_layout(const ModelSpec& s, const TpConfig& tp, const EpConfig& ep) {
  const int64_t C = s.dim, F = s.ffn_hidden(), hd = s.head_size();
  const int64_t q_rows = s.heads * hd, kv_rows = s.num_kv_heads() * hd;
  const float std = 0.02f;
  const TpSplit vocab{0, 1, true}, rows{0}, cols{1};
  std::vector<UnitLayout> units;
  UnitLayout emb{"embedding", {}, 0, tp.degree, tp.rank, ep};
  add_tensor(emb, "model.embed_tokens.weight", {s.vocab, C}, Init::normal, std, vocab);
  units.push_back(std::move(emb));
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    UnitLayout b{"layers." + std::to_string(l), {}, 0, tp.degree, tp.rank, ep};
    add_tensor(b, p + "input_layernorm.weight", {C}, Init::ones);
    add_tensor(b, p + "self_attn.q_proj.weight", {q_rows, C}, Init::normal, std, rows);
    add_tensor(b, p + "self_attn.k_proj.weight", {kv_rows, C}, Init::normal, std, rows);
    add_tensor(b, p + "self_attn.v_proj.weight", {kv_rows, C}, Init::normal, std, rows);
    add_tensor(b, p + "self_attn.o_proj.weight", {C, q_rows}, Init::normal, std, cols);
    if (s.qk_norm) {
      add_tensor(b, p + "self_attn.q_norm.weight", {hd}, Init::ones);
      add_tensor(b, p + "self_attn.k_norm.weight", {hd}, Init::ones);
    }
    add_tensor(b, p + "post_attention_layernorm.weight", {C}, Init::ones);
    if (s.moe.enabled()) {
      // The router replicated over a tensor-parallel group, computed whole on each rank; each expert
      // split as the dense MLP is (Megatron's expert tensor parallelism): gate and up by rows, down
      // by columns.
      const TpSplit whole{-1, 1, false, true};
      add_tensor(b, moe_tensor(s, p, MoePart::router), {s.moe.experts, C}, Init::normal, std, whole);
      add_moe_experts(b, s, p, ep);
    } else {
      add_tensor(b, p + "mlp.gate_proj.weight", {F, C}, Init::normal, std, rows);
      add_tensor(b, p + "mlp.up_proj.weight", {F, C}, Init::normal, std, rows);
      add_tensor(b, p + "mlp.down_proj.weight", {C, F}, Init::normal, std, cols);
    }
    units.push_back(std::move(b));
  }
  UnitLayout head{"head", {}, 0, tp.degree, tp.rank, ep};
  add_tensor(head, "model.norm.weight", {C}, Init::ones);
  if (!s.tied_head) add_tensor(head, "lm_head.weight", {s.vocab, C}, Init::normal, std, vocab);
  units.push_back(std::move(head));
  return units;
}

void add_moe_experts(UnitLayout& b, const ModelSpec& s, const std::string& p, const EpConfig& ep) {
  const int64_t C = s.dim, Fe = s.moe.ffn_dim, local = s.moe.experts / ep.degree;
  const TpSplit rows{0}, cols{1};
  for (int64_t e = ep.rank * local; e < (ep.rank + 1) * local; ++e) {  // gate and up adjacent: one stacked product
    for (auto [part, shape] : {std::pair{MoePart::gate, std::vector<int64_t>{Fe, C}}, {MoePart::up, {Fe, C}},
                               {MoePart::down, {C, Fe}}}) {
      add_tensor(b, moe_tensor(s, p, part, e), shape, Init::normal, 0.02f, part == MoePart::down ? cols : rows);
      b.tensors.back().expert = true;
    }
  }
}

std::string moe_tensor(const ModelSpec& s, const std::string& prefix, MoePart part, int64_t e) {
  const bool mixtral = s.family == FamilyId::mixtral;
  const std::string block = prefix + (mixtral ? "block_sparse_moe." : "mlp.");
  if (part == MoePart::router) return block + "gate.weight";
  static const char* const kMixtral[] = {"", "w1", "w3", "w2"};
  static const char* const kQwen[] = {"", "gate_proj", "up_proj", "down_proj"};
  const auto i = static_cast<size_t>(part);
  return block + "experts." + std::to_string(e) + "." + (mixtral ? kMixtral[i] : kQwen[i]) + ".weight";
}

}  // namespace shardlab
