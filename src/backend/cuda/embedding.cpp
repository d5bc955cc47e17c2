// embedding.cpp — the CUDA embedding (ops/embedding.hpp): launchers in embedding.cu.
//
// Token ids are host memory (the trainer's Batch holds host vectors): they are checked on the
// host, as the CPU kernels check them, and copied to device scratch on the compute stream
// (token_ids.cpp; the copies of embedding_*_launches). The vocabulary-parallel versions turn ids
// into rows of this rank's shard on the host, -1 where another rank holds the id, so the kernels
// are the whole embedding's, whose rows are the ids themselves.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::cuda {

void embedding_forward(Backend& be, Tensor out, const int32_t* tokens, int64_t B, int64_t T, Tensor wte, Tensor wpe,
                       int64_t C) {
  CudaBackend& cb = CudaBackend::of(be);
  const int32_t* ids = cb.upload_ids(tokens, B * T, wte.dim(0), "token");
  const float* positions = wpe.data() != nullptr ? wpe.ptr<float>() : nullptr;  // null: none to add
  CUDA_CHECK(
      launch_embedding_forward(out.ptr<float>(), ids, wte.ptr<float>(), positions, B, T, C, cb.compute_stream()));
}

namespace {

// The backward's commands once the positions are grouped by row on the host (buckets of them):
// dwpe's kernel, the grouping's upload, dwte's kernel (embedding_backward_launches).
void backward_dw(CudaBackend& cb, Tensor dwte, Tensor dwpe, Tensor dout, int64_t B, int64_t T, int64_t C,
                 int64_t buckets) {
  const bool positions = dwpe.data() != nullptr;  // empty: a family without learned positions
  if (positions)
    CUDA_CHECK(
        launch_embedding_backward_dwpe(dwpe.ptr<float>(), dout.ptr<float>(), B, T, C, buckets, cb.compute_stream()));
  const int32_t* grouped = cb.upload_host_ids();  // [bucket rows | offsets | positions]
  CUDA_CHECK(launch_embedding_backward_dwte(dwte.ptr<float>(), dout.ptr<float>(), grouped, grouped + buckets,
                                            grouped + 2 * buckets + 1, B, T, C, positions, buckets,
                                            cb.compute_stream()));
}

}  // namespace

// Deterministic without atomics: positions are grouped by token on the host (a stable counting
// sort), and one block per distinct token adds its positions' rows in ascending order, as the CPU.
void embedding_backward(Backend& be, Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C) {
  CudaBackend& cb = CudaBackend::of(be);
  check_ids(tokens, B * T, dwte.dim(0), "token");  // before anything is launched
  // On the host, before any launch: the dwte kernel's grid is the number of distinct tokens.
  const int64_t buckets = cb.group_positions_by_row(tokens, B * T, dwte.dim(0));  // a token id is its row
  backward_dw(cb, dwte, dwpe, dout, B, T, C, buckets);
}

void embedding_forward_shard(Backend& be, Tensor out, const int32_t* tokens, int64_t B, int64_t T, Tensor wte,
                             Tensor wpe, int64_t v0, int64_t C) {
  CudaBackend& cb = CudaBackend::of(be);
  const int32_t* rows = cb.upload_shard_rows(tokens, B * T, v0, wte.dim(0), "token");
  const float* positions = wpe.data() != nullptr ? wpe.ptr<float>() : nullptr;  // null: none to add
  CUDA_CHECK(
      launch_embedding_forward(out.ptr<float>(), rows, wte.ptr<float>(), positions, B, T, C, cb.compute_stream()));
}

// As embedding_backward, over the positions whose token is in this shard: the same per-row
// order of additions, so a shard's rows get the whole embedding's bits.
void embedding_backward_shard(Backend& be, Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int64_t B,
                              int64_t T, int64_t v0, int64_t C) {
  CudaBackend& cb = CudaBackend::of(be);
  const int32_t* rows = cb.host_shard_rows(tokens, B * T, v0, dwte.dim(0), "token");  // checks, before any launch
  const int64_t buckets = cb.group_positions_by_row(rows, B * T, dwte.dim(0));
  backward_dw(cb, dwte, dwpe, dout, B, T, C, buckets);
}

}  // namespace shardlab::cuda
