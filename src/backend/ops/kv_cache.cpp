// kv_cache.cpp — the KV cache family's checks and dispatch (kv_cache.hpp).
#include "src/backend/ops/kv_cache.hpp"

#include <array>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::ops {

std::array<int64_t, 4> kv_cached_shape(const Tensor& out, const Tensor& qkv, const Tensor& k_cache,
                                       const Tensor& v_cache, int64_t H, int64_t KV, int64_t pos0, const char* op) {
  SHARD_CHECK(H > 0 && KV > 0 && H % KV == 0, "{}: {} query heads do not share {} K/V heads evenly", op, H, KV);
  SHARD_CHECK(qkv.ndim() == 3 && qkv.dim(2) % (H + 2 * KV) == 0, "{}: qkv {} must be (B, T, (H + 2 KV) hd), H={} KV={}",
              op, qkv.shape_str(), H, KV);
  const int64_t B = qkv.dim(0), T = qkv.dim(1), hd = qkv.dim(2) / (H + 2 * KV), C = H * hd;
  const bool cache_ok = k_cache.ndim() == 3 && k_cache.dim(0) == B && k_cache.dim(2) == KV * hd &&
                        v_cache.ndim() == 3 && v_cache.dim(0) == B && v_cache.dim(1) == k_cache.dim(1) &&
                        v_cache.dim(2) == KV * hd;
  SHARD_CHECK(hd > 0 && cache_ok && pos0 >= 0 && pos0 + T <= k_cache.dim(1) &&
                  (out.data() == nullptr || out.numel() == B * T * C),
              "{}: qkv {} out {} k_cache {} v_cache {} must be (B, T, (H + 2 KV) hd), (B, T, H hd) and (B, S, KV hd) "
              "with pos0 + T <= S; H={} KV={} pos0={}",
              op, qkv.shape_str(), out.shape_str(), k_cache.shape_str(), v_cache.shape_str(), H, KV, pos0);
  return {B, T, C, k_cache.dim(1)};
}

void kv_cache_write(Backend& be, Tensor k_cache, Tensor v_cache, Tensor qkv, int64_t H, int64_t KV, int64_t pos0) {
  const auto [B, T, C, S] = kv_cached_shape(Tensor(), qkv, k_cache, v_cache, H, KV, pos0, "kv_cache_write");
  switch (be.device()) {
    case Device::cpu:
      return cpu::kv_cache_write(k_cache.ptr<float>(), v_cache.ptr<float>(), qkv.ptr<float>(), B, T, S, H, KV, C / H,
                                 pos0);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::kv_cache_write(be, k_cache, v_cache, qkv, H, KV, pos0, B, T, C, S);
      return;
    case Device::meta:
      return charge(be, {.name = "kv_cache_write", .bytes = pass_bytes(2 * B * T * (C / H) * KV, 1, 1)},
                    [&] { return cuda::kv_cache_write_launches(H, KV, pos0, B, T, C, S); });
  }
}

void attention_cached(Backend& be, Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t H, int64_t KV,
                      int64_t pos0) {
  const auto [B, T, C, S] = kv_cached_shape(out, qkv, k_cache, v_cache, H, KV, pos0, "attention_cached");
  switch (be.device()) {
    case Device::cpu:
      return cpu::attention_cached(out.ptr<float>(), qkv.ptr<float>(), k_cache.ptr<float>(), v_cache.ptr<float>(), B,
                                   T, S, H, KV, C / H, pos0);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::attention_cached(be, out, qkv, k_cache, v_cache, H, KV, pos0, B, T, C, S);
      return;
    case Device::meta:
      return charge(be,
                    {.name = "attention_cached",
                     .flops = 4.0 * B * T * (pos0 + T) * C,
                     .bytes = pass_bytes(2 * B * (pos0 + T) * (C / H) * KV, 1, 0) + pass_bytes(B * T * C, 2, 1)},
                    [&] { return cuda::attention_cached_launches(H, KV, pos0, B, T, C, S); });
  }
}

void copy_rows(Backend& be, Tensor dst, int64_t dst_ld, Tensor src, int64_t src_ld, int64_t rows, int64_t width) {
  SHARD_CHECK(dst.dtype() == DType::f32 && src.dtype() == DType::f32, "copy_rows: f32 tensors expected, got {} and {}",
              dtype_name(dst.dtype()), dtype_name(src.dtype()));
  SHARD_CHECK(rows >= 0 && width >= 0 && width <= dst_ld && width <= src_ld, "copy_rows: {} rows of {} with strides {} "
              "and {}", rows, width, dst_ld, src_ld);
  if (rows == 0 || width == 0) return;
  SHARD_CHECK(dst.numel() >= (rows - 1) * dst_ld + width && src.numel() >= (rows - 1) * src_ld + width,
              "copy_rows: {} rows of {} (strides {}, {}) reach past dst {} or src {}", rows, width, dst_ld, src_ld,
              dst.numel(), src.numel());
  switch (be.device()) {
    case Device::cpu: return cpu::copy_rows(dst.ptr<float>(), dst_ld, src.ptr<float>(), src_ld, rows, width);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::copy_rows(be, dst.ptr<float>(), dst_ld, src.ptr<float>(), src_ld, rows, width);
      return;
    case Device::meta:
      return charge(be, {.name = "copy_rows", .bytes = pass_bytes(rows * width, 1, 1)},
                    [&] { return cuda::copy_rows_launches(dst_ld, src_ld, rows, width); });
  }
}

}  // namespace shardlab::ops
