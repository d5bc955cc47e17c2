// optimizer.hpp — the optimizer update family: AdamW and SGD steps over flat f32 buffers (any
// shard of them). Conventions: ops/dispatch.hpp.
#pragma once
#include <span>

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

// One tensor's elements [offset, offset + numel) of a flat buffer, with its weight decay.
struct AdamWSegment {
  int64_t offset = 0, numel = 0;
  float weight_decay = 0.f;
};

namespace ops {

void adamw_update(Backend& be, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWArgs& a);
// adamw_update over each segment of the flat param, grad, m and v (the same offsets in each; a's
// weight_decay unused: the segment's), every element as adamw_update computes it: on CUDA one
// launch for up to cuda::kAdamWSegmentsPerLaunch segments (a rank's share of a unit, most often)
// instead of one per tensor; the segments in turn elsewhere. rounded (optional, bf16, param's
// numel): each segment's updated elements rounded into it too (the parameters a mixed-precision
// run computes with, written by the update instead of a cast pass after it).
void adamw_update_segments(Backend& be, Tensor param, Tensor grad, Tensor m, Tensor v,
                           std::span<const AdamWSegment> segments, const AdamWArgs& a, Tensor rounded = {});
void sgd_update(Backend& be, Tensor param, Tensor grad, Tensor momentum, const SgdArgs& a);

}  // namespace ops
}  // namespace shardlab
