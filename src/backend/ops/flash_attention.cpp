// flash_attention.cpp — the fused attention family's checks and dispatch (flash_attention.hpp).
#include "src/backend/ops/flash_attention.hpp"

#include <cmath>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/ops/attention.hpp"
#include "src/backend/cuda/ops.hpp"
#include "src/backend/ops/kv_cache.hpp"

namespace shardlab::ops {
namespace {

// The inputs' dtype: f32, or bf16 (FlashShape::bf16).
bool bf16_inputs(const Tensor& t, const char* op, const char* name) {
  SHARD_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, "{}: {} must be f32 or bf16, got {}", op, name,
              dtype_name(t.dtype()));
  return t.dtype() == DType::bf16;
}

// Element `i` of t's buffer (of t's dtype), untyped: the kernels read f32 or bf16 by the shape.
const void* at(const Tensor& t, int64_t i) {
  return static_cast<const char*>(t.data()) + i * static_cast<int64_t>(dtype_size(t.dtype()));
}

// The calls' shape, checked: qkv (B, T, (H + KV) hd + KV vd) and out (B, T, H vd) both f32 or both
// bf16, lse (B, H, T) and the workspace f32.
FlashShape flash_checked(const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t H, int64_t KV, int64_t v,
                         bool causal, const Tensor& workspace, bool backward, const char* op) {
  const auto [hd, vd] = packed_head_dims(qkv, H, KV, v, op);
  const int64_t B = qkv.dim(0), T = qkv.dim(1);
  SHARD_CHECK(out.numel() == B * T * H * vd && lse.numel() == B * H * T, "{}: qkv {} out {} lse {} H={} KV={} vd={}",
              op, qkv.shape_str(), out.shape_str(), lse.shape_str(), H, KV, vd);
  const bool bf16 = bf16_inputs(qkv, op, "qkv");
  SHARD_CHECK(out.dtype() == qkv.dtype(), "{}: out is {} and qkv {}: the same dtype expected", op,
              dtype_name(out.dtype()), dtype_name(qkv.dtype()));
  for (const Tensor* t : {&lse, &workspace})
    SHARD_CHECK(t->dtype() == DType::f32, "{}: lse and the workspace must be f32, got {}", op, dtype_name(t->dtype()));
  FlashShape s = flash_shape_of_qkv(B, T, H, KV, hd, causal, vd);
  s.bf16 = bf16;
  const int64_t need = backward ? flash_backward_workspace_elems(s) : flash_forward_workspace_elems(s);
  SHARD_CHECK(workspace.numel() >= need, "{}: workspace of {} < {} floats", op, workspace.numel(), need);
  return s;
}

// The fused attention's cost: its products over the scores the mask leaves (about half under a
// causal mask) on vector units (the kernels compute in f32), backward 2.5x forward (it recomputes
// the scores: five products for two); q, k, v, out (and dout) read or written once each, lse, and
// backward's D (a float per query row and head, written and read).
OpCost flash_cost(const FlashShape& s, bool backward) {
  const double elem = s.bf16 ? 2 : 4, seen = s.causal ? 0.5 : 1.0;
  const double scores = static_cast<double>(s.B) * s.H * s.Tq * s.Tk * seen;
  const double vd = static_cast<double>(flash_vd(s)), hd = static_cast<double>(s.hd);
  const double q = static_cast<double>(s.B) * s.Tq * s.H * hd, o = static_cast<double>(s.B) * s.Tq * s.H * vd;
  const double kv = static_cast<double>(s.B) * s.Tk * s.KV * (hd + vd);
  const double lse = 4.0 * s.B * s.H * s.Tq;
  OpCost c{.name = backward ? "flash_attention_backward" : "flash_attention_forward",
           .flops = (backward ? 2.5 : 1.0) * (2.0 * scores * (hd + vd) + 5.0 * scores)};
  // forward: q, k, v in, out and lse out; backward: q, k, v, out, dout and lse in, D, dq, dk, dv (f32) out.
  c.bytes = backward ? (q + 2 * o + kv) * elem + 3 * lse + (q + kv) * 4 : (q + o + kv) * elem + lse;
  return c;
}

// Forward on the backend's device; lse (B, H, Tq) and the tiles in device memory; out, q, k and v
// of the shape's input dtype.
void forward_on(Backend& be, void* out, float* lse, const void* q, const void* k, const void* v, const FlashShape& s,
                float* tiles) {
  switch (be.device()) {
    case Device::cpu: return cpu::flash_attention_forward(out, lse, q, k, v, s, tiles);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::flash_attention_forward(be, out, lse, q, k, v, s);
      return;
    case Device::meta:
      return charge(be, flash_cost(s, false), [&] { return cuda::flash_attention_forward_launches(s); });
  }
}

// Backward on the backend's device; D in the workspace's tail.
void backward_on(Backend& be, float* dq, float* dk, float* dv, const void* dout, const void* q, const void* k,
                 const void* v, const void* out, const float* lse, const FlashShape& s, float* workspace) {
  switch (be.device()) {
    case Device::cpu: return cpu::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s, workspace);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::flash_attention_backward(be, dq, dk, dv, dout, q, k, v, out, lse, workspace, s);
      return;
    case Device::meta:
      return charge(be, flash_cost(s, true), [&] { return cuda::flash_attention_backward_launches(s); });
  }
}

