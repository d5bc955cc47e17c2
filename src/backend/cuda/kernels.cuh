// kernels.cuh — launchers of the CUDA backend's kernels. Plain signatures, no fmt and no Tensor:
// this header is shared by nvcc (the .cu files, one per operation family and elementwise.cu) and
// the host compiler (cuda_backend.cpp, cuda/<family>.cpp). Each launcher takes its grids from the
// list of launches.hpp of the entry point that calls it, and returns the launch status for the
// caller's CUDA_CHECK.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "src/backend/cuda/launches.hpp"
#include "src/backend/ops/flash_shape.hpp"
#include "src/core/dtype.hpp"

namespace shardlab::cuda {

enum class ReduceKind : int { sum, sum_squares, max_abs };

cudaError_t launch_fill(void* x, DType t, int64_t n, float value, cudaStream_t s);
cudaError_t launch_cast(const void* src, DType src_type, void* dst, DType dst_type, int64_t n, cudaStream_t s);
// dst[r] <- src[r] for each range r of the two flat buffers (Backend::cast_ranges): a kernel per
// kCastRanges ranges (cast_ranges_launches).
cudaError_t launch_cast_ranges(const void* src, DType src_type, void* dst, DType dst_type,
                               std::span<const ElemRange> ranges, cudaStream_t s);
cudaError_t launch_axpy(float alpha, const float* x, float* y, int64_t n, cudaStream_t s);
cudaError_t launch_scale(float* x, float alpha, int64_t n, cudaStream_t s);
cudaError_t launch_add(const float* a, const float* b, float* out, int64_t n, cudaStream_t s);
cudaError_t launch_mul(const float* a, const float* b, float* out, int64_t n, cudaStream_t s);
cudaError_t launch_add_into(void* dst, DType dst_type, const void* src, DType src_type, int64_t n, cudaStream_t s);
// out[0] (+)= reduction of x (f32, or bf16 widened as read); partial is a device workspace of
// kReduceBlocks doubles.
cudaError_t launch_reduce(const void* x, DType xt, int64_t n, ReduceKind k, double* partial, float* out,
                          bool accumulate, cudaStream_t s);
// out[c] (+)= sum_r x[r, c]; partial is a device workspace of sum_rows_chunks(rows, cols) x cols doubles,
// arrivals sum_rows_tiles(cols) counters, zero before the call and after it. x f32 or bf16 (xt).
cudaError_t launch_sum_rows(const void* x, DType xt, int64_t rows, int64_t cols, double* partial, unsigned* arrivals,
                            float* out, bool accumulate, cudaStream_t s);

// ---- the operation families' kernels (f32), in ops/'s families. Every pointer is device memory,
// token ids included: the backend uploads the host ids before calling these. Semantics mirror
// src/backend/cpu/<family>.cpp; shapes use those files's names (B batch, T time, C channels, H heads,
// V vocab, N rows). ----

// out (B*T, C) = wte[rows] + wpe[t]; wpe null: out = wte[rows] (no learned positions). A negative
// row is a token of another rank's vocabulary shard (--tp): out = wpe[t], or zeros without wpe.
// The whole embedding's rows are its token ids.
cudaError_t launch_embedding_forward(float* out, const int32_t* rows, const float* wte, const float* wpe, int64_t B,
                                     int64_t T, int64_t C, cudaStream_t s);
// The backward's two kernels, each reading its grid from embedding_backward_launches(B, T, C, dwpe,
// buckets), which also holds the upload the caller issues between them.
// dwpe[t] += sum over b of dout[b, t], b in order.
cudaError_t launch_embedding_backward_dwpe(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C,
                                           int64_t buckets, cudaStream_t s);
// For each of the `buckets` distinct tokens u: dwte[bucket_token[u]] += dout[p] for p in
// positions[offsets[u] .. offsets[u+1]), one add after another in that (ascending) order, which is
// the CPU's order: the result is bit-identical to it and independent of scheduling. dwpe: the dwpe
// kernel ran before.
cudaError_t launch_embedding_backward_dwte(float* dwte, const float* dout, const int32_t* bucket_token,
                                           const int32_t* offsets, const int32_t* positions, int64_t B, int64_t T,
                                           int64_t C, bool dwpe, int64_t buckets, cudaStream_t s);

// out (N, C) f32 or bf16 (rounded once), mean, rstd (N); rstd = 1 / sqrt(variance + eps);
// inp_bf16 (optional, bf16 (N, C)): the input rounded once as well.
cudaError_t launch_layernorm_forward(void* out, DType out_type, void* inp_bf16, float* mean, float* rstd,
                                     const float* inp, const float* w, const float* b, int64_t N, int64_t C, float eps,
                                     cudaStream_t s);
// Floats of workspace launch_layernorm_backward needs for (N, C): per-chunk partials of dw and db.
int64_t layernorm_backward_workspace(int64_t N, int64_t C);
// dw, db accumulate; dinp too, or dinp = from + the gradient where `from` is given (it may be
// dinp); rounded (optional, bf16 (N, C)): dinp rounded once as well. inp f32 or bf16 (inp_type).
// workspace holds layernorm_backward_workspace(N, C) floats; arrivals one counter, zero before
// and after (the one-launch form's, launches.hpp norm_fused_warps).
cudaError_t launch_layernorm_backward(float* dinp, const float* from, void* rounded, float* dw, float* db,
                                      const float* dout, const void* inp, DType inp_type, const float* w,
                                      const float* mean, const float* rstd, float* workspace, unsigned* arrivals,
                                      int64_t N, int64_t C, cudaStream_t s);

// RMSNorm: out (N, C) = inp * rstd * w (f32 or bf16, rounded once), rstd (N) = 1 / sqrt(mean(inp^2) + eps);
// inp_bf16 (optional, bf16 (N, C)): the input rounded once as well.
cudaError_t launch_rmsnorm_forward(void* out, DType out_type, void* inp_bf16, float* rstd, const float* inp,
                                   const float* w, int64_t N, int64_t C, float eps, cudaStream_t s);
// Floats of workspace launch_rmsnorm_backward needs for (N, C): per-chunk partials of dw.
int64_t rmsnorm_backward_workspace(int64_t N, int64_t C);
// dw accumulates; dinp, from, rounded, inp and arrivals as launch_layernorm_backward's. workspace
// holds rmsnorm_backward_workspace(N, C) floats.
cudaError_t launch_rmsnorm_backward(float* dinp, const float* from, void* rounded, float* dw, const float* dout,
                                    const void* inp, DType inp_type, const float* w, const float* rstd,
                                    float* workspace, unsigned* arrivals, int64_t N, int64_t C, cudaStream_t s);

// Per-head RMSNorm (ops::head_rmsnorm_forward) at columns [col0, col0 + heads hd) of x (N, W), in
// place, inputs to pre (N, heads hd), rstd (N heads). Backward: dx's columns in place, dw accumulates
// over chunks of (row, head) pairs folded in order (rmsnorm's reproducibility).
cudaError_t launch_head_rmsnorm_forward(float* x, float* pre, float* rstd, const float* w, int64_t N, int64_t W,
                                        int64_t col0, int64_t heads, int64_t hd, float eps, cudaStream_t s);
// Floats of workspace launch_head_rmsnorm_backward needs: per-chunk partials of dw.
int64_t head_rmsnorm_backward_workspace(int64_t N, int64_t heads, int64_t hd);
cudaError_t launch_head_rmsnorm_backward(float* dx, float* dw, const float* pre, const float* w, const float* rstd,
                                         float* workspace, int64_t N, int64_t W, int64_t col0, int64_t heads,
                                         int64_t hd, cudaStream_t s);
// The mixture-of-experts row moves (ops/moe.hpp), index arrays in device memory.
cudaError_t launch_moe_gather(float* dst, const float* src, const int32_t* token_of, int64_t rows, int64_t C,
                              cudaStream_t s);
cudaError_t launch_moe_combine(float* out, const float* y, const int32_t* pos, const float* w, int64_t N, int64_t k,
                               int64_t C, bool accumulate, cudaStream_t s);
cudaError_t launch_moe_combine_backward(float* dy, float* dw, const float* dout, const float* y, const int32_t* pos,
                                        const float* w, int64_t N, int64_t k, int64_t C, cudaStream_t s);

// Rotary embedding's frequencies as a kernel parameter (RopeFreqs without std::array, which device
// code cannot index): passed by value, so no device copy and no upload to order on the stream.
inline constexpr int kRopeMaxHalf = 256;  // RopeFreqs::kMaxHalf (static_assert in rope.cpp)
struct RopeTable {
  float inv_freq[kRopeMaxHalf];
};
// In place on x (B, T, W): in each row (time step t) and each of the first `heads` heads of
// 2*half channels, pairs (i, i + half) rotate by (pos0 + t) * inv_freq[i] (minus that when
// inverse), HF's rotate_half convention.
cudaError_t launch_rope(float* x, int64_t B, int64_t T, int64_t W, int64_t heads, int64_t half,
                        const RopeTable& freqs, int64_t pos0, bool inverse, cudaStream_t s);

// The latent attention's packing and its backward (ops/mla.hpp), rows of T positions from pos0.
cudaError_t launch_mla_qkv_forward(float* qkv, const float* q, const float* kv, const float* kva, const MlaHeads& m,
                                   const RopeTable& freqs, int64_t pos0, int64_t B, int64_t T, cudaStream_t s);
cudaError_t launch_mla_qkv_backward(float* dq, float* dkv, float* dkva, const float* dqkv, const MlaHeads& m,
                                    const RopeTable& freqs, int64_t pos0, int64_t B, int64_t T, cudaStream_t s);

// x (N, OC) += bias (OC) on every row
cudaError_t launch_add_bias(float* x, const float* bias, int64_t N, int64_t OC, cudaStream_t s);
cudaError_t launch_gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t s);
cudaError_t launch_gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t s);
// SwiGLU over gate_up (N, 2F) rows [gate | up]: out (N, F) = silu(gate) * up. Backward overwrites
// dgate_up (N, 2F) with [dout * up * silu'(gate) | dout * silu(gate)].
// out (N, F) and gate_up (N, 2F) f32 or bf16 (read widened, computed in f32, stored rounded once).
cudaError_t launch_swiglu_forward(void* out, DType out_type, const void* gate_up, DType gate_up_type, int64_t N,
                                  int64_t F, cudaStream_t s);
