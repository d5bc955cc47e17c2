// ops.hpp — the CUDA implementations of the operation families (src/backend/ops/), one file each
// (cuda/<family>.cpp, launching cuda/<family>.cu's kernels). Plain C++: the families' dispatch
// includes it without the CUDA toolkit, and calls these only for a CUDA backend (be is one). The
// families checked the tensors and pass the sizes they derived.
#pragma once
#include "src/backend/ops/flash_shape.hpp"
#include "src/backend/ops/mla_heads.hpp"
#include "src/backend/ops/muon.hpp"
#include "src/backend/ops/optimizer.hpp"
#include "src/backend/ops/quantize.hpp"
#include "src/backend/ops/rope.hpp"

namespace shardlab::cuda {

// ---- embedding.cpp ----
void embedding_forward(Backend& be, Tensor out, const int32_t* tokens, int64_t B, int64_t T, Tensor wte, Tensor wpe,
                       int64_t C);
void embedding_backward(Backend& be, Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C);
void embedding_forward_shard(Backend& be, Tensor out, const int32_t* tokens, int64_t B, int64_t T, Tensor wte,
                             Tensor wpe, int64_t v0, int64_t C);
void embedding_backward_shard(Backend& be, Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int64_t B,
                              int64_t T, int64_t v0, int64_t C);
// ---- norm.cpp ----
void layernorm_forward(Backend& be, Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias,
                       float eps, Tensor inp_bf16, int64_t N, int64_t C);
void layernorm_backward(Backend& be, Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                        Tensor mean, Tensor rstd, Tensor dinp_from, Tensor dinp_bf16, int64_t N, int64_t C);
void rmsnorm_forward(Backend& be, Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps, Tensor inp_bf16,
                     int64_t N, int64_t C);
void rmsnorm_backward(Backend& be, Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd,
                      Tensor dinp_from, Tensor dinp_bf16, int64_t N, int64_t C);
void head_rmsnorm_forward(Backend& be, Tensor x, Tensor pre, Tensor rstd, Tensor weight, int64_t N, int64_t W,
                          int64_t col0, int64_t heads, int64_t hd, float eps);
void head_rmsnorm_backward(Backend& be, Tensor dx, Tensor dweight, Tensor pre, Tensor weight, Tensor rstd, int64_t N,
                           int64_t W, int64_t col0, int64_t heads, int64_t hd);
// ---- rope.cpp ----
void rope(Backend& be, Tensor x, int64_t heads, const RopeFreqs& freqs, int64_t pos0, bool inverse, int64_t B,
          int64_t T, int64_t W);
// ---- mla.cpp ----
void mla_qkv_forward(Backend& be, Tensor qkv, Tensor q, Tensor kv, Tensor kva, const MlaHeads& m,
                     const RopeFreqs& freqs, int64_t pos0, int64_t B, int64_t T);
void mla_qkv_backward(Backend& be, Tensor dq, Tensor dkv, Tensor dkva, Tensor dqkv, const MlaHeads& m,
                      const RopeFreqs& freqs, int64_t pos0, int64_t B, int64_t T);
// ---- activation.cpp ----
void gelu_forward(Backend& be, Tensor out, Tensor inp);
void gelu_backward(Backend& be, Tensor dinp, Tensor inp, Tensor dout);
void swiglu_forward(Backend& be, Tensor out, Tensor gate_up, int64_t N, int64_t F);
void swiglu_backward(Backend& be, Tensor dgate_up, Tensor gate_up, Tensor dout, int64_t N, int64_t F);
// ---- attention.cpp ----
// qkv (B, T, (H + KV) hd + KV vd); out (B, T, H vd).
void attention_forward(Backend& be, Tensor out, Tensor att, Tensor qkv, int64_t H, int64_t KV, int64_t B, int64_t T,
                       int64_t hd, int64_t vd);
void attention_backward(Backend& be, Tensor dqkv, Tensor dout, Tensor qkv, Tensor att, int64_t H, int64_t KV,
                        Tensor scratch, int64_t B, int64_t T, int64_t hd, int64_t vd);
// ---- cudnn_attention.cpp (ops/cudnn_attention.hpp): bf16 qkv, out, dout and dqkv in the
// layout flash_shape_of_qkv describes, lse f32 (B, H, T); SHARD_CHECKs where the build has no cuDNN.
void cudnn_attention_forward(Backend& be, void* out, float* lse, const void* qkv, const FlashShape& s);
void cudnn_attention_backward(Backend& be, void* dqkv, const void* dout, const void* qkv, const void* out,
                              const float* lse, const FlashShape& s);
// ---- flash_attention.cpp ----
// out, q, k, v and dout are f32, or bf16 when s.bf16; lse, dq, dk and dv f32.
void flash_attention_forward(Backend& be, void* out, float* lse, const void* q, const void* k, const void* v,
                             const FlashShape& s);
void flash_attention_merge(Backend& be, float* out, float* lse, const float* part, const float* part_lse,
                           const FlashShape& s);
void flash_attention_backward(Backend& be, float* dq, float* dk, float* dv, const void* dout, const void* q,
                              const void* k, const void* v, const void* out, const float* lse, float* workspace,
                              const FlashShape& s);
// ---- quantize.cpp ----
void quantize_blocks(Backend& be, float* q, const void* x, DType t, int64_t x_stride, int64_t rows, int64_t n,
                     const QuantSpec& s);
void dequantize_blocks(Backend& be, void* x, DType t, const float* q, int64_t x_stride, int64_t rows, int64_t n,
                       const QuantSpec& s, bool accumulate);
// ---- kv_cache.cpp ----
void copy_rows(Backend& be, float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
               int64_t width);
void kv_cache_write(Backend& be, Tensor k_cache, Tensor v_cache, Tensor qkv, int64_t H, int64_t KV, int64_t pos0,
                    int64_t B, int64_t T, int64_t C, int64_t S);
void attention_cached(Backend& be, Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t H, int64_t KV,
                      int64_t pos0, int64_t B, int64_t T, int64_t C, int64_t S);
// ---- loss.cpp ----
void cross_entropy(Backend& be, Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets,
                   float dloss_scale, int64_t N, int64_t V);
void vocab_ce_max(Backend& be, Tensor mx, Tensor logits, int64_t valid, int64_t N, int64_t Vl);
void vocab_ce_sums(Backend& be, Tensor sumexp, Tensor tlogit, Tensor logits, const int32_t* targets, int64_t v0,
                   int64_t valid, Tensor mx, int64_t N, int64_t Vl);
void vocab_ce_finish(Backend& be, Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets, int64_t v0,
                     int64_t valid, Tensor mx, Tensor sumexp, Tensor tlogit, float dloss_scale, int64_t N, int64_t Vl);
// ---- optimizer.cpp ----
void adamw_update(Backend& be, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWArgs& a);
void adamw_update_segments(Backend& be, Tensor param, Tensor grad, Tensor m, Tensor v,
                           std::span<const AdamWSegment> segments, const AdamWArgs& a, Tensor rounded);
void sgd_update(Backend& be, Tensor param, Tensor grad, Tensor momentum, const SgdArgs& a);
// ---- muon.cpp ----
void muon_momentum(Backend& be, Tensor grad, Tensor buf, Tensor update, const MuonMomentumArgs& a);
void muon_normalize(Backend& be, Tensor x, float eps);  // x f32 or bf16 (bf16 rounds as torch's bf16 does)
void muon_apply(Backend& be, Tensor param, Tensor update, float keep, float lr);

// ---- moe.cpp ---- (index arrays: device memory)
void moe_gather(Backend& be, Tensor dst, Tensor src, const int32_t* token_of, int64_t rows, int64_t C);
void moe_combine(Backend& be, Tensor out, Tensor y, const int32_t* pos, Tensor w, int64_t N, int64_t k, int64_t C,
                 bool accumulate);
void moe_combine_backward(Backend& be, Tensor dy, Tensor dw, Tensor dout, Tensor y, const int32_t* pos, Tensor w,
                          int64_t N, int64_t k, int64_t C);

}  // namespace shardlab::cuda
