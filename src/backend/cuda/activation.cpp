// activation.cpp — the CUDA GELU and SwiGLU (ops/activation.hpp): launchers in activation.cu.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::cuda {

void gelu_forward(Backend& be, Tensor out, Tensor inp) {
  CUDA_CHECK(
      launch_gelu_forward(out.ptr<float>(), inp.ptr<float>(), inp.numel(), CudaBackend::of(be).compute_stream()));
}

void gelu_backward(Backend& be, Tensor dinp, Tensor inp, Tensor dout) {
  CUDA_CHECK(launch_gelu_backward(dinp.ptr<float>(), inp.ptr<float>(), dout.ptr<float>(), inp.numel(),
                                  CudaBackend::of(be).compute_stream()));
}

void swiglu_forward(Backend& be, Tensor out, Tensor gate_up, int64_t N, int64_t F) {
  CUDA_CHECK(launch_swiglu_forward(out.data(), out.dtype(), gate_up.data(), gate_up.dtype(), N, F,
                                   CudaBackend::of(be).compute_stream()));
}

void swiglu_backward(Backend& be, Tensor dgate_up, Tensor gate_up, Tensor dout, int64_t N, int64_t F) {
  CUDA_CHECK(launch_swiglu_backward(dgate_up.data(), dgate_up.dtype(), gate_up.data(), gate_up.dtype(),
                                    dout.ptr<float>(), N, F, CudaBackend::of(be).compute_stream()));
}

}  // namespace shardlab::cuda
