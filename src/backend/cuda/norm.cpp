// norm.cpp — the CUDA LayerNorm and RMSNorm (ops/norm.hpp): launchers in norm.cu. The backward
// passes fold per-chunk partial parameter gradients kept in device scratch, in a fixed order.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::cuda {

void layernorm_forward(Backend& be, Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias,
                       float eps, Tensor inp_bf16, int64_t N, int64_t C) {
  CUDA_CHECK(launch_layernorm_forward(out.data(), out.dtype(), inp_bf16.data(), mean.ptr<float>(), rstd.ptr<float>(),
                                      inp.ptr<float>(), weight.ptr<float>(), bias.ptr<float>(), N, C, eps,
                                      CudaBackend::of(be).compute_stream()));
}

void layernorm_backward(Backend& be, Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                        Tensor mean, Tensor rstd, Tensor dinp_from, Tensor dinp_bf16, int64_t N, int64_t C) {
  CudaBackend& cb = CudaBackend::of(be);
  auto* workspace = static_cast<float*>(cb.device_scratch(layernorm_backward_workspace(N, C) * sizeof(float)));
  CUDA_CHECK(launch_layernorm_backward(dinp.ptr<float>(), dinp_from.data() ? dinp_from.ptr<float>() : nullptr,
                                       dinp_bf16.data(), dweight.ptr<float>(), dbias.ptr<float>(), dout.ptr<float>(),
                                       inp.data(), inp.dtype(), weight.ptr<float>(), mean.ptr<float>(),
                                       rstd.ptr<float>(), workspace, cb.arrival_counters(1), N, C,
                                       cb.compute_stream()));
}

void rmsnorm_forward(Backend& be, Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps, Tensor inp_bf16,
                     int64_t N, int64_t C) {
  CUDA_CHECK(launch_rmsnorm_forward(out.data(), out.dtype(), inp_bf16.data(), rstd.ptr<float>(), inp.ptr<float>(),
                                    weight.ptr<float>(), N, C, eps, CudaBackend::of(be).compute_stream()));
}

void rmsnorm_backward(Backend& be, Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd,
                      Tensor dinp_from, Tensor dinp_bf16, int64_t N, int64_t C) {
  CudaBackend& cb = CudaBackend::of(be);
  auto* workspace = static_cast<float*>(cb.device_scratch(rmsnorm_backward_workspace(N, C) * sizeof(float)));
  CUDA_CHECK(launch_rmsnorm_backward(dinp.ptr<float>(), dinp_from.data() ? dinp_from.ptr<float>() : nullptr,
                                     dinp_bf16.data(), dweight.ptr<float>(), dout.ptr<float>(), inp.data(), inp.dtype(),
                                     weight.ptr<float>(), rstd.ptr<float>(), workspace, cb.arrival_counters(1), N, C,
                                     cb.compute_stream()));
}

void head_rmsnorm_forward(Backend& be, Tensor x, Tensor pre, Tensor rstd, Tensor weight, int64_t N, int64_t W,
                          int64_t col0, int64_t heads, int64_t hd, float eps) {
  CUDA_CHECK(launch_head_rmsnorm_forward(x.ptr<float>(), pre.ptr<float>(), rstd.ptr<float>(), weight.ptr<float>(), N, W,
                                         col0, heads, hd, eps, CudaBackend::of(be).compute_stream()));
}

void head_rmsnorm_backward(Backend& be, Tensor dx, Tensor dweight, Tensor pre, Tensor weight, Tensor rstd, int64_t N,
                           int64_t W, int64_t col0, int64_t heads, int64_t hd) {
  CudaBackend& cb = CudaBackend::of(be);
  auto* workspace = static_cast<float*>(cb.device_scratch(head_rmsnorm_backward_workspace(N, heads, hd) * sizeof(float)));
  CUDA_CHECK(launch_head_rmsnorm_backward(dx.ptr<float>(), dweight.ptr<float>(), pre.ptr<float>(), weight.ptr<float>(),
                                          rstd.ptr<float>(), workspace, N, W, col0, heads, hd, cb.compute_stream()));
}

}  // namespace shardlab::cuda
