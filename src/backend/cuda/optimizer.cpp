// optimizer.cpp — the CUDA optimizer updates (ops/optimizer.hpp): launchers in optimizer.cu.
#include <cmath>

#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::cuda {

void adamw_update(Backend& be, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWArgs& a) {
  // Bias corrections on the host, in float, exactly as the CPU kernel computes them.
  const float inv_bc1 = 1.f / (1.f - std::pow(a.beta1, static_cast<float>(a.step)));
  const float inv_bc2 = 1.f / (1.f - std::pow(a.beta2, static_cast<float>(a.step)));
  const AdamWStep s{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale, inv_bc1, inv_bc2};
  CUDA_CHECK(launch_adamw(param.ptr<float>(), grad.data(), grad.dtype(), m.ptr<float>(), v.ptr<float>(), param.numel(),
                          s, CudaBackend::of(be).compute_stream()));
}

void sgd_update(Backend& be, Tensor param, Tensor grad, Tensor momentum, const SgdArgs& a) {
  CUDA_CHECK(launch_sgd(param.ptr<float>(), grad.ptr<float>(), momentum.ptr<float>(), param.numel(), a.lr, a.momentum,
                        a.weight_decay, a.grad_scale, CudaBackend::of(be).compute_stream()));
}

}  // namespace shardlab::cuda