// Elements a strided (B, rows, width) operand spans from its first: the last row's end.
int64_t span_of(int64_t B, int64_t b_stride, int64_t rows, int64_t ld, int64_t width) {
  return B == 0 || rows == 0 ? 0 : (B - 1) * b_stride + (rows - 1) * ld + width;
}

// The shape-level calls' operands against the shape, each holding what its strides reach: q, k, v
// and out of the shape's input dtype (`grads`: dq, dk and dv f32, dout of the input dtype), lse and
// the workspace f32.
void check_operands(const FlashShape& s, const FlashOperands& x, const Tensor& workspace, bool backward, bool grads,
                    const char* op) {
  SHARD_CHECK(s.H > 0 && s.KV > 0 && s.H % s.KV == 0 && s.hd > 0 && s.vd >= 0, "{}: H={} KV={} hd={} vd={}", op, s.H,
              s.KV, s.hd, s.vd);
  const int64_t vd = flash_vd(s);
  const DType in = s.bf16 ? DType::bf16 : DType::f32, qkv = grads ? DType::f32 : in;
  const struct {
    const Tensor* t;
    const char* name;
    int64_t need;
    DType dtype;
  } rows[] = {{&x.q, grads ? "dq" : "q", span_of(s.B, s.q_b, s.Tq, s.q_ld, s.H * s.hd), qkv},
              {&x.k, grads ? "dk" : "k", span_of(s.B, s.k_b, s.Tk, s.k_ld, s.KV * s.hd), qkv},
              {&x.v, grads ? "dv" : "v", span_of(s.B, s.v_b, s.Tk, s.v_ld, s.KV * vd), qkv},
              {&x.out, grads ? "dout" : "out", span_of(s.B, s.o_b, s.Tq, s.o_ld, s.H * vd), in},
              {&x.lse, "lse", s.B * s.H * s.Tq, DType::f32},
              {&workspace, "workspace",
               backward ? flash_backward_workspace_elems(s) : flash_forward_workspace_elems(s), DType::f32}};
  for (const auto& r : rows) {
    SHARD_CHECK(r.t->dtype() == r.dtype, "{}: {} must be {}, got {}", op, r.name, dtype_name(r.dtype),
                dtype_name(r.t->dtype()));
    SHARD_CHECK(r.t->numel() >= r.need, "{}: {} holds {} elements, the shape reaches {} (B={} Tq={} Tk={} H={} KV={} "
                "hd={})", op, r.name, r.t->numel(), r.need, s.B, s.Tq, s.Tk, s.H, s.KV, s.hd);
  }
}

}  // namespace

void flash_attention_forward(Backend& be, Tensor out, Tensor lse, Tensor qkv, int64_t H, int64_t KV, bool causal,
                             Tensor workspace, int64_t vd) {
  const FlashShape s = flash_checked(qkv, out, lse, H, KV, vd, causal, workspace, false, "flash_attention_forward");
  forward_on(be, out.data(), lse.ptr<float>(), at(qkv, 0), at(qkv, H * s.hd), at(qkv, (H + KV) * s.hd), s,
             workspace.ptr<float>());
}

void flash_attention_cached(Backend& be, Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t H, int64_t KV,
                            int64_t pos0, Tensor workspace) {
  const char* op = "flash_attention_cached";
  const auto [B, T, C, S] = kv_cached_shape(out, qkv, k_cache, v_cache, H, KV, pos0, op);
  const int64_t hd = C / H, need = flash_cached_workspace_elems(B, T, S, H, KV, hd, pos0);
  SHARD_CHECK(workspace.numel() >= need, "{}: workspace of {} < {} floats", op, workspace.numel(), need);
  const FlashShape s = flash_shape_of_cache(B, T, S, H, KV, hd, pos0);
  float* tiles = workspace.ptr<float>();
  forward_on(be, out.ptr<float>(), tiles + flash_forward_workspace_elems(s), qkv.ptr<float>(), k_cache.ptr<float>(),
             v_cache.ptr<float>(), s, tiles);
}

