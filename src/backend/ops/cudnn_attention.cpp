// cudnn_attention.cpp — cuDNN attention's checks, workspace and dispatch (cudnn_attention.hpp).
#include "src/backend/ops/cudnn_attention.hpp"

#include <cmath>

#include "src/backend/cuda/ops.hpp"
#include "src/backend/ops/flash_attention.hpp"
#include "src/backend/ops/attention.hpp"

namespace shardlab {

std::string cudnn_attention_refusal(Device device, bool this_binary, int64_t hd, int64_t vd,
                                    const std::string& what) {
  if (device == Device::cpu)
    return "--attention cudnn runs on CUDA devices (cuDNN's fused attention); on the CPU use --attention flash";
  if (device == Device::cuda && this_binary && !cudnn_attention_built())
    return "--attention cudnn: this shardlab was built without cuDNN attention (CMake found no cuDNN or no "
           "cudnn-frontend headers: scripts/fetch-cudnn-frontend.sh build/cudnn-frontend, then configure again); "
           "use --attention flash";
  std::string heads;
  if (vd > 0 && vd != hd)
    heads = fmt::format("values of {} channels a head beside queries and keys of {} (cuDNN attention is built here "
                        "for one head dimension)", vd, hd);
  else if (hd % 8 != 0 || hd < 8 || hd > kCudnnMaxHeadDim)
    heads = fmt::format("a head dimension of {} (cuDNN's fused attention takes multiples of 8 up to {})", hd,
                        kCudnnMaxHeadDim);
  if (heads.empty()) return {};
  return fmt::format("--attention cudnn{}{}: {}; use --attention flash", what.empty() ? "" : " with ", what, heads);
}

namespace {
// Bytes of the workspace's bf16 regions, each rounded up to 256 bytes: qkv, out (and backward:
// dout, dqkv).
struct CudnnRegions {
  int64_t qkv = 0, out = 0;  // bytes of one region
  static int64_t round(int64_t bytes) { return (bytes + 255) / 256 * 256; }
  int64_t total(bool backward) const { return backward ? 2 * (qkv + out) : qkv + out; }
};
CudnnRegions regions(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd) {
  return {CudnnRegions::round(2 * B * T * (H + 2 * KV) * hd), CudnnRegions::round(2 * B * T * H * hd)};
}
}  // namespace

int64_t cudnn_attention_workspace_elems(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, bool backward) {
  return regions(B, T, H, KV, hd).total(backward) / 4;
}

}  // namespace shardlab

