// launches.cpp — the lists of launches.hpp. Plain C++: built with or without the CUDA toolkit, for
// the CUDA launchers and for the meta backend's ledger. Each function mirrors its launcher's
// branches (early returns, pack widths) and the entry point's copies; the launcher reads its grids
// from here, so a changed grid changes both.
#include "src/backend/cuda/launches.hpp"

#include "src/backend/backend.hpp"

namespace shardlab::cuda {
namespace {

Launch kernel(const char* name, int64_t x, int64_t y = 1) {
  Launch l;
  l.name = name;
  l.x = static_cast<uint32_t>(x);
  l.y = static_cast<uint32_t>(y);
  return l;
}

Launch command(const char* name, LaunchKind kind) {
  Launch l;
  l.name = name;
  l.kind = kind;
  return l;
}

// An upload from host memory (pinned: the token ids' slots, token_ids.cpp) or a copy that touches it.
Launch host_copy() { return command("cudaMemcpyAsync (host)", LaunchKind::copy); }

// A grid-stride kernel over n elements that returns early on none.
Launches grid_stride(const char* name, int64_t n) {
  Launches L;
  if (n > 0) L.add(kernel(name, grid_for(n)));
  return L;
}

// A warp-per-row kernel over N rows that returns early on none.
Launches per_row(const char* name, int64_t N) {
  Launches L;
  if (N > 0) L.add(kernel(name, row_blocks(N)));
  return L;
}

// A kernel of float4 packs when they fit (`packed`), else of single floats.
Launches packed_or_not(const char* packs, const char* singles, int64_t n, bool packed) {
  Launches L;
  if (n > 0) L.add(packed ? kernel(packs, grid_for(n / 4)) : kernel(singles, grid_for(n)));
  return L;
}

// A kernel that takes `rows` blocks (one per row of logits) after the targets' upload.
Launches upload_then_rows(const char* name, int64_t rows) {
  Launches L;
  if (rows > 0) L.add(host_copy()).add(kernel(name, rows));
  return L;
}

// LayerNorm's and RMSNorm's backward (stats 2 and 1 parameter gradients): one launch where its
// blocks hold their warps' partial rows (norm_fused_warps), else dinp one warp per row, then dw
// (and db) in chunks of rows folded in order.
Launches norm_backward(const char* dinp, const char* partial, const char* fold, int64_t N, int64_t C, int stats) {
  Launches L;
  if (N == 0 || C == 0) return L;
  if (norm_fused_warps(C, stats) > 0) return L.add(kernel("norm_backward_fused_kernel", norm_fused_blocks(N)));
  const int64_t col_blocks = (C + kThreads - 1) / kThreads;
  return L.add(kernel(dinp, row_blocks(N))).add(kernel(partial, col_blocks, layernorm_chunks(N))).add(
      kernel(fold, col_blocks));
}

}  // namespace

Launches& Launches::add(Launch l) {
  SHARD_CHECK(count < static_cast<int>(at.size()), "launch {} after {} commands: a Launches holds {}", l.name, count,
              at.size());
  at[static_cast<size_t>(count++)] = l;
  return *this;
}

const Launch& Launches::operator[](int i) const {
  SHARD_CHECK(i >= 0 && i < count, "launch {} of a list of {}", i, count);
  return at[static_cast<size_t>(i)];
}

bool gemm_rounds(const GemmDesc& d, DType t) { return d.round_inputs_to != DType::f32 && t == DType::f32; }

// ---- CudaBackend's primitives -------------------------------------------------------------------

// Element-wise kernels launch even on n == 0 (grid_for gives one block; the loop runs no element).
Launches fill_launches(int64_t n) { return Launches{}.add(kernel("fill_kernel", grid_for(n))); }
Launches cast_launches(int64_t n) { return Launches{}.add(kernel("cast_kernel", grid_for(n))); }

Launches cast_ranges_launches(std::span<const ElemRange> ranges) {
  Launches L;
  for (size_t first = 0; first < ranges.size(); first += kCastRanges) {
    int64_t n = 0;
    for (size_t i = first; i < std::min(ranges.size(), first + kCastRanges); ++i) n += ranges[i].count;
    if (n > 0) L.add(kernel("cast_ranges_kernel", grid_for(n)));
  }
  return L;
}
Launches axpy_launches(int64_t n) { return Launches{}.add(kernel("axpy_kernel", grid_for(n))); }
Launches scale_launches(int64_t n) { return Launches{}.add(kernel("scale_kernel", grid_for(n))); }
Launches add_launches(int64_t n) { return Launches{}.add(kernel("add_kernel", grid_for(n))); }
Launches mul_launches(int64_t n) { return Launches{}.add(kernel("mul_kernel", grid_for(n))); }
Launches add_into_launches(int64_t n) { return Launches{}.add(kernel("add_into_kernel", grid_for(n))); }

Launches add_bias_launches(int64_t N, int64_t OC, bool aligned) {
  return packed_or_not("add_bias_kernel<4>", "add_bias_kernel<1>", N * OC, packable(OC, aligned));
}

// Per-block partials over at most kReduceBlocks blocks, then one block folds them in order.
Launches reduce_launches(int64_t n) {
  const int64_t blocks = std::min<int64_t>(kReduceBlocks, std::max<int64_t>(1, (n + kThreads - 1) / kThreads));
  return Launches{}.add(kernel("reduce_partial_kernel", blocks)).add(kernel("reduce_final_kernel", 1));
}

Launches sum_rows_launches(int64_t rows, int64_t cols) {
  return Launches{}
      .add(kernel("sum_rows_kernel", sum_rows_tiles(cols), sum_rows_chunks(rows, cols)));
}

Launches copy_launches(bool host) {
  return Launches{}.add(host ? host_copy() : command("cudaMemcpyAsync", LaunchKind::copy));
}

Launches gemm_launches(const GemmDesc& d) {
  Launches L;
  if (gemm_rounds(d, d.a_type))
    L.add(cast_launches(gemm_operand_elems(d.batch, d.stride_a, d.trans_a == Trans::N ? d.m : d.k, d.lda))[0]);
  if (gemm_rounds(d, d.b_type))
    L.add(cast_launches(gemm_operand_elems(d.batch, d.stride_b, d.trans_b == Trans::N ? d.k : d.n, d.ldb))[0]);
  return L.add(command("cublasGemmStridedBatchedEx", LaunchKind::library));
}

// ---- embedding ----------------------------------------------------------------------------------

Launches embedding_forward_launches(int64_t B, int64_t T, int64_t C, bool aligned) {
  Launches L;
  if (B * T > 0) L.add(host_copy());  // the ids (upload_host_ids uploads nothing for none)
  const int64_t n = B * T * C;
  if (n > 0)
    L.add(packable(C, aligned) ? kernel("embedding_forward_kernel<4>", grid_for(n / 4))
                               : kernel("embedding_forward_kernel<1>", grid_for(n)));
  return L;
}

Launches embedding_forward_shard_launches(int64_t B, int64_t T, int64_t, int64_t C, bool aligned) {
  return embedding_forward_launches(B, T, C, aligned);  // the shard's rows are uploaded as the ids are
}

Launches embedding_backward_launches(int64_t, int64_t T, int64_t C, bool dwpe, int64_t buckets) {
  Launches L;
  if (dwpe && T * C > 0) L.add(kernel("embedding_backward_dwpe_kernel", grid_for(T * C)));
  L.add(host_copy());  // the grouping always holds the offsets' end, so it is never empty
  if (buckets > 0 && C > 0) L.add(kernel("embedding_backward_dwte_kernel", buckets));
  return L;
}

Launches embedding_backward_shard_launches(int64_t B, int64_t T, int64_t, int64_t C, bool dwpe, int64_t buckets) {
  return embedding_backward_launches(B, T, C, dwpe, buckets);
}

// ---- norms --------------------------------------------------------------------------------------

Launches layernorm_forward_launches(int64_t N, int64_t) { return per_row("layernorm_forward_kernel", N); }

Launches layernorm_backward_launches(int64_t N, int64_t C) {
  return norm_backward("layernorm_backward_dinp_kernel", "layernorm_backward_partial_kernel",
                       "layernorm_backward_fold_kernel", N, C, 2);
}

Launches rmsnorm_forward_launches(int64_t N, int64_t) { return per_row("rmsnorm_forward_kernel", N); }

Launches rmsnorm_backward_launches(int64_t N, int64_t C) {
  return norm_backward("rmsnorm_backward_dinp_kernel", "rmsnorm_backward_partial_kernel",
                       "rmsnorm_backward_fold_kernel", N, C, 1);
}

Launches head_rmsnorm_forward_launches(int64_t N, int64_t, int64_t, int64_t heads, int64_t) {
  return grid_stride("head_rmsnorm_forward_kernel", N * heads);
}

// dw's partials over chunks of the (row, head) pairs, their fold, then dx (which overwrites what
// the partials read).
Launches head_rmsnorm_backward_launches(int64_t N, int64_t, int64_t, int64_t heads, int64_t hd) {
  Launches L;
  const int64_t pairs = N * heads;
  if (pairs == 0) return L;
  return L.add(kernel("head_rmsnorm_dw_partial_kernel", (hd + kThreads - 1) / kThreads, layernorm_chunks(pairs)))
      .add(kernel("head_rmsnorm_dw_fold_kernel", grid_for(hd)))
      .add(kernel("head_rmsnorm_dx_kernel", grid_for(pairs)));
}

// ---- rope, activations, attention ---------------------------------------------------------------

Launches rope_launches(int64_t heads, int64_t half, int64_t, bool, int64_t B, int64_t T, int64_t) {
  return grid_stride("rope_kernel", B * T * heads * half);
}

Launches mla_qkv_forward_launches(const MlaHeads& m, int64_t B, int64_t T) {
  return grid_stride("mla_qkv_forward_kernel", B * T * m.width());
}

Launches mla_qkv_backward_launches(const MlaHeads& m, int64_t B, int64_t T) {
  Launches L = grid_stride("mla_qkv_backward_kernel", B * T * m.heads * (m.qk() + m.nope + m.v));
  for (const Launch& l : grid_stride("mla_k_rope_backward_kernel", B * T * (m.rope / 2))) L.add(l);
  return L;
}

Launches gelu_forward_launches(int64_t n, bool aligned) {
  return packed_or_not("gelu_forward_kernel<4>", "gelu_forward_kernel<1>", n, packable(n, aligned));
}

Launches gelu_backward_launches(int64_t n, bool aligned) {
  return packed_or_not("gelu_backward_kernel<4>", "gelu_backward_kernel<1>", n, packable(n, aligned));
}

Launches swiglu_forward_launches(int64_t N, int64_t F) { return grid_stride("swiglu_forward_kernel", N * F); }
Launches swiglu_backward_launches(int64_t N, int64_t F) { return grid_stride("swiglu_backward_kernel", N * F); }

Launches attention_forward_launches(int64_t H, int64_t, int64_t B, int64_t T, int64_t) {
  return per_row("causal_softmax_kernel", B * H * T);
}

Launches attention_backward_launches(int64_t H, int64_t, int64_t, int64_t T, int64_t) {
  return per_row("causal_softmax_backward_kernel", H * T);
}

// ---- fused attention ----------------------------------------------------------------------------

Launches flash_attention_forward_launches(const FlashShape& s) {
  return per_row("flash_forward_kernel", s.B * s.H * s.Tq);
}

Launches cudnn_attention_launches(bool backward) {
  Launches L;
  return L.add(command(backward ? "cudnn sdpa backward" : "cudnn sdpa forward", LaunchKind::library));
}

Launches flash_attention_merge_launches(const FlashShape& s) {
  Launches L;
  const int64_t rows = s.B * s.H * s.Tq;
  if (rows > 0) L.add(kernel("flash_merge_kernel", (rows + kFlashMergeThreads - 1) / kFlashMergeThreads));
  return L;
}

// D = rowsum(dO * O) and dq per query row, then dk and dv per key row.
Launches flash_attention_backward_launches(const FlashShape& s) {
  Launches L;
  const int64_t qrows = s.B * s.H * s.Tq, krows = s.B * s.KV * s.Tk;
  if (qrows == 0) return L;
  L.add(kernel("flash_d_kernel", row_blocks(qrows))).add(kernel("flash_dq_kernel", row_blocks(qrows)));
  if (krows > 0) L.add(kernel("flash_dkv_kernel", row_blocks(krows)));
  return L;
}

// ---- quantization, KV cache ---------------------------------------------------------------------

// One block per record: `rows` rows of ceil(n / block) records.
Launches quantize_blocks_launches(DType, int64_t, int64_t rows, int64_t n, int, int64_t block) {
  Launches L;
  const int64_t records = rows * ((n + block - 1) / block);
  if (records > 0) L.add(kernel("quantize_kernel", records));
  return L;
}

Launches dequantize_blocks_launches(DType, int64_t, int64_t rows, int64_t n, int, int64_t block, bool) {
  Launches L;
  const int64_t records = rows * ((n + block - 1) / block);
  if (records > 0) L.add(kernel("dequantize_kernel", records));
  return L;
}

Launches copy_rows_launches(int64_t, int64_t, int64_t, int64_t) {
  return Launches{}.add(command("cudaMemcpy2DAsync", LaunchKind::copy));
}

Launches kv_cache_write_launches(int64_t H, int64_t KV, int64_t, int64_t B, int64_t T, int64_t C, int64_t) {
  const int64_t hd = H > 0 ? C / H : 0;
  return grid_stride("kv_cache_write_kernel", B * T * KV * hd);
}

// One block per (b, h, t) query.
Launches attention_cached_launches(int64_t H, int64_t, int64_t, int64_t B, int64_t T, int64_t, int64_t) {
  Launches L;
  if (B * H * T > 0) L.add(kernel("attention_cached_kernel", B * H * T));
  return L;
}

// ---- losses -------------------------------------------------------------------------------------

Launches cross_entropy_launches(int64_t N, int64_t) { return upload_then_rows("cross_entropy_kernel", N); }

Launches vocab_ce_max_launches(int64_t N, int64_t) {
  Launches L;
  if (N > 0) L.add(kernel("vocab_ce_max_kernel", N));
  return L;
}

Launches vocab_ce_sums_launches(int64_t N, int64_t) { return upload_then_rows("vocab_ce_sums_kernel", N); }
Launches vocab_ce_finish_launches(int64_t N, int64_t) { return upload_then_rows("vocab_ce_finish_kernel", N); }

// ---- optimizers, mixture of experts -------------------------------------------------------------

Launches adamw_update_launches(int64_t n, bool aligned) {
  return packed_or_not("adamw_kernel<4>", "adamw_kernel<1>", n, packable(n, aligned));
}

Launches adamw_bf16_grad_launches(int64_t n) { return grid_stride("adamw_bf16_grad_kernel", n); }

Launches adamw_segments_launches(std::span<const int64_t> numels, bool bf16_grads) {
  Launches L;
  for (size_t first = 0; first < numels.size(); first += kAdamWSegmentsPerLaunch) {
    const size_t count = std::min<size_t>(kAdamWSegmentsPerLaunch, numels.size() - first);
    const int64_t most = *std::max_element(numels.begin() + first, numels.begin() + first + count);
    if (most == 0) continue;
    L.add(kernel(bf16_grads ? "adamw_segments_kernel<bf16>" : "adamw_segments_kernel<f32>", grid_for(most),
                 static_cast<int64_t>(count)));
  }
  return L;
}

Launches sgd_update_launches(int64_t n, bool aligned) {
  return packed_or_not("sgd_kernel<4>", "sgd_kernel<1>", n, packable(n, aligned));
}

Launches muon_momentum_launches(int64_t n) { return grid_stride("muon_momentum_kernel", n); }

Launches muon_normalize_launches(int64_t n) {
  Launches L;
  if (n > 0)
    L.add(kernel("muon_sumsq_kernel", kReduceBlocks))
        .add(kernel("muon_norm_kernel", 1))
        .add(kernel("muon_divide_kernel", grid_for(n)));
  return L;
}

Launches muon_apply_launches(int64_t n) { return grid_stride("muon_apply_kernel", n); }

Launches moe_gather_launches(int64_t rows, int64_t C) { return grid_stride("moe_gather_kernel", rows * C); }

Launches moe_combine_launches(int64_t N, int64_t, int64_t C, bool) {
  return grid_stride("moe_combine_kernel", N * C);
}

// dy per (slot, column), then dw one warp per slot. Slots without columns still launch (C == 0).
Launches moe_combine_backward_launches(int64_t N, int64_t k, int64_t C) {
  Launches L;
  if (N * k == 0) return L;
  return L.add(kernel("moe_combine_dy_kernel", grid_for(N * k * C))).add(kernel("moe_combine_dw_kernel",
                                                                             row_blocks(N * k)));
}

}  // namespace shardlab::cuda
