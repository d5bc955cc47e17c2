// moe.cpp — the CUDA mixture-of-experts row moves (ops/moe.hpp): launchers in moe.cu. The index
// arrays are device memory already (the routing block the layer filled), so nothing is uploaded.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::cuda {

void moe_gather(Backend& be, Tensor dst, Tensor src, const int32_t* token_of, int64_t rows, int64_t C) {
  CUDA_CHECK(launch_moe_gather(dst.ptr<float>(), src.ptr<float>(), token_of, rows, C,
                               CudaBackend::of(be).compute_stream()));
}

void moe_combine(Backend& be, Tensor out, Tensor y, const int32_t* pos, Tensor w, int64_t N, int64_t k, int64_t C,
                 bool accumulate) {
  const float* weights = w.data() != nullptr ? w.ptr<float>() : nullptr;
  CUDA_CHECK(launch_moe_combine(out.ptr<float>(), y.ptr<float>(), pos, weights, N, k, C, accumulate,
                                CudaBackend::of(be).compute_stream()));
}

void moe_combine_backward(Backend& be, Tensor dy, Tensor dw, Tensor dout, Tensor y, const int32_t* pos, Tensor w,
                          int64_t N, int64_t k, int64_t C) {
  CUDA_CHECK(launch_moe_combine_backward(dy.ptr<float>(), dw.ptr<float>(), dout.ptr<float>(), y.ptr<float>(), pos,
                                         w.ptr<float>(), N, k, C, CudaBackend::of(be).compute_stream()));
}

}  // namespace shardlab::cuda
