// flash_attention.hpp — the fused (flash) attention family: self-attention with grouped-query heads
// over the [q | k | v] buffer the layers write, causal or not, forward and backward, in O(T) memory
// (no (T, T) probabilities: attention.hpp's naive kernels keep them, and stay as the reference).
// Shapes, tiles and workspace: flash_shape.hpp. Conventions: ops/dispatch.hpp.
#pragma once
#include "src/backend/ops/dispatch.hpp"
#include "src/backend/ops/flash_shape.hpp"

namespace shardlab::ops {

// qkv (B, T, (H + KV) hd + KV vd) = [q | k | v] per row (vd: the value head dimension, 0: hd; see
// attention.hpp's packed_head_dims); out (B, T, H vd); lse (B, H, T) f32, each query row's
// log-sum-exp of its scores scaled by 1/sqrt(hd) (saved for backward; partial results merge with
// it). The workspace holds flash_attention_workspace_elems(..., false, bf16, vd) floats. qkv and
// out are f32, or both bf16 (read into f32 tiles, f32 products and sums, out rounded once).
void flash_attention_forward(Backend& be, Tensor out, Tensor lse, Tensor qkv, int64_t H, int64_t KV, bool causal,
                             Tensor workspace, int64_t vd = 0);
// dqkv (like qkv, f32 whatever qkv holds) is overwritten from dout (of qkv's dtype) and forward's
// qkv, out and lse; the workspace holds flash_attention_workspace_elems(..., true, bf16, vd) floats.
void flash_attention_backward(Backend& be, Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t H,
                              int64_t KV, bool causal, Tensor workspace, int64_t vd = 0);

// The kernels over operands placed by a shape's strides (context parallelism: a piece of a
// sequence's queries at a causal offset into its gathered keys and values, each in a buffer of its
// own). Each tensor starts at its operand's first element and reaches as far as the strides say;
// lse is (B, H, Tq). With s.accumulate backward adds into dq, dk and dv. q, k, v, out and dout are
// bf16 when s.bf16 (else f32); lse, dq, dk, dv and the workspace f32.
struct FlashOperands {
  Tensor q, k, v, out, lse;
};
struct FlashGrads {
  Tensor dq, dk, dv, dout;
};
void flash_attention_forward(Backend& be, const FlashShape& s, const FlashOperands& x, Tensor workspace);
void flash_attention_backward(Backend& be, const FlashShape& s, const FlashOperands& x, const FlashGrads& d,
                              Tensor workspace);
// A partial result over other keys merged into (out, lse) through the log-sum-exp (context
// parallelism's ring): per query row, out = (out e^lse + part e^part_lse) / (e^lse + e^part_lse)
// and lse = log(e^lse + e^part_lse), in f32; a row whose part saw no key (part_lse = -inf) stays as
// it was, and one that had none takes the part. out and part laid out by s's o_ld and o_b; lse and
// part_lse (B, H, Tq).
void flash_attention_merge(Backend& be, const FlashShape& s, Tensor out, Tensor lse, Tensor part, Tensor part_lse);

// Decoding through the same kernel: the queries of qkv (B, T, (H + 2 KV) hd), at positions pos0 + t,
// over rows [0, pos0 + t] of k_cache and v_cache (B, S, KV hd), as ops::attention_cached
// (kv_cache.hpp) computes them. The workspace holds flash_cached_workspace_elems(...) floats.
void flash_attention_cached(Backend& be, Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t H, int64_t KV,
                            int64_t pos0, Tensor workspace);

}  // namespace shardlab::ops

namespace shardlab {
// The kernels' shape over a (B, T, (H + KV) hd + KV vd) [q | k | v] buffer and its (B, T, H vd)
// output (vd 0: hd).
FlashShape flash_shape_of_qkv(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal, int64_t vd = 0);
// Floats of workspace forward (backward = false) or backward needs: the shape's alone, on every device.
inline int64_t flash_attention_workspace_elems(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, bool backward,
                                               bool bf16 = false, int64_t vd = 0) {
  FlashShape s = flash_shape_of_qkv(B, T, H, KV, hd, true, vd);
  s.bf16 = bf16;
  return backward ? flash_backward_workspace_elems(s) : flash_forward_workspace_elems(s);
}
// The cached call's shape: T new queries over pos0 + T cached rows of a (B, S, KV hd) cache.
FlashShape flash_shape_of_cache(int64_t B, int64_t T, int64_t S, int64_t H, int64_t KV, int64_t hd, int64_t pos0);
// Its workspace: the forward tiles, then the lse (B, H, T), which decoding does not keep.
inline int64_t flash_cached_workspace_elems(int64_t B, int64_t T, int64_t S, int64_t H, int64_t KV, int64_t hd,
                                            int64_t pos0) {
  return flash_forward_workspace_elems(flash_shape_of_cache(B, T, S, H, KV, hd, pos0)) + B * H * T;
}
}  // namespace shardlab
