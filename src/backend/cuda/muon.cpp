// muon.cpp — the CUDA Muon passes (ops/muon.hpp): launchers in muon.cu.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::cuda {

void muon_momentum(Backend& be, Tensor grad, Tensor buf, Tensor update, const MuonMomentumArgs& a) {
  CUDA_CHECK(launch_muon_momentum(grad.ptr<float>(), buf.ptr<float>(), update.ptr<float>(), grad.numel(), a.momentum,
                                  a.nesterov, a.grad_scale, CudaBackend::of(be).compute_stream()));
}

void muon_normalize(Backend& be, Tensor x, float eps) {
  CudaBackend& cb = CudaBackend::of(be);
  auto* partial = static_cast<double*>(cb.device_scratch(sizeof(double) * (kReduceBlocks + 1)));
  CUDA_CHECK(launch_muon_normalize(x.data(), x.dtype(), x.numel(), eps, partial, cb.compute_stream()));
}

void muon_apply(Backend& be, Tensor param, Tensor update, float keep, float lr) {
  CUDA_CHECK(launch_muon_apply(param.ptr<float>(), update.ptr<float>(), param.numel(), keep, lr,
                               CudaBackend::of(be).compute_stream()));
}

}  // namespace shardlab::cuda
