// cudnn_attention.hpp — causal self-attention through cuDNN's fused SDPA (flash-style, on tensor
// cores; --attention cudnn), over the same [q | k | v] buffer and with the same saved tensors as the
// fused family (flash_attention.hpp): out (B, T, H hd) and lse (B, H, T), the natural-log
// log-sum-exp of each query row's scores scaled by 1/sqrt(hd).
//
// cuDNN reads and writes bf16: the layers' f32 q, k and v are rounded to bf16 in the workspace
// first (one cast), and the output comes back to f32 (another); backward rounds qkv, out and dout
// again (nothing more is saved) and widens cuDNN's bf16 dq, dk and dv into dqkv. Products and
// sums are f32 inside cuDNN. The results differ from the f32 kernels' by bf16 rounding, so it is
// a choice of its own, as PyTorch's cuDNN backend of scaled_dot_product_attention is.
//
// Only on CUDA, where the build found cuDNN and the cudnn-frontend headers (CMake's
// SHARDLAB_CUDNN; scripts/fetch-cudnn-frontend.sh): the CPU case refuses, the meta case charges
// the casts and cuDNN's kernels to the cost ledger (so profile --time prices it without a GPU).
// Query and key heads of one size (no separate value head dimension), hd a multiple of 8 up to
// kCudnnMaxHeadDim, grouped-query heads allowed. cuDNN's own workspace is device memory outside
// the Pool, as cuBLAS's is.
#pragma once
#include "src/backend/ops/dispatch.hpp"
#include "src/backend/ops/flash_shape.hpp"

namespace shardlab {
inline constexpr int64_t kCudnnMaxHeadDim = 128;
// Whether this binary can run it on a GPU (built with cuDNN and the frontend headers).
bool cudnn_attention_built();
// Why --attention cudnn cannot run (empty when it can), as the message to stop with: on the CPU;
// on CUDA in a binary without cuDNN (this_binary; the meta backend and a prediction for CUDA need
// none); heads of hd (queries, keys) and vd (values, 0: hd) it is not built for. `what` names the
// model in that last message (empty: not named).
std::string cudnn_attention_refusal(Device device, bool this_binary, int64_t hd, int64_t vd,
                                    const std::string& what = {});
// Floats of workspace forward (backward = false) or backward needs: the bf16 copies of qkv and out
// (and, backward, of dout and dqkv), each region 256-byte aligned.
int64_t cudnn_attention_workspace_elems(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, bool backward);
}  // namespace shardlab

namespace shardlab::ops {
// qkv (B, T, (H + 2 KV) hd), out (B, T, H hd), each f32 or bf16 (a bf16 one read or written where
// it is; an f32 one through the workspace), lse (B, H, T) f32.
void cudnn_attention_forward(Backend& be, Tensor out, Tensor lse, Tensor qkv, int64_t H, int64_t KV,
                             Tensor workspace);
// dqkv (like qkv; f32, or bf16 written where it is) is overwritten from dout (f32 or bf16, read where
// it is) and forward's qkv, out (f32 or bf16, as forward's) and lse.
void cudnn_attention_backward(Backend& be, Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t H,
                              int64_t KV, Tensor workspace);
}  // namespace shardlab::ops
