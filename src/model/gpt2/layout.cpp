// layout.cpp — GPT-2's parameters: which tensors each unit owns, in HF's names, order and shapes,
// with GPT-2's initialisation (normal(0, 0.02), residual projections scaled by 1/sqrt(2L)).
//
// Tensor parallelism (Megatron): c_attn (Conv1D, (in, out)) column-parallel by heads, so each rank
// holds its heads' columns of q, of k and of v ([q | k | v] locally too); attn.c_proj row-parallel;
// c_fc column-parallel, mlp.c_proj row-parallel; wte split by vocabulary rows (padded), which
// also makes the tied head vocabulary-parallel. Norms, wpe and the row-parallel biases are
// replicated.
#include <cmath>

#include "src/model/gpt2/gpt2.hpp"

namespace shardlab {

std::vector<UnitLayout> gpt2_layout(const ModelSpec& s, const TpConfig& tp) {
  const int64_t C = s.dim, F = s.ffn_hidden();
  const float std = 0.02f;
  const TpSplit vocab{0, 1, true}, rows{0}, cols{1}, qkv_cols{1, 3}, qkv_bias{0, 3};
  const float proj_std = 0.02f / std::sqrt(2.f * static_cast<float>(s.layers));  // GPT-2's residual scaling
  std::vector<UnitLayout> units;
  UnitLayout emb{"embedding", {}, 0, tp.degree, tp.rank, {}};
  add_tensor(emb, "wte.weight", {s.vocab, C}, Init::normal, std, vocab);
  add_tensor(emb, "wpe.weight", {s.seq, C}, Init::normal, std);
  units.push_back(std::move(emb));
  for (int64_t l = 0; l < s.layers; ++l) {
    std::string p = "h." + std::to_string(l) + ".";
    UnitLayout b{"h." + std::to_string(l), {}, 0, tp.degree, tp.rank, {}};
    add_tensor(b, p + "ln_1.weight", {C}, Init::ones);
    add_tensor(b, p + "ln_1.bias", {C}, Init::zeros);
    add_tensor(b, p + "attn.c_attn.weight", {C, 3 * C}, Init::normal, std, qkv_cols);
    add_tensor(b, p + "attn.c_attn.bias", {3 * C}, Init::zeros, 0.f, qkv_bias);
    add_tensor(b, p + "attn.c_proj.weight", {C, C}, Init::normal, proj_std, rows);
    add_tensor(b, p + "attn.c_proj.bias", {C}, Init::zeros);
    add_tensor(b, p + "ln_2.weight", {C}, Init::ones);
    add_tensor(b, p + "ln_2.bias", {C}, Init::zeros);
    add_tensor(b, p + "mlp.c_fc.weight", {C, F}, Init::normal, std, cols);
    add_tensor(b, p + "mlp.c_fc.bias", {F}, Init::zeros, 0.f, rows);
    add_tensor(b, p + "mlp.c_proj.weight", {F, C}, Init::normal, proj_std, rows);
    add_tensor(b, p + "mlp.c_proj.bias", {C}, Init::zeros);
    units.push_back(std::move(b));
  }
  UnitLayout head{"head", {}, 0, tp.degree, tp.rank, {}};
  add_tensor(head, "ln_f.weight", {C}, Init::ones);
  add_tensor(head, "ln_f.bias", {C}, Init::zeros);
  units.push_back(std::move(head));
  return units;
}

}  // namespace shardlab
