// flash_attention.cpp — the CUDA fused attention (ops/flash_attention.hpp): launchers of
// flash_attention.cu on the compute stream. Backward keeps D = rowsum(dO * O) in the workspace's
// tail, where the CPU kernels keep it.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::cuda {
namespace {
void require_head_dim(const FlashShape& s) {
  SHARD_REQUIRE(s.hd <= kMaxHeadDim && flash_vd(s) <= kMaxHeadDim,
                "--attention flash on CUDA: head dimensions {} (queries, keys) and {} (values) above the kernels' {}",
                s.hd, flash_vd(s), kMaxHeadDim);
}
}  // namespace

void flash_attention_forward(Backend& be, void* out, float* lse, const void* q, const void* k, const void* v,
                             const FlashShape& s) {
  require_head_dim(s);
  CUDA_CHECK(launch_flash_forward(out, lse, q, k, v, s, CudaBackend::of(be).compute_stream()));
}

void flash_attention_merge(Backend& be, float* out, float* lse, const float* part, const float* part_lse,
                           const FlashShape& s) {
  CUDA_CHECK(launch_flash_merge(out, lse, part, part_lse, s, CudaBackend::of(be).compute_stream()));
}

void flash_attention_backward(Backend& be, float* dq, float* dk, float* dv, const void* dout, const void* q,
                              const void* k, const void* v, const void* out, const float* lse, float* workspace,
                              const FlashShape& s) {
  require_head_dim(s);
  float* D = workspace + flash_backward_slots(s) * flash_backward_slot_elems(s);
  CUDA_CHECK(launch_flash_backward(dq, dk, dv, D, dout, q, k, v, out, lse, s, CudaBackend::of(be).compute_stream()));
}

}  // namespace shardlab::cuda
