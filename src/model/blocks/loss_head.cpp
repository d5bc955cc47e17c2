// loss_head.cpp — the head's loss in chunks of positions (loss_head.hpp).
#include "src/model/blocks/loss_head.hpp"

#include <algorithm>

#include "src/backend/ops/loss.hpp"
#include "src/model/blocks/linear.hpp"
#include "src/model/blocks/weight_grad.hpp"
#include "src/model/tp.hpp"

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

bool chunked_loss(const ModelSpec& spec, const TpConfig&) { return spec.loss_chunk > 0; }

void cross_entropy_rows(UnitContext& c, Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets,
                        Tensor stats, float scale) {
  if (!c.tp.active()) return ops::cross_entropy(c.be, losses, dlogits, logits, targets, scale);
  const int64_t rows = logits.dim(0);
  const VocabShard v = vocab_shard(c.spec.vocab, c.tp.config.degree, c.tp.config.rank);
  Tensor mx = stats.slice(0, rows), sums = stats.slice(rows, 2 * rows);
  ops::vocab_ce_max(c.be, mx, logits, v.valid);
  tp_max(c, mx);
  ops::vocab_ce_sums(c.be, sums.slice(0, rows), sums.slice(rows, rows), logits, targets, v.begin, v.valid, mx);
  tp_sum(c, sums);
  ops::vocab_ce_finish(c.be, losses, dlogits, logits, targets, v.begin, v.valid, mx, sums.slice(0, rows),
                       sums.slice(rows, rows), scale);
}

void chunked_loss_forward(UnitContext& c, Tensor losses, Tensor x, Tensor w) {
  const int64_t N = losses.numel(), V = w.dim(0), K = std::min(N, c.spec.loss_chunk);
  SHARD_CHECK(c.batch.targets != nullptr, "the chunked loss head needs the batch's targets");
  SHARD_CHECK(x.numel() == N * w.dim(1), "chunked loss: x {} for {} positions of {} channels", x.shape_str(), N,
              w.dim(1));
  const int64_t stats = c.tp.active() ? 3 * K : 0;
  Block chunk = c.pool.alloc(DType::f32, K * V + stats, Category::workspace, "loss chunk logits");
  for (int64_t r0 = 0; r0 < N; r0 += K) {
    const int64_t rows = std::min(K, N - r0);
    const std::vector<int64_t> shape{rows, V};
    Tensor logits = chunk.flat(DType::f32).slice(0, rows * V).reshape(shape);
    chunk_logits(c.be, logits, x, w, r0, rows);
    cross_entropy_rows(c, losses.slice(r0, rows), Tensor(), logits, c.batch.targets + r0,
                        chunk.flat(DType::f32).slice(K * V, stats), 0.f);
  }
}

void chunked_loss_backward(UnitContext& c, Tensor dx, Tensor dw, Tensor dlosses, Tensor x, Tensor w) {
  const int64_t N = dlosses.numel(), V = w.dim(0), C = w.dim(1), K = std::min(N, c.spec.loss_chunk);
  float scale = 0.f;
  c.be.copy(Tensor::flat(&scale, DType::f32, 1), dlosses.slice(0, 1));
  const int64_t stats = c.tp.active() ? 3 * K : 0;
  Block chunk = c.pool.alloc(DType::f32, K * V + K + stats, Category::workspace, "loss chunk logits");
  for (int64_t r0 = 0; r0 < N; r0 += K) {
    const int64_t rows = std::min(K, N - r0);
    const std::vector<int64_t> shape{rows, V};
    Tensor logits = chunk.flat(DType::f32).slice(0, rows * V).reshape(shape);
    chunk_logits(c.be, logits, x, w, r0, rows);
    // The logits become their gradient in place; the losses, computed again, are not needed.
    cross_entropy_rows(c, chunk.flat(DType::f32).slice(K * V, rows), logits, logits, c.batch.targets + r0,
                        chunk.flat(DType::f32).slice(K * V + K, stats), scale);
    Block held;  // the chunk's d(logits) as both products read it
    const Tensor dlogits = rounded_once(c, logits, w.dtype(), held, "loss chunk rounded dlogits");
    GemmDesc ddx = gemm_with(w);  // dx rows (rows, C) = dlogits (rows, V) @ w (V, C)
    ddx.a_type = dlogits.dtype();
    ddx.m = rows, ddx.n = C, ddx.k = V;
    ddx.lda = V, ddx.ldb = C, ddx.ldc = C;
    c.be.gemm(ddx, dlogits.data(), w.data(), dx.slice(r0 * C, rows * C).data());
    // dw (V, C) += dlogits^T (V, rows) @ x rows (rows, C)
    GemmDesc ddw = weight_grad_desc(w.dtype(), V, C, rows);
    ddw.a_type = dlogits.dtype();
    c.be.gemm(ddw, dlogits.data(), x.slice(r0 * C, rows * C).data(), dw.data());
  }
}

}  // namespace shardlab::blocks
