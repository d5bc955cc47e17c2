// mla.cpp — the CUDA latent attention (ops/mla.hpp): launchers in mla.cu.
#include <algorithm>

#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::cuda {
namespace {
RopeTable table_of(const RopeFreqs& freqs) {
  RopeTable table{};  // a kernel parameter, as rope.cpp's
  std::copy_n(freqs.inv_freq.begin(), freqs.half, table.inv_freq);
  return table;
}
}  // namespace

void mla_qkv_forward(Backend& be, Tensor qkv, Tensor q, Tensor kv, Tensor kva, const MlaHeads& m,
                     const RopeFreqs& freqs, int64_t pos0, int64_t B, int64_t T) {
  CUDA_CHECK(launch_mla_qkv_forward(qkv.ptr<float>(), q.ptr<float>(), kv.ptr<float>(), kva.ptr<float>(), m,
                                    table_of(freqs), pos0, B, T, CudaBackend::of(be).compute_stream()));
}

void mla_qkv_backward(Backend& be, Tensor dq, Tensor dkv, Tensor dkva, Tensor dqkv, const MlaHeads& m,
                      const RopeFreqs& freqs, int64_t pos0, int64_t B, int64_t T) {
  CUDA_CHECK(launch_mla_qkv_backward(dq.ptr<float>(), dkv.ptr<float>(), dkva.ptr<float>(), dqkv.ptr<float>(), m,
                                     table_of(freqs), pos0, B, T, CudaBackend::of(be).compute_stream()));
}

}  // namespace shardlab::cuda