void flash_attention_backward(Backend& be, Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t H,
                              int64_t KV, bool causal, Tensor workspace, int64_t vd) {
  const char* op = "flash_attention_backward";
  const FlashShape s = flash_checked(qkv, out, lse, H, KV, vd, causal, workspace, true, op);
  check_same_numel(dqkv, qkv, op);
  check_same_numel(dout, out, op);
  SHARD_CHECK(dqkv.dtype() == DType::f32 && dout.dtype() == qkv.dtype(),
              "{}: dqkv must be f32 and dout of qkv's dtype ({}), got {} and {}", op, dtype_name(qkv.dtype()),
              dtype_name(dqkv.dtype()), dtype_name(dout.dtype()));
  float* dq = dqkv.ptr<float>();
  backward_on(be, dq, dq + H * s.hd, dq + (H + KV) * s.hd, dout.data(), at(qkv, 0), at(qkv, H * s.hd),
              at(qkv, (H + KV) * s.hd), out.data(), lse.ptr<float>(), s, workspace.ptr<float>());
}

void flash_attention_forward(Backend& be, const FlashShape& s, const FlashOperands& x, Tensor workspace) {
  check_operands(s, x, workspace, false, false, "flash_attention_forward (shape)");
  forward_on(be, x.out.data(), x.lse.ptr<float>(), x.q.data(), x.k.data(), x.v.data(), s, workspace.ptr<float>());
}

void flash_attention_merge(Backend& be, const FlashShape& s, Tensor out, Tensor lse, Tensor part, Tensor part_lse) {
  const char* op = "flash_attention_merge";
  const int64_t rows = span_of(s.B, s.o_b, s.Tq, s.o_ld, s.H * flash_vd(s)), lses = s.B * s.H * s.Tq;
  for (const Tensor* t : {&out, &lse, &part, &part_lse})
    SHARD_CHECK(t->dtype() == DType::f32, "{}: f32 tensors expected, got {}", op, dtype_name(t->dtype()));
  SHARD_CHECK(out.numel() >= rows && part.numel() >= rows && lse.numel() >= lses && part_lse.numel() >= lses,
              "{}: out {} part {} (need {}), lse {} part_lse {} (need {})", op, out.numel(), part.numel(), rows,
              lse.numel(), part_lse.numel(), lses);
  switch (be.device()) {
    case Device::cpu:
      return cpu::flash_attention_merge(out.ptr<float>(), lse.ptr<float>(), part.ptr<float>(), part_lse.ptr<float>(), s);
    case Device::cuda:
      if constexpr (kWithCuda)
        cuda::flash_attention_merge(be, out.ptr<float>(), lse.ptr<float>(), part.ptr<float>(), part_lse.ptr<float>(), s);
      return;
    case Device::meta:
      return charge(be,
                    {.name = "flash_attention_merge",
                     .flops = 6.0 * rows,
                     .bytes = pass_bytes(rows, 2, 1) + pass_bytes(lses, 2, 1)},
                    [&] { return cuda::flash_attention_merge_launches(s); });
  }
}

void flash_attention_backward(Backend& be, const FlashShape& s, const FlashOperands& x, const FlashGrads& d,
                              Tensor workspace) {
  const char* op = "flash_attention_backward (shape)";
  check_operands(s, x, workspace, true, false, op);
  check_operands(s, {d.dq, d.dk, d.dv, d.dout, x.lse}, workspace, true, true, op);
  backward_on(be, d.dq.ptr<float>(), d.dk.ptr<float>(), d.dv.ptr<float>(), d.dout.data(), x.q.data(), x.k.data(),
              x.v.data(), x.out.data(), x.lse.ptr<float>(), s, workspace.ptr<float>());
}

}  // namespace shardlab::ops

namespace shardlab {

FlashShape flash_shape_of_qkv(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal, int64_t vd) {
  FlashShape s;
  s.B = B, s.Tq = T, s.Tk = T, s.H = H, s.KV = KV, s.hd = hd, s.vd = vd == hd ? 0 : vd;
  const int64_t v = flash_vd(s);
  s.q_ld = s.k_ld = s.v_ld = (H + KV) * hd + KV * v;
  s.q_b = s.k_b = s.v_b = T * s.q_ld;
  s.o_ld = H * v, s.o_b = T * H * v;
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
