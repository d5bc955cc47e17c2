// flash_attention.hpp — the fused (flash) attention family: self-attention with grouped-query heads
// over the [q | k | v] buffer the layers write, causal or not, forward and backward, in O(T) memory
// (no (T, T) probabilities: attention.hpp's naive kernels keep them, and stay as the reference).
// Shapes, tiles and workspace: flash_shape.hpp. Conventions: ops/dispatch.hpp.
#pragma once
#include "src/backend/ops/dispatch.hpp"
#include "src/backend/ops/flash_shape.hpp"

namespace shardlab::ops {

// qkv (B, T, (H + 2 KV) hd) = [q | k | v] per row; out (B, T, H hd); lse (B, H, T) f32, each query
// row's log-sum-exp of its scores scaled by 1/sqrt(hd) (saved for backward; partial results merge
// with it). The workspace holds flash_attention_workspace_elems(..., false) floats.
void flash_attention_forward(Backend& be, Tensor out, Tensor lse, Tensor qkv, int64_t H, int64_t KV, bool causal,
                             Tensor workspace);
// dqkv (like qkv) is overwritten from dout and forward's qkv, out and lse; the workspace holds
// flash_attention_workspace_elems(..., true) floats.
void flash_attention_backward(Backend& be, Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t H,
                              int64_t KV, bool causal, Tensor workspace);

}  // namespace shardlab::ops

namespace shardlab {
// The kernels' shape over a (B, T, (H + 2 KV) hd) [q | k | v] buffer and its (B, T, H hd) output.
FlashShape flash_shape_of_qkv(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal);
// Floats of workspace forward (backward = false) or backward needs: the shape's alone, on every device.
inline int64_t flash_attention_workspace_elems(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, bool backward) {
  const FlashShape s = flash_shape_of_qkv(B, T, H, KV, hd, true);
  return backward ? flash_backward_workspace_elems(s) : flash_forward_workspace_elems(s);
}
}  // namespace shardlab