// dgate_up (N, 2F) and gate_up f32 or bf16, dout (N, F) f32.
cudaError_t launch_swiglu_backward(void* dgate_up, DType dgate_up_type, const void* gate_up, DType gate_up_type,
                                   const float* dout, int64_t N, int64_t F, cudaStream_t s);

// The fused attention (flash_attention.cu): head dimensions up to kMaxHeadDim.
inline constexpr int64_t kMaxHeadDim = 256;
cudaError_t launch_flash_merge(float* out, float* lse, const float* part, const float* part_lse, const FlashShape& s,
                               cudaStream_t st);
// out, q, k, v and dout f32, or bf16 when s.bf16 (f32 sums); lse, dq, dk, dv and D f32.
cudaError_t launch_flash_forward(void* out, float* lse, const void* q, const void* k, const void* v,
                                 const FlashShape& s, cudaStream_t st);
// D (B, H, Tq) is device scratch for rowsum(dO * O).
cudaError_t launch_flash_backward(float* dq, float* dk, float* dv, float* D, const void* dout, const void* q,
                                  const void* k, const void* v, const void* out, const float* lse,
                                  const FlashShape& s, cudaStream_t st);
// The naive attention's softmax, its sizes the entry point's (attention_forward_launches): in place
// over the B H rows of (T, T) scores, row t the causal softmax over s <= t, zeros above the diagonal.
// Stored as t (f32 or bf16), computed in f32.
cudaError_t launch_causal_softmax(void* att, DType t, int64_t H, int64_t KV, int64_t B, int64_t T, int64_t C,
                                  cudaStream_t s);
