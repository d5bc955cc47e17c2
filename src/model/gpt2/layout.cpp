// layout.cpp — GPT-2's parameters: which tensors each unit owns, in HF's names, order and shapes,
// with GPT-2's initialisation (normal(0, 0.02), residual projections scaled by 1/sqrt(2L)).
#include <cmath>

#include "src/model/gpt2/gpt2.hpp"

namespace shardlab {

std::vector<UnitLayout> gpt2_layout(const ModelSpec& s) {
  const int64_t C = s.dim, F = s.ffn_hidden();
  const float std = 0.02f;
  const float proj_std = 0.02f / std::sqrt(2.f * static_cast<float>(s.layers));  // GPT-2's residual scaling
  std::vector<UnitLayout> units;
  UnitLayout emb{"embedding", {}, 0};
  add_tensor(emb, "wte.weight", {s.vocab, C}, Init::normal, std);
  add_tensor(emb, "wpe.weight", {s.seq, C}, Init::normal, std);
  units.push_back(std::move(emb));
  for (int64_t l = 0; l < s.layers; ++l) {
    std::string p = "h." + std::to_string(l) + ".";
    UnitLayout b{"h." + std::to_string(l), {}, 0};
    add_tensor(b, p + "ln_1.weight", {C}, Init::ones);
    add_tensor(b, p + "ln_1.bias", {C}, Init::zeros);
    add_tensor(b, p + "attn.c_attn.weight", {C, 3 * C}, Init::normal, std);
    add_tensor(b, p + "attn.c_attn.bias", {3 * C}, Init::zeros);
    add_tensor(b, p + "attn.c_proj.weight", {C, C}, Init::normal, proj_std);
    add_tensor(b, p + "attn.c_proj.bias", {C}, Init::zeros);
    add_tensor(b, p + "ln_2.weight", {C}, Init::ones);
    add_tensor(b, p + "ln_2.bias", {C}, Init::zeros);
    add_tensor(b, p + "mlp.c_fc.weight", {C, F}, Init::normal, std);
    add_tensor(b, p + "mlp.c_fc.bias", {F}, Init::zeros);
    add_tensor(b, p + "mlp.c_proj.weight", {F, C}, Init::normal, proj_std);
    add_tensor(b, p + "mlp.c_proj.bias", {C}, Init::zeros);
    units.push_back(std::move(b));
  }
  UnitLayout head{"head", {}, 0};
  add_tensor(head, "ln_f.weight", {C}, Init::ones);
  add_tensor(head, "ln_f.bias", {C}, Init::zeros);
  units.push_back(std::move(head));
  return units;
}

}  // namespace shardlab
