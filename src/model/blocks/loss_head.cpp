// loss_head.cpp — the head's loss in chunks of positions (loss_head.hpp).
#include "src/model/blocks/loss_head.hpp"

#include <algorithm>

#include "src/backend/ops/loss.hpp"
#include "src/model/blocks/weight_grad.hpp"

namespace shardlab::blocks {
namespace {

// logits (rows, V) = x rows [r0, r0 + rows) @ w^T.
void chunk_logits(Backend& be, Tensor logits, Tensor x, Tensor w, int64_t r0, int64_t rows) {
  const int64_t V = w.dim(0), C = w.dim(1);
  GemmDesc d = gemm_with(w);
  d.trans_b = Trans::T;
  d.m = rows, d.n = V, d.k = C;
  d.lda = C, d.ldb = C, d.ldc = V;
  be.gemm(d, x.slice(r0 * C, rows * C).data(), w.data(), logits.data());
}

}  // namespace

bool chunked_loss(const ModelSpec& spec, const TpConfig& tp) { return spec.loss_chunk > 0 && tp.degree == 1; }

void chunked_loss_forward(UnitContext& c, Tensor losses, Tensor x, Tensor w) {
  const int64_t N = losses.numel(), V = w.dim(0), K = std::min(N, c.spec.loss_chunk);
  SHARD_CHECK(c.batch.targets != nullptr, "the chunked loss head needs the batch's targets");
  SHARD_CHECK(x.numel() == N * w.dim(1), "chunked loss: x {} for {} positions of {} channels", x.shape_str(), N,
              w.dim(1));
  Block chunk = c.pool.alloc(DType::f32, K * V, Category::workspace, "loss chunk logits");
  for (int64_t r0 = 0; r0 < N; r0 += K) {
    const int64_t rows = std::min(K, N - r0);
    const std::vector<int64_t> shape{rows, V};
    Tensor logits = chunk.flat(DType::f32).slice(0, rows * V).reshape(shape);
    chunk_logits(c.be, logits, x, w, r0, rows);
    ops::cross_entropy(c.be, losses.slice(r0, rows), Tensor(), logits, c.batch.targets + r0, 0.f);
  }
}

void chunked_loss_backward(UnitContext& c, Tensor dx, Tensor dw, Tensor dlosses, Tensor x, Tensor w) {
  const int64_t N = dlosses.numel(), V = w.dim(0), C = w.dim(1), K = std::min(N, c.spec.loss_chunk);
  float scale = 0.f;
  c.be.copy(Tensor::flat(&scale, DType::f32, 1), dlosses.slice(0, 1));
  Block chunk = c.pool.alloc(DType::f32, K * V + K, Category::workspace, "loss chunk logits");
  for (int64_t r0 = 0; r0 < N; r0 += K) {
    const int64_t rows = std::min(K, N - r0);
    const std::vector<int64_t> shape{rows, V};
    Tensor logits = chunk.flat(DType::f32).slice(0, rows * V).reshape(shape);
    chunk_logits(c.be, logits, x, w, r0, rows);
    // The logits become their gradient in place; the losses, computed again, are not needed.
    ops::cross_entropy(c.be, chunk.flat(DType::f32).slice(K * V, rows), logits, logits, c.batch.targets + r0, scale);
    GemmDesc ddx = gemm_with(w);  // dx rows (rows, C) = dlogits (rows, V) @ w (V, C)
    ddx.m = rows, ddx.n = C, ddx.k = V;
    ddx.lda = V, ddx.ldb = C, ddx.ldc = C;
    c.be.gemm(ddx, logits.data(), w.data(), dx.slice(r0 * C, rows * C).data());
    // dw (V, C) += dlogits^T (V, rows) @ x rows (rows, C)
    const GemmDesc ddw = weight_grad_desc(w.dtype(), V, C, rows);
    c.be.gemm(ddw, logits.data(), x.slice(r0 * C, rows * C).data(), dw.data());
  }
}

}  // namespace shardlab::blocks
