// kernels.hpp — the CPU implementations of the operation families (src/backend/ops/) on raw f32
// pointers, one file each (cpu/<family>.cpp). The families validate the tensors and call these.
#pragma once
#include <cstdint>

#include "src/backend/ops/flash_shape.hpp"
#include "src/backend/ops/mla_heads.hpp"
#include "src/backend/ops/muon.hpp"
#include "src/backend/ops/optimizer.hpp"
#include "src/backend/ops/rope.hpp"
#include "src/core/dtype.hpp"

namespace shardlab::cpu {

// Loops over fewer elements than this run on one thread: the fork/join costs more than it saves.
// One value for every CPU loop; the threaded layernorm backward sums per-thread partials, so it
// also fixes where results start to depend on the thread count.
inline constexpr int64_t kParallelMin = 1 << 14;

// Row-major sgemm, C = alpha op(A) op(B) + beta C, through the library gemm.hpp's rule picks.
void sgemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// wpe / dwpe may be nullptr: no learned positions.
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T,
                       int64_t C, int64_t V);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B, int64_t T,
                        int64_t C);
// The vocabulary-parallel embedding: wte holds rows [v0, v0 + V); tokens outside give zero rows
// (plus wpe) and no gradient.
void embedding_forward_shard(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                             int64_t T, int64_t C, int64_t V, int64_t v0);
void embedding_backward_shard(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                              int64_t T, int64_t C, int64_t V, int64_t v0);
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int64_t N, int64_t C, float eps);
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C);
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C, float eps);
// RMSNorm of heads of hd at columns [col0, col0 + heads hd) of each row of x (N, W), in place;
// the inputs copied to pre (N, heads hd), rstd (N heads). Backward: dx's same columns in place,
// dw accumulates (rows in order).
void head_rmsnorm_forward(float* x, float* pre, float* rstd, const float* w, int64_t N, int64_t W, int64_t col0,
                          int64_t heads, int64_t hd, float eps);
void head_rmsnorm_backward(float* dx, float* dw, const float* pre, const float* w, const float* rstd, int64_t N,
                           int64_t W, int64_t col0, int64_t heads, int64_t hd);
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                      int64_t N, int64_t C);
// x (B*T rows of W); the first `heads` heads of head_dim channels rotate, positions pos0 + t.
void rope(float* x, int64_t B, int64_t T, int64_t W, int64_t heads, int64_t head_dim, const RopeFreqs& freqs,
          int64_t pos0, bool inverse);
// Latent attention (ops/mla.hpp): the packed [q | k | v] rows from q, kv and kva, and back.
void mla_qkv_forward(float* qkv, const float* q, const float* kv, const float* kva, int64_t B, int64_t T,
                     const MlaHeads& m, const RopeFreqs& freqs, int64_t pos0);
void mla_qkv_backward(float* dq, float* dkv, float* dkva, const float* dqkv, int64_t B, int64_t T, const MlaHeads& m,
                      const RopeFreqs& freqs, int64_t pos0);
void add_bias(float* x, const float* bias, int64_t N, int64_t OC);
void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);
// gate_up (N, 2F) = [gate | up] per row; out, dout (N, F).
void swiglu_forward(float* out, const float* gate_up, int64_t N, int64_t F);
void swiglu_backward(float* dgate_up, const float* gate_up, const float* dout, int64_t N, int64_t F);
// qkv (B, T, (H + KV) hd + KV vd) = [q | k | v]; out (B, T, H vd); KV divides H.
void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                       int64_t hd, int64_t vd);
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int64_t B,
                        int64_t T, int64_t H, int64_t KV, int64_t hd, int64_t vd);
// Fused (flash) attention: shapes, strides and workspace in ops/flash_shape.hpp. lse (B, H, Tq).
// out, q, k, v and dout are f32, or bf16 when s.bf16; lse, dq, dk and dv are f32.
void flash_attention_forward(void* out, float* lse, const void* q, const void* k, const void* v, const FlashShape& s,
                             float* workspace);
void flash_attention_merge(float* out, float* lse, const float* part, const float* part_lse, const FlashShape& s);
// dq, dk, dv (strides of q, k, v) are overwritten (added to with s.accumulate).
void flash_attention_backward(float* dq, float* dk, float* dv, const void* dout, const void* q, const void* k,
                              const void* v, const void* out, const float* lse, const FlashShape& s,
                              float* workspace);
// k_cache, v_cache (B, S, KV hd); qkv (B, T, (H + 2 KV) hd); rows [pos0, pos0 + T) of the caches.
// ops/quantize.hpp's records: q holds rows * ceil(n / block) records of 1 + block * bits / 32 words.
void quantize_blocks(float* q, const void* x, DType t, int64_t x_stride, int64_t rows, int64_t n, int bits,
                     int64_t block);
void dequantize_blocks(void* x, DType t, const float* q, int64_t x_stride, int64_t rows, int64_t n, int bits,
                       int64_t block, bool accumulate);
void copy_rows(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t width);
void kv_cache_write(float* k_cache, float* v_cache, const float* qkv, int64_t B, int64_t T, int64_t S, int64_t H,
                    int64_t KV, int64_t hd, int64_t pos0);
// out (B, T, C = H hd): query t of qkv over cache rows [0, pos0 + t].
void attention_cached(float* out, const float* qkv, const float* k_cache, const float* v_cache, int64_t B, int64_t T,
                      int64_t S, int64_t H, int64_t KV, int64_t hd, int64_t pos0);
void cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                   float dloss_scale);
// The vocabulary-parallel cross-entropy's three steps (ops::vocab_ce_*): logits (N, Vl).
void vocab_ce_max(float* mx, const float* logits, int64_t N, int64_t Vl, int64_t valid);
void vocab_ce_sums(float* sumexp, float* tlogit, const float* logits, const int32_t* targets, int64_t N, int64_t Vl,
                   int64_t v0, int64_t valid, const float* mx);
void vocab_ce_finish(float* losses, float* dlogits, const float* logits, const int32_t* targets, int64_t N,
                     int64_t Vl, int64_t v0, int64_t valid, const float* mx, const float* sumexp, const float* tlogit,
                     float dloss_scale);
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a);
// The same update from bf16 gradients, widened as read (bit for bit what an f32 copy of them gives).
void adamw_update_bf16_grad(float* p, const uint16_t* g, float* m, float* v, int64_t n, const AdamWArgs& a);
// moe.cpp (ops/moe.hpp); index arrays as there.
void moe_gather(float* dst, const float* src, const int32_t* token_of, int64_t rows, int64_t N, int64_t C);
void moe_combine(float* out, const float* y, const int32_t* pos, const float* w, int64_t N, int64_t k, int64_t C,
                 int64_t rows, bool accumulate);
void moe_combine_backward(float* dy, float* dw, const float* dout, const float* y, const int32_t* pos, const float* w,
                          int64_t N, int64_t k, int64_t C, int64_t rows);
void sgd_update(float* p, const float* g, float* buf, int64_t n, const SgdArgs& a);
// muon.cpp (ops/muon.hpp).
void muon_momentum(const float* g, float* buf, float* update, int64_t n, const MuonMomentumArgs& a);
void muon_normalize(float* x, int64_t n, float eps, bool bf16_math);
void round_to_bf16(float* x, int64_t n);
void muon_apply(float* p, const float* update, int64_t n, float keep, float lr);

}  // namespace shardlab::cpu
