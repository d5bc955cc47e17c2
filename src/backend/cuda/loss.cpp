// loss.cpp — the CUDA softmax cross-entropy, whole and vocabulary-parallel (ops/loss.hpp):
// launchers in loss.cu. Targets are host ids, checked and uploaded as the embedding's tokens
// (token_ids.cpp); the vocabulary-parallel steps upload each target's column in this rank's
// shard, -1 where another rank holds it.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::cuda {

void cross_entropy(Backend& be, Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets,
                   float dloss_scale, int64_t N, int64_t V) {
  CudaBackend& cb = CudaBackend::of(be);
  SHARD_CHECK(!dlogits.data() || dlogits.dtype() == DType::f32 || dlogits.dtype() == DType::bf16,
              "cuda cross_entropy: {} dlogits", dtype_name(dlogits.dtype()));
  const int32_t* ids = cb.upload_ids(targets, N, V, "target");
  CUDA_CHECK(launch_cross_entropy(losses.ptr<float>(), dlogits.data(), dlogits.dtype(), logits.ptr<float>(), ids, N, V,
                                  dloss_scale, cb.compute_stream()));
}

void vocab_ce_max(Backend& be, Tensor mx, Tensor logits, int64_t valid, int64_t N, int64_t Vl) {
  CUDA_CHECK(launch_vocab_ce_max(mx.ptr<float>(), logits.ptr<float>(), N, Vl, valid,
                                 CudaBackend::of(be).compute_stream()));
}

void vocab_ce_sums(Backend& be, Tensor sumexp, Tensor tlogit, Tensor logits, const int32_t* targets, int64_t v0,
                   int64_t valid, Tensor mx, int64_t N, int64_t Vl) {
  CudaBackend& cb = CudaBackend::of(be);
  const int32_t* cols = cb.upload_shard_rows(targets, N, v0, valid, "target");
  CUDA_CHECK(launch_vocab_ce_sums(sumexp.ptr<float>(), tlogit.ptr<float>(), logits.ptr<float>(), cols,
                                  mx.ptr<float>(), N, Vl, valid, cb.compute_stream()));
}

void vocab_ce_finish(Backend& be, Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets, int64_t v0,
                     int64_t valid, Tensor mx, Tensor sumexp, Tensor tlogit, float dloss_scale, int64_t N,
                     int64_t Vl) {
  CudaBackend& cb = CudaBackend::of(be);
  float* d = dlogits.data() ? dlogits.ptr<float>() : nullptr;
  const int32_t* cols = cb.upload_shard_rows(targets, N, v0, valid, "target");
  CUDA_CHECK(launch_vocab_ce_finish(losses.ptr<float>(), d, logits.ptr<float>(), cols, mx.ptr<float>(),
                                    sumexp.ptr<float>(), tlogit.ptr<float>(), N, Vl, valid, dloss_scale,
                                    cb.compute_stream()));
}

}  // namespace shardlab::cuda
