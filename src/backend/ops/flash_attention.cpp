// flash_attention.cpp — the fused attention family's checks and dispatch (flash_attention.hpp).
#include "src/backend/ops/flash_attention.hpp"

#include <cmath>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cuda/ops.hpp"
#include "src/backend/ops/kv_cache.hpp"

namespace shardlab::ops {
namespace {

// The calls' shape, checked: qkv (B, T, (H + 2 KV) hd), out (B, T, H hd), lse (B, H, T), all f32.
FlashShape flash_checked(const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t H, int64_t KV, bool causal,
                         const Tensor& workspace, bool backward, const char* op) {
  SHARD_CHECK(H > 0 && KV > 0 && H % KV == 0, "{}: {} query heads do not share {} K/V heads evenly", op, H, KV);
  SHARD_CHECK(qkv.ndim() == 3 && qkv.dim(2) % (H + 2 * KV) == 0, "{}: qkv {} must be (B, T, (H + 2 KV) hd), H={} KV={}",
              op, qkv.shape_str(), H, KV);
  const int64_t B = qkv.dim(0), T = qkv.dim(1), hd = qkv.dim(2) / (H + 2 * KV);
  SHARD_CHECK(hd > 0 && out.numel() == B * T * H * hd && lse.numel() == B * H * T, "{}: qkv {} out {} lse {} H={} KV={}",
              op, qkv.shape_str(), out.shape_str(), lse.shape_str(), H, KV);
  for (const Tensor* t : {&qkv, &out, &lse, &workspace})
    SHARD_CHECK(t->dtype() == DType::f32, "{}: f32 tensors expected, got {}", op, dtype_name(t->dtype()));
  const FlashShape s = flash_shape_of_qkv(B, T, H, KV, hd, causal);
  const int64_t need = backward ? flash_backward_workspace_elems(s) : flash_forward_workspace_elems(s);
  SHARD_CHECK(workspace.numel() >= need, "{}: workspace of {} < {} floats", op, workspace.numel(), need);
  return s;
}

// Forward on the backend's device; lse (B, H, Tq) and the tiles in device memory.
void forward_on(Backend& be, float* out, float* lse, const float* q, const float* k, const float* v, const FlashShape& s,
                float* tiles) {
  switch (be.device()) {
    case Device::cpu: return cpu::flash_attention_forward(out, lse, q, k, v, s, tiles);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::flash_attention_forward(be, out, lse, q, k, v, s);
      return;
    case Device::meta: return;
  }
}

}  // namespace

void flash_attention_forward(Backend& be, Tensor out, Tensor lse, Tensor qkv, int64_t H, int64_t KV, bool causal,
                             Tensor workspace) {
  const FlashShape s = flash_checked(qkv, out, lse, H, KV, causal, workspace, false, "flash_attention_forward");
  const float* q = qkv.ptr<float>();
  forward_on(be, out.ptr<float>(), lse.ptr<float>(), q, q + H * s.hd, q + (H + KV) * s.hd, s, workspace.ptr<float>());
}

void flash_attention_cached(Backend& be, Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t H, int64_t KV,
                            int64_t pos0, Tensor workspace) {
  const char* op = "flash_attention_cached";
  const auto [B, T, C, S] = kv_cached_shape(out, qkv, k_cache, v_cache, H, KV, pos0, op);
  const int64_t hd = C / H, need = flash_cached_workspace_elems(B, T, S, H, KV, hd, pos0);
  SHARD_CHECK(workspace.numel() >= need, "{}: workspace of {} < {} floats", op, workspace.numel(), need);
  const FlashShape s = flash_shape_of_cache(B, T, S, H, KV, hd, pos0);
  float* tiles = workspace.ptr<float>();
  const float* q = qkv.ptr<float>();
  forward_on(be, out.ptr<float>(), tiles + flash_forward_workspace_elems(s), q, k_cache.ptr<float>(),
             v_cache.ptr<float>(), s, tiles);
}

void flash_attention_backward(Backend& be, Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t H,
                              int64_t KV, bool causal, Tensor workspace) {
  const FlashShape s = flash_checked(qkv, out, lse, H, KV, causal, workspace, true, "flash_attention_backward");
  check_same_numel(dqkv, qkv, "flash_attention_backward");
  check_same_numel(dout, out, "flash_attention_backward");
  switch (be.device()) {
    case Device::cpu: {
      const float* q = qkv.ptr<float>();
      float* dq = dqkv.ptr<float>();
      return cpu::flash_attention_backward(dq, dq + H * s.hd, dq + (H + KV) * s.hd, dout.ptr<float>(), q, q + H * s.hd,
                                           q + (H + KV) * s.hd, out.ptr<float>(), lse.ptr<float>(), s,
                                           workspace.ptr<float>());
    }
    case Device::cuda:
      if constexpr (kWithCuda) cuda::flash_attention_backward(be, dqkv, dout, qkv, out, lse, workspace, s);
      return;
    case Device::meta: return;
  }
}

}  // namespace shardlab::ops

namespace shardlab {

FlashShape flash_shape_of_qkv(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal) {
  FlashShape s;
  s.B = B, s.Tq = T, s.Tk = T, s.H = H, s.KV = KV, s.hd = hd;
  s.q_ld = s.k_ld = s.v_ld = (H + 2 * KV) * hd;
  s.q_b = s.k_b = s.v_b = T * s.q_ld;
  s.o_ld = H * hd, s.o_b = T * H * hd;
  s.causal = causal;
  s.scale = 1.f / std::sqrt(static_cast<float>(hd));
  return s;
}

FlashShape flash_shape_of_cache(int64_t B, int64_t T, int64_t S, int64_t H, int64_t KV, int64_t hd, int64_t pos0) {
  FlashShape s = flash_shape_of_qkv(B, T, H, KV, hd, true);
  s.Tk = pos0 + T, s.offset = pos0;  // the new queries see the cache up to their own positions
  s.k_ld = s.v_ld = KV * hd;
  s.k_b = s.v_b = S * KV * hd;
  return s;
}

}  // namespace shardlab