namespace shardlab::ops {
namespace {

// The calls' shape, checked: qkv (B, T, (H + 2 KV) hd), out (B, T, H hd), lse (B, H, T); qkv and
// out f32 or bf16 (as cuDNN reads them: used where they are, no copy), lse and workspace f32.
FlashShape cudnn_checked(Backend& be, const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t H, int64_t KV,
                         const Tensor& workspace, bool backward, const char* op) {
  const auto [hd, vd] = packed_head_dims(qkv, H, KV, 0, op);
  const std::string why = cudnn_attention_refusal(be.device(), true, hd, vd);
  if (!why.empty()) throw InputError(why);
  const int64_t B = qkv.dim(0), T = qkv.dim(1);
  SHARD_CHECK(out.numel() == B * T * H * hd && lse.numel() == B * H * T, "{}: qkv {} out {} lse {} H={} KV={}", op,
              qkv.shape_str(), out.shape_str(), lse.shape_str(), H, KV);
  for (const Tensor* t : {&lse, &workspace})
    SHARD_CHECK(t->dtype() == DType::f32, "{}: f32 lse and workspace expected, got {}", op, dtype_name(t->dtype()));
  for (const Tensor* t : {&qkv, &out})
    SHARD_CHECK(t->dtype() == DType::f32 || t->dtype() == DType::bf16, "{}: f32 or bf16 qkv and out expected, got {}",
                op, dtype_name(t->dtype()));
  const int64_t need = cudnn_attention_workspace_elems(B, T, H, KV, hd, backward);
  SHARD_CHECK(workspace.numel() >= need, "{}: workspace of {} < {} floats", op, workspace.numel(), need);
  return flash_shape_of_qkv(B, T, H, KV, hd, true);
}

// n bf16 elements at byte `at` of the workspace.
Tensor region(const Tensor& workspace, int64_t at, int64_t n) {
  return Tensor::flat(static_cast<char*>(workspace.data()) + at, DType::bf16, n, workspace.device());
}

// Where cuDNN reads or writes t: t itself when bf16, else the workspace's bf16 region at `at`.
Tensor bf16_at(const Tensor& t, const Tensor& workspace, int64_t at) {
  return t.dtype() == DType::bf16 ? t : region(workspace, at, t.numel());
}
// An input t as cuDNN reads it: bf16_at, an f32 t rounded into its region first.
Tensor as_bf16(Backend& be, const Tensor& t, const Tensor& workspace, int64_t at) {
  const Tensor r = bf16_at(t, workspace, at);
  if (t.dtype() != DType::bf16) be.cast(r, t);
  return r;
}

// cuDNN's products on tensor cores over the scores the causal mask leaves (about half): forward
// two (q k^T, p v), backward five (the scores again, dv, dp, dq, dk), 2 B H T^2 hd FLOPs for each
// whole product. Bytes: forward reads q, k, v and writes out and lse (bf16 but lse); backward reads
// q, k, v, out, dout, lse and writes dq, dk, dv (bf16), plus cuDNN's f32 dq accumulator and a
// float per query row, each written and read.
OpCost cudnn_cost(const FlashShape& s, bool backward) {
  const double scores = static_cast<double>(s.B) * s.H * s.Tq * s.Tk * (s.causal ? 0.5 : 1.0);
  const double hd = static_cast<double>(s.hd);
  const double q = static_cast<double>(s.B) * s.Tq * s.H * hd, kv = 2.0 * s.B * s.Tk * s.KV * hd;
  const double rows = static_cast<double>(s.B) * s.H * s.Tq;
  OpCost c{.name = backward ? "cudnn_attention_backward" : "cudnn_attention_forward",
           .flops = (backward ? 2.5 : 1.0) * 5.0 * scores,  // the softmax's exponentials and scaling
           .tensor_flops = (backward ? 5.0 : 2.0) * 2.0 * scores * hd};
  if (backward) {
    const double read = 2 * (q + kv) + 2 * 2 * q + 4 * rows;  // q, k, v, out, dout (bf16), lse
    const double written = 2 * (q + kv);                      // dq, dk, dv (bf16)
    const double own = 2 * (4 * q + 4 * rows);                // dq's f32 accumulator, a float a row: out and in
    c.bytes = read + written + own;
  } else {
    c.bytes = 2 * (q + kv) + 2 * q + 4 * rows;  // q, k, v in, out (bf16) and lse out
  }
  return c;
}

}  // namespace

void cudnn_attention_forward(Backend& be, Tensor out, Tensor lse, Tensor qkv, int64_t H, int64_t KV,
                             Tensor workspace) {
  const char* op = "cudnn_attention_forward";
  const FlashShape s = cudnn_checked(be, qkv, out, lse, H, KV, workspace, false, op);
  const CudnnRegions r = regions(s.B, s.Tq, H, KV, s.hd);
  const Tensor qkv16 = as_bf16(be, qkv, workspace, 0);
  const Tensor out16 = bf16_at(out, workspace, r.qkv);
  switch (be.device()) {
    case Device::cpu: break;  // refused by cudnn_checked
    case Device::cuda:
      if constexpr (kWithCuda) cuda::cudnn_attention_forward(be, out16.data(), lse.ptr<float>(), qkv16.data(), s);
      break;
    case Device::meta:
      charge(be, cudnn_cost(s, false), [&] { return cuda::cudnn_attention_launches(false); });
      break;
  }
  if (out.dtype() != DType::bf16) be.cast(out, out16);
}

void cudnn_attention_backward(Backend& be, Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t H,
                              int64_t KV, Tensor workspace) {
  const char* op = "cudnn_attention_backward";
  const FlashShape s = cudnn_checked(be, qkv, out, lse, H, KV, workspace, true, op);
  check_same_numel(dqkv, qkv, op);
  check_same_numel(dout, out, op);
  for (const Tensor* t : {&dqkv, &dout})
    SHARD_CHECK(t->dtype() == DType::f32 || t->dtype() == DType::bf16, "{}: f32 or bf16 dqkv and dout expected, got {}",
                op, dtype_name(t->dtype()));
  const CudnnRegions r = regions(s.B, s.Tq, H, KV, s.hd);
  const Tensor qkv16 = as_bf16(be, qkv, workspace, 0), out16 = as_bf16(be, out, workspace, r.qkv);
  const Tensor dout16 = as_bf16(be, dout, workspace, r.qkv + r.out);
  const Tensor dqkv16 = bf16_at(dqkv, workspace, r.qkv + 2 * r.out);
  switch (be.device()) {
    case Device::cpu: break;
    case Device::cuda:
      if constexpr (kWithCuda)
        cuda::cudnn_attention_backward(be, dqkv16.data(), dout16.data(), qkv16.data(), out16.data(), lse.ptr<float>(),
                                       s);
      break;
    case Device::meta:
      charge(be, cudnn_cost(s, true), [&] { return cuda::cudnn_attention_launches(true); });
      break;
  }
  if (dqkv.dtype() != DType::bf16) be.cast(dqkv, dqkv16);
}

}  // namespace shardlab::ops
