// optimizer.cpp — the optimizer update family's checks and dispatch (optimizer.hpp).
#include "src/backend/ops/optimizer.hpp"

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::ops {

void adamw_update(Backend& be, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWArgs& a) {
  check_same_numel(param, grad, "adamw_update");
  check_same_numel(param, m, "adamw_update");
  check_same_numel(param, v, "adamw_update");
  switch (be.device()) {
    case Device::cpu:
      return cpu::adamw_update(param.ptr<float>(), grad.ptr<float>(), m.ptr<float>(), v.ptr<float>(), param.numel(),
                               a);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::adamw_update(be, param, grad, m, v, a);
      return;
    case Device::meta: return;
  }
}

void sgd_update(Backend& be, Tensor param, Tensor grad, Tensor momentum, const SgdArgs& a) {
  check_same_numel(param, grad, "sgd_update");
  check_same_numel(param, momentum, "sgd_update");
  switch (be.device()) {
    case Device::cpu:
      return cpu::sgd_update(param.ptr<float>(), grad.ptr<float>(), momentum.ptr<float>(), param.numel(), a);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::sgd_update(be, param, grad, momentum, a);
      return;
    case Device::meta: return;
  }
}

}  // namespace shardlab::ops