// One batch entry's (H, T, T) (attention_backward_launches): in place, datt <- att * (datt -
// <att, datt>) * scale over s <= t, zeros above the diagonal; both stored as t.
cudaError_t launch_causal_softmax_backward(void* datt, const void* att, DType t, int64_t H, int64_t KV, int64_t B,
                                           int64_t T, int64_t C, float scale, cudaStream_t s);

// Attention over a KV cache: k_cache, v_cache (B, S, KV hd), qkv (B, T, (H + 2 KV) hd).
// ops/quantize.hpp's records: one block of threads per record.
cudaError_t launch_quantize_blocks(float* q, const void* x, DType t, int64_t x_stride, int64_t rows, int64_t n,
                                   int bits, int64_t block, cudaStream_t s);
cudaError_t launch_dequantize_blocks(void* x, DType t, const float* q, int64_t x_stride, int64_t rows, int64_t n,
                                     int bits, int64_t block, bool accumulate, cudaStream_t s);
// kv_cache_write copies qkv's k and v heads into cache rows [pos0, pos0 + T); attention_cached
// writes out (B, T, H hd), query t over cache rows [0, pos0 + t], with scores a workspace of
// B H T (pos0 + T) floats.
cudaError_t launch_kv_cache_write(float* k_cache, float* v_cache, const float* qkv, int64_t B, int64_t T, int64_t S,
                                  int64_t H, int64_t KV, int64_t hd, int64_t pos0, cudaStream_t s);
