// optimizer.cpp — the CUDA optimizer updates (ops/optimizer.hpp): launchers in optimizer.cu.
#include <algorithm>
#include <cmath>

#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::cuda {

namespace {
// The step's constants; bias corrections on the host, in float, exactly as the CPU kernel computes them.
AdamWStep adamw_step(const AdamWArgs& a) {
  const float inv_bc1 = 1.f / (1.f - std::pow(a.beta1, static_cast<float>(a.step)));
  const float inv_bc2 = 1.f / (1.f - std::pow(a.beta2, static_cast<float>(a.step)));
  return {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale, inv_bc1, inv_bc2};
}
}  // namespace

void adamw_update(Backend& be, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWArgs& a) {
  CUDA_CHECK(launch_adamw(param.ptr<float>(), grad.data(), grad.dtype(), m.ptr<float>(), v.ptr<float>(), param.numel(),
                          adamw_step(a), CudaBackend::of(be).compute_stream()));
}

void adamw_update_segments(Backend& be, Tensor param, Tensor grad, Tensor m, Tensor v,
                           std::span<const AdamWSegment> segments, const AdamWArgs& a, Tensor rounded) {
  const AdamWStep step = adamw_step(a);
  // adamw_segments_launches' batches, in order: each a table passed by value to its kernel.
  for (size_t first = 0; first < segments.size(); first += kAdamWSegmentsPerLaunch) {
    AdamWSegmentTable t{};
    t.count = static_cast<int>(std::min<size_t>(kAdamWSegmentsPerLaunch, segments.size() - first));
    for (int k = 0; k < t.count; ++k) {
      const AdamWSegment& s = segments[first + static_cast<size_t>(k)];
      t.offset[k] = s.offset, t.numel[k] = s.numel, t.weight_decay[k] = s.weight_decay;
    }
    CUDA_CHECK(launch_adamw_segments(param.ptr<float>(), grad.data(), grad.dtype(), m.ptr<float>(), v.ptr<float>(),
                                     rounded.data(), t, step, CudaBackend::of(be).compute_stream()));
  }
}

void sgd_update(Backend& be, Tensor param, Tensor grad, Tensor momentum, const SgdArgs& a) {
  CUDA_CHECK(launch_sgd(param.ptr<float>(), grad.ptr<float>(), momentum.ptr<float>(), param.numel(), a.lr, a.momentum,
                        a.weight_decay, a.grad_scale, CudaBackend::of(be).compute_stream()));
}

}  // namespace shardlab::cuda
