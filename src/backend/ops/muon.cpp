// muon.cpp — the Muon family's checks and dispatch (muon.hpp).
#include "src/backend/ops/muon.hpp"

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::ops {

void muon_momentum(Backend& be, Tensor grad, Tensor buf, Tensor update, const MuonMomentumArgs& a) {
  check_same_numel(grad, buf, "muon_momentum");
  check_same_numel(grad, update, "muon_momentum");
  SHARD_CHECK(grad.dtype() == DType::f32 && buf.dtype() == DType::f32 && update.dtype() == DType::f32,
              "muon_momentum: f32 buffers expected");
  switch (be.device()) {
    case Device::cpu:
      return cpu::muon_momentum(grad.ptr<float>(), buf.ptr<float>(), update.ptr<float>(), grad.numel(), a);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::muon_momentum(be, grad, buf, update, a);
      return;
    case Device::meta:
      return charge(be, {.name = "muon_momentum", .flops = 6.0 * grad.numel(), .bytes = pass_bytes(grad.numel(), 2, 2)},
                    [&] { return cuda::muon_momentum_launches(grad.numel()); });
  }
}

void muon_normalize(Backend& be, Tensor x, float eps, bool bf16_math) {
  SHARD_CHECK(!bf16_math || x.dtype() == DType::f32, "muon_normalize: bf16 arithmetic is for f32 storage");
  switch (be.device()) {
    case Device::cpu:
      SHARD_CHECK(x.dtype() == DType::f32, "muon_normalize: the CPU keeps the iteration in f32 storage");
      return cpu::muon_normalize(x.ptr<float>(), x.numel(), eps, bf16_math);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::muon_normalize(be, x, eps);
      return;
    case Device::meta: {
      // Read twice (the norm, the quotient), written once.
      return charge(be, {.name = "muon_normalize", .flops = 3.0 * x.numel(),
                         .bytes = pass_bytes(x.numel(), 2, 1, dtype_size(x.dtype()))},
                    [&] { return cuda::muon_normalize_launches(x.numel()); });
    }
  }
}

void round_to_bf16(Backend& be, Tensor x) {
  SHARD_CHECK(x.dtype() == DType::f32, "round_to_bf16: f32 storage expected");
  switch (be.device()) {
    case Device::cpu:
      return cpu::round_to_bf16(x.ptr<float>(), x.numel());
    case Device::cuda:
      // A GPU keeps the iteration in bf16 storage (optim/muon.cpp): nothing to round.
      SHARD_CHECK(false, "round_to_bf16 on CUDA: the iteration's storage is bf16 there");
      return;
    case Device::meta:
      return charge(be, {.name = "round_to_bf16", .flops = 0, .bytes = pass_bytes(x.numel(), 1, 1)},
                    [] { return cuda::Launches{}; });
  }
}

void muon_apply(Backend& be, Tensor param, Tensor update, float keep, float lr) {
  check_same_numel(param, update, "muon_apply");
  SHARD_CHECK(param.dtype() == DType::f32 && update.dtype() == DType::f32, "muon_apply: f32 buffers expected");
  switch (be.device()) {
    case Device::cpu:
      return cpu::muon_apply(param.ptr<float>(), update.ptr<float>(), param.numel(), keep, lr);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::muon_apply(be, param, update, keep, lr);
      return;
    case Device::meta:
      return charge(be, {.name = "muon_apply", .flops = 3.0 * param.numel(), .bytes = pass_bytes(param.numel(), 2, 1)},
                    [&] { return cuda::muon_apply_launches(param.numel()); });
  }
}

}  // namespace shardlab::ops