cudaError_t launch_attention_cached(float* out, const float* qkv, const float* k_cache, const float* v_cache,
                                    float* scores, int64_t B, int64_t T, int64_t S, int64_t H, int64_t KV, int64_t hd,
                                    int64_t pos0, cudaStream_t s);

// losses (N) = -log softmax(logits)[target]; when dlogits is not null it receives
// (softmax - onehot(target)) * dloss_scale, stored as dt (f32, which may alias logits, or bf16).
cudaError_t launch_cross_entropy(float* losses, void* dlogits, DType dt, const float* logits, const int32_t* targets,
                                 int64_t N, int64_t V, float dloss_scale, cudaStream_t s);
// The vocabulary-parallel cross-entropy's steps (Backend::vocab_ce_*) over logits (N, Vl), of
// which the first `valid` columns are real. cols (N) is each target's column in this shard, -1
// where another rank holds it; mx, sumexp and tlogit passed in are the group's reduced values.
// Padding columns' dlogits are 0; dlogits may alias logits.
cudaError_t launch_vocab_ce_max(float* mx, const float* logits, int64_t N, int64_t Vl, int64_t valid, cudaStream_t s);
cudaError_t launch_vocab_ce_sums(float* sumexp, float* tlogit, const float* logits, const int32_t* cols,
                                 const float* mx, int64_t N, int64_t Vl, int64_t valid, cudaStream_t s);
cudaError_t launch_vocab_ce_finish(float* losses, float* dlogits, const float* logits, const int32_t* cols,
                                   const float* mx, const float* sumexp, const float* tlogit, int64_t N, int64_t Vl,
                                   int64_t valid, float dloss_scale, cudaStream_t s);

// AdamW as in the CPU kernel; inv_bc1/inv_bc2 are 1 / (1 - beta^step), computed by the caller.
struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay, grad_scale, inv_bc1, inv_bc2;
};
// g: f32, or bf16 (widened as read; its kernel takes one element a thread).
cudaError_t launch_adamw(float* p, const void* g, DType gt, float* m, float* v, int64_t n, const AdamWStep& a,
                         cudaStream_t s);
// adamw_update_segments: up to kAdamWSegmentsPerLaunch segments of flat p, g, m, v, each with its
// weight decay (step.weight_decay unused), in one kernel; g f32 or bf16.
struct AdamWSegmentTable {
  int64_t offset[kAdamWSegmentsPerLaunch];
  int64_t numel[kAdamWSegmentsPerLaunch];
  float weight_decay[kAdamWSegmentsPerLaunch];
  int count;
};
// rounded (optional, bf16 like p): each updated element rounded into it as well.
cudaError_t launch_adamw_segments(float* p, const void* g, DType gt, float* m, float* v, void* rounded,
                                  const AdamWSegmentTable& t, const AdamWStep& a, cudaStream_t s);
// b = mu * b + g * grad_scale + wd * p; p -= lr * b.
cudaError_t launch_sgd(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float weight_decay,
                       float grad_scale, cudaStream_t s);

// Muon (muon.cu): the momentum pass; x /= max(||x||, eps) in three launches (per-block sums of
// squares into partial, kReduceBlocks + 1 doubles; one block folds them into the norm; the divide);
// p = p * keep - lr * update.
cudaError_t launch_muon_momentum(const float* g, float* buf, float* update, int64_t n, float momentum, bool nesterov,
                                 float grad_scale, cudaStream_t s);
cudaError_t launch_muon_normalize(void* x, DType t, int64_t n, float eps, double* partial, cudaStream_t s);
cudaError_t launch_muon_apply(float* p, const float* update, int64_t n, float keep, float lr, cudaStream_t s);

}  // namespace shardlab::cuda
