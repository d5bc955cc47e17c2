// moe.cpp — the mixture-of-experts family's checks and dispatch (moe.hpp).
#include "src/backend/ops/moe.hpp"

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::ops {
namespace {

// (N, C) of out and (rows, C) of y, checked against k and w.
struct CombineShape {
  int64_t N, C, rows;
};
CombineShape combine_shape(const Tensor& out, const Tensor& y, const Tensor& w, int64_t k, const char* op) {
  SHARD_CHECK(out.ndim() == 2 && y.ndim() == 2 && out.dim(1) == y.dim(1) && k >= 1 &&
                  (w.data() == nullptr || w.numel() == out.dim(0) * k),
              "{}: out {} y {} w {} k={}", op, out.shape_str(), y.shape_str(), w.shape_str(), k);
  return {out.dim(0), out.dim(1), y.dim(0)};
}

}  // namespace

void moe_gather(Backend& be, Tensor dst, Tensor src, const int32_t* token_of) {
  SHARD_CHECK(dst.ndim() == 2 && src.ndim() == 2 && dst.dim(1) == src.dim(1), "moe_gather: dst {} src {}",
              dst.shape_str(), src.shape_str());
  const int64_t rows = dst.dim(0), N = src.dim(0), C = src.dim(1);
  switch (be.device()) {
    case Device::cpu: return cpu::moe_gather(dst.ptr<float>(), src.ptr<float>(), token_of, rows, N, C);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::moe_gather(be, dst, src, token_of, rows, C);
      return;
    case Device::meta:
      return charge(be, {.name = "moe_gather", .bytes = pass_bytes(rows * C, 1, 1)},
                    [&] { return cuda::moe_gather_launches(rows, C); });
  }
}

void moe_combine(Backend& be, Tensor out, Tensor y, const int32_t* pos, Tensor w, int64_t k, bool accumulate) {
  const CombineShape s = combine_shape(out, y, w, k, "moe_combine");
  switch (be.device()) {
    case Device::cpu:
      return cpu::moe_combine(out.ptr<float>(), y.ptr<float>(), pos, f32_or_null(w), s.N, k, s.C, s.rows, accumulate);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::moe_combine(be, out, y, pos, w, s.N, k, s.C, accumulate);
      return;
    case Device::meta:
      return charge(be,
                    {.name = "moe_combine",
                     .flops = 2.0 * s.N * k * s.C,
                     .bytes = pass_bytes(s.N * k * s.C, 1, 0) + pass_bytes(s.N * s.C, accumulate ? 1 : 0, 1)},
                    [&] { return cuda::moe_combine_launches(s.N, k, s.C, accumulate); });
  }
}

void moe_combine_backward(Backend& be, Tensor dy, Tensor dw, Tensor dout, Tensor y, const int32_t* pos, Tensor w,
                          int64_t k) {
  const CombineShape s = combine_shape(dout, y, w, k, "moe_combine_backward");
  SHARD_CHECK(w.data() != nullptr && dw.numel() == s.N * k && dy.ndim() == 2 && dy.dim(0) == s.rows &&
                  dy.dim(1) == s.C,
              "moe_combine_backward: dy {} dw {} for dout {} y {} k={}", dy.shape_str(), dw.shape_str(),
              dout.shape_str(), y.shape_str(), k);
  switch (be.device()) {
    case Device::cpu:
      return cpu::moe_combine_backward(dy.ptr<float>(), dw.ptr<float>(), dout.ptr<float>(), y.ptr<float>(), pos,
                                       w.ptr<float>(), s.N, k, s.C, s.rows);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::moe_combine_backward(be, dy, dw, dout, y, pos, w, s.N, k, s.C);
      return;
    case Device::meta:
      return charge(be,
                    {.name = "moe_combine_backward",
                     .flops = 4.0 * s.N * k * s.C,
                     .bytes = pass_bytes(s.N * k * s.C, 1, 1) + pass_bytes(s.N * s.C, 1, 0)},
                    [&] { return cuda::moe_combine_backward_launches(s.N, k, s.C); });
  }
}

}  // namespace shardlab::ops
