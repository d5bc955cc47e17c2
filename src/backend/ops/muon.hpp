// muon.hpp — Muon's element-wise passes (torch.optim.Muon's arithmetic): the momentum, the
// normalisation before the Newton–Schulz iteration, bf16 rounding, the update. The iteration's
// products are Backend::gemm's (optim/muon.cpp drives them). Conventions: ops/dispatch.hpp.
#pragma once
#include "src/backend/ops/dispatch.hpp"

namespace shardlab {

struct MuonMomentumArgs {
  float momentum = 0.95f;  // kMuonMomentum (optim/muon.hpp)
  bool nesterov = true;
  float grad_scale = 1.f;  // gradients are multiplied by this first (clipping, averaging)
};

namespace ops {

// g = grad * grad_scale; buf <- lerp(buf, g, 1 - mu); update <- nesterov ? lerp(g, buf, mu) : buf,
// each lerp in torch.lerp's two-sided form (weight < 0.5: a + w (b - a); else b - (b - a)(1 - w)).
// grad and buf f32; update f32.
void muon_momentum(Backend& be, Tensor grad, Tensor buf, Tensor update, const MuonMomentumArgs& a);
// x <- x / max(||x||, eps), x f32 or bf16. `bf16_math` on an f32 x: x holds bf16 values and the
// norm and quotients are rounded to bf16 as torch's bf16 tensors round them; a bf16 x does the same.
void muon_normalize(Backend& be, Tensor x, float eps, bool bf16_math);
// x (f32) <- its values rounded to bf16 (round to nearest even): bf16 arithmetic on f32 storage,
// for backends whose GEMMs are f32 (the CPU).
void round_to_bf16(Backend& be, Tensor x);
// param <- param * keep - lr * update (torch: param.mul_(1 - lr wd); param.add_(update, alpha=-lr)).
void muon_apply(Backend& be, Tensor param, Tensor update, float keep, float lr);

}  // namespace ops
}  // namespace shardlab
