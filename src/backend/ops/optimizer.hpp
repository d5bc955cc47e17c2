// optimizer.hpp — the optimizer update family: AdamW and SGD steps over flat f32 buffers (any
// shard of them). Conventions: ops/dispatch.hpp.
#pragma once
#include "src/backend/ops/dispatch.hpp"

namespace shardlab {

// AdamW with decoupled weight decay (Loshchilov & Hutter): p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p).
struct AdamWArgs {
  float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.f;
  int64_t step = 1;         // 1-based, for bias correction
  float grad_scale = 1.f;   // gradients are multiplied by this first (clipping, averaging)
};

// SGD with momentum (PyTorch's form): b = mu * b + g + wd * p; p -= lr * b.
struct SgdArgs {
  float lr = 0.01f, momentum = 0.9f, weight_decay = 0.f;
  float grad_scale = 1.f;
};

namespace ops {

void adamw_update(Backend& be, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWArgs& a);
void sgd_update(Backend& be, Tensor param, Tensor grad, Tensor momentum, const SgdArgs& a);

}  // namespace ops
}  // namespace shardlab
