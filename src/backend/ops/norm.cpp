// norm.cpp — the normalisation family's checks and dispatch (norm.hpp).
#include "src/backend/ops/norm.hpp"

#include <algorithm>
#include <array>
#include <vector>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::ops {
namespace {

// N rows of C in out and inp, C weights and biases, N statistics; returns {N, C}.
std::array<int64_t, 2> layernorm_shape(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                       const Tensor& weight, const Tensor& bias, const char* op) {
  const int64_t C = weight.numel(), N = C > 0 ? inp.numel() / C : 0;
  SHARD_CHECK(C > 0 && inp.numel() == N * C && out.numel() == N * C && mean.numel() == N && rstd.numel() == N &&
                  bias.numel() == C,
              "{}: inp {} out {} mean {} rstd {} weight {} bias {}", op, inp.shape_str(), out.shape_str(),
              mean.shape_str(), rstd.shape_str(), weight.shape_str(), bias.shape_str());
  return {N, C};
}

std::array<int64_t, 2> rmsnorm_shape(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                                     const char* op) {
  const int64_t C = weight.numel(), N = C > 0 ? inp.numel() / C : 0;
  SHARD_CHECK(C > 0 && inp.numel() == N * C && out.numel() == N * C && rstd.numel() == N,
              "{}: inp {} out {} rstd {} weight {}", op, inp.shape_str(), out.shape_str(), rstd.shape_str(),
              weight.shape_str());
  return {N, C};
}

// A forward's output: f32, or bf16 (its products' operand, computed in f32 and rounded once).
void check_norm_out(const Tensor& out, const char* op) {
  SHARD_CHECK(out.dtype() == DType::f32 || out.dtype() == DType::bf16, "{}: f32 or bf16 out expected, got {}", op,
              dtype_name(out.dtype()));
}

// An optional bf16 companion of `like` (same element count), or nothing.
void check_optional_bf16(const Tensor& t, const Tensor& like, const char* what) {
  if (!t.data()) return;
  SHARD_CHECK(t.dtype() == DType::bf16 && t.numel() == like.numel(), "{}: bf16 of {} elements expected, got {} {}",
              what, like.numel(), dtype_name(t.dtype()), t.shape_str());
}

// A norm backward's options (norm.hpp): inp f32 or bf16, dinp_from f32 like dinp, dinp_bf16 bf16.
void check_backward_forms(const Tensor& dinp, const Tensor& inp, const Tensor& dinp_from, const Tensor& dinp_bf16,
                          const char* op) {
  SHARD_CHECK(inp.dtype() == DType::f32 || inp.dtype() == DType::bf16, "{}: f32 or bf16 inp, got {}", op,
              dtype_name(inp.dtype()));
  if (dinp_from.data()) {
    check_f32(dinp_from, op);
    check_same_numel(dinp_from, dinp, op);
  }
  check_optional_bf16(dinp_bf16, dinp, op);
}

// The CPU's backward with those forms: dinp copied from dinp_from first (the same bits as starting
// from it), the f32 kernel `compute(x)` on inp (widened when bf16), dinp rounded into dinp_bf16 after.
template <class F>
void cpu_backward_forms(Tensor dinp, const Tensor& inp, const Tensor& dinp_from, const Tensor& dinp_bf16, F compute) {
  const std::vector<float> wide = inp.dtype() == DType::f32 ? std::vector<float>() : cpu_widened(inp);
  if (dinp_from.data() && dinp_from.data() != dinp.data())
    std::copy_n(dinp_from.ptr<float>(), dinp.numel(), dinp.ptr<float>());
  compute(wide.empty() ? inp.ptr<float>() : wide.data());
  if (dinp_bf16.data())
    convert(dinp.data(), DType::f32, dinp_bf16.data(), DType::bf16, static_cast<size_t>(dinp.numel()));
}

// Device bytes of a backward's (N, C) passes: dout and dinp (or dinp_from) read, dinp written, inp
// read in its dtype, the rounded copy written.
double backward_pass_bytes(int64_t n, const Tensor& inp, const Tensor& dinp_bf16) {
  return pass_bytes(n, 2, 1) + pass_bytes(n, 1, 0, dtype_size(inp.dtype())) +
         pass_bytes(n, 0, dinp_bf16.data() ? 1 : 0, 2);
}

// The CPU's forward: the f32 result of `compute(float* out)` stored in out's dtype (rounded once
// for bf16), and the input rounded into inp_bf16 where given.
template <class F>
void cpu_forward_forms(Tensor out, const Tensor& inp, const Tensor& inp_bf16, F compute) {
  if (out.dtype() == DType::f32) {
    compute(out.ptr<float>());
  } else {
    std::vector<float> wide(static_cast<size_t>(out.numel()));
    compute(wide.data());
    cpu_store(out, wide);
  }
  if (inp_bf16.data()) convert(inp.data(), DType::f32, inp_bf16.data(), DType::bf16, static_cast<size_t>(inp.numel()));
}

// Device bytes of a forward's (N, C) passes: inp read, out written in its dtype, the rounded input.
double forward_pass_bytes(int64_t n, const Tensor& out, const Tensor& inp_bf16) {
  return pass_bytes(n, 1, 0) + pass_bytes(n, 0, 1, dtype_size(out.dtype())) +
         pass_bytes(n, 0, inp_bf16.data() ? 1 : 0, 2);
}

}  // namespace

void layernorm_forward(Backend& be, Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias,
                       float eps, Tensor inp_bf16) {
  const auto [N, C] = layernorm_shape(out, mean, rstd, inp, weight, bias, "layernorm_forward");
  check_norm_out(out, "layernorm_forward");
  check_f32(inp, "layernorm_forward");
  check_optional_bf16(inp_bf16, inp, "layernorm_forward's rounded input");
  switch (be.device()) {
    case Device::cpu:
      return cpu_forward_forms(out, inp, inp_bf16, [&](float* o) {
        cpu::layernorm_forward(o, mean.ptr<float>(), rstd.ptr<float>(), inp.ptr<float>(), weight.ptr<float>(),
                               bias.ptr<float>(), N, C, eps);
      });
    case Device::cuda:
      if constexpr (kWithCuda) cuda::layernorm_forward(be, out, mean, rstd, inp, weight, bias, eps, inp_bf16, N, C);
      return;
    case Device::meta:
      return charge(be,
                    {.name = "layernorm_forward",
                     .flops = 8.0 * N * C,
                     .bytes = forward_pass_bytes(N * C, out, inp_bf16) + pass_bytes(N, 0, 2)},
                    [&] { return cuda::layernorm_forward_launches(N, C); });
  }
}

// As the forward's (dinp in out's place, dbias in bias's), and dout like inp, dweight like weight.
void layernorm_backward(Backend& be, Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                        Tensor mean, Tensor rstd, Tensor dinp_from, Tensor dinp_bf16) {
  const auto [N, C] = layernorm_shape(dinp, mean, rstd, inp, weight, dbias, "layernorm_backward");
  check_same_numel(dout, inp, "layernorm_backward");
  check_same_numel(dweight, weight, "layernorm_backward");
  check_backward_forms(dinp, inp, dinp_from, dinp_bf16, "layernorm_backward");
  switch (be.device()) {
    case Device::cpu:
      return cpu_backward_forms(dinp, inp, dinp_from, dinp_bf16, [&](const float* x) {
        cpu::layernorm_backward(dinp.ptr<float>(), dweight.ptr<float>(), dbias.ptr<float>(), dout.ptr<float>(), x,
                                weight.ptr<float>(), mean.ptr<float>(), rstd.ptr<float>(), N, C);
      });
    case Device::cuda:
      if constexpr (kWithCuda)
        cuda::layernorm_backward(be, dinp, dweight, dbias, dout, inp, weight, mean, rstd, dinp_from, dinp_bf16, N, C);
      return;
    case Device::meta:
      return charge(be,
                    {.name = "layernorm_backward",
                     .flops = 14.0 * N * C,
                     .bytes = backward_pass_bytes(N * C, inp, dinp_bf16) + pass_bytes(N, 2, 0) + pass_bytes(C, 2, 2)},
                    [&] { return cuda::layernorm_backward_launches(N, C); });
  }
}

void rmsnorm_forward(Backend& be, Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps, Tensor inp_bf16) {
  const auto [N, C] = rmsnorm_shape(out, rstd, inp, weight, "rmsnorm_forward");
  check_norm_out(out, "rmsnorm_forward");
  check_f32(inp, "rmsnorm_forward");
  check_optional_bf16(inp_bf16, inp, "rmsnorm_forward's rounded input");
  switch (be.device()) {
    case Device::cpu:
      return cpu_forward_forms(out, inp, inp_bf16, [&](float* o) {
        cpu::rmsnorm_forward(o, rstd.ptr<float>(), inp.ptr<float>(), weight.ptr<float>(), N, C, eps);
      });
    case Device::cuda:
      if constexpr (kWithCuda) cuda::rmsnorm_forward(be, out, rstd, inp, weight, eps, inp_bf16, N, C);
      return;
    case Device::meta:
      return charge(be,
                    {.name = "rmsnorm_forward",
                     .flops = 5.0 * N * C,
                     .bytes = forward_pass_bytes(N * C, out, inp_bf16) + pass_bytes(N, 0, 1)},
                    [&] { return cuda::rmsnorm_forward_launches(N, C); });
  }
}

void rmsnorm_backward(Backend& be, Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd,
                      Tensor dinp_from, Tensor dinp_bf16) {
  const auto [N, C] = rmsnorm_shape(dinp, rstd, inp, weight, "rmsnorm_backward");
  check_same_numel(dout, inp, "rmsnorm_backward");
  check_same_numel(dweight, weight, "rmsnorm_backward");
  check_backward_forms(dinp, inp, dinp_from, dinp_bf16, "rmsnorm_backward");
  switch (be.device()) {
    case Device::cpu:
      return cpu_backward_forms(dinp, inp, dinp_from, dinp_bf16, [&](const float* x) {
        cpu::rmsnorm_backward(dinp.ptr<float>(), dweight.ptr<float>(), dout.ptr<float>(), x, weight.ptr<float>(),
                              rstd.ptr<float>(), N, C);
      });
    case Device::cuda:
      if constexpr (kWithCuda)
        cuda::rmsnorm_backward(be, dinp, dweight, dout, inp, weight, rstd, dinp_from, dinp_bf16, N, C);
      return;
    case Device::meta:
      return charge(be,
                    {.name = "rmsnorm_backward",
                     .flops = 10.0 * N * C,
                     .bytes = backward_pass_bytes(N * C, inp, dinp_bf16) + pass_bytes(N, 1, 0) + pass_bytes(C, 1, 1)},
                    [&] { return cuda::rmsnorm_backward_launches(N, C); });
  }
}

namespace {
struct HeadNormShape {
  int64_t N, W, heads, hd;
};
HeadNormShape head_norm_shape(const Tensor& x, const Tensor& pre, const Tensor& rstd, const Tensor& weight,
                              int64_t col0, const char* op) {
  const int64_t hd = weight.numel();
  const int64_t N = x.ndim() >= 2 ? x.numel() / x.dim(x.ndim() - 1) : 0, W = N > 0 ? x.numel() / N : 0;
  const int64_t heads = N > 0 && hd > 0 ? pre.numel() / (N * hd) : 0;
  SHARD_CHECK(hd > 0 && N > 0 && heads > 0 && pre.numel() == N * heads * hd && rstd.numel() == N * heads &&
                  col0 >= 0 && col0 + heads * hd <= W,
              "{}: x {} pre {} rstd {} weight {} col0={}", op, x.shape_str(), pre.shape_str(), rstd.shape_str(),
              weight.shape_str(), col0);
  return {N, W, heads, hd};
}
}  // namespace

void head_rmsnorm_forward(Backend& be, Tensor x, Tensor pre, Tensor rstd, Tensor weight, int64_t col0, float eps) {
  const HeadNormShape s = head_norm_shape(x, pre, rstd, weight, col0, "head_rmsnorm_forward");
  switch (be.device()) {
    case Device::cpu:
      return cpu::head_rmsnorm_forward(x.ptr<float>(), pre.ptr<float>(), rstd.ptr<float>(), weight.ptr<float>(), s.N,
                                       s.W, col0, s.heads, s.hd, eps);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::head_rmsnorm_forward(be, x, pre, rstd, weight, s.N, s.W, col0, s.heads, s.hd, eps);
      return;
    case Device::meta:
      return charge(be,
                    {.name = "head_rmsnorm_forward",
                     .flops = 5.0 * s.N * s.heads * s.hd,
                     .bytes = pass_bytes(s.N * s.heads * s.hd, 1, 2) + pass_bytes(s.N * s.heads, 0, 1)},
                    [&] { return cuda::head_rmsnorm_forward_launches(s.N, s.W, col0, s.heads, s.hd); });
  }
}

void head_rmsnorm_backward(Backend& be, Tensor dx, Tensor dweight, Tensor pre, Tensor weight, Tensor rstd,
                           int64_t col0) {
  const HeadNormShape s = head_norm_shape(dx, pre, rstd, weight, col0, "head_rmsnorm_backward");
  SHARD_CHECK(dweight.numel() == s.hd, "head_rmsnorm_backward: dweight {} for head size {}", dweight.shape_str(), s.hd);
  switch (be.device()) {
    case Device::cpu:
      return cpu::head_rmsnorm_backward(dx.ptr<float>(), dweight.ptr<float>(), pre.ptr<float>(), weight.ptr<float>(),
                                        rstd.ptr<float>(), s.N, s.W, col0, s.heads, s.hd);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::head_rmsnorm_backward(be, dx, dweight, pre, weight, rstd, s.N, s.W, col0, s.heads, s.hd);
      return;
    case Device::meta:
      return charge(be,
                    {.name = "head_rmsnorm_backward",
                     .flops = 10.0 * s.N * s.heads * s.hd,
                     .bytes = pass_bytes(s.N * s.heads * s.hd, 2, 1) + pass_bytes(s.N * s.heads, 1, 0)},
                    [&] { return cuda::head_rmsnorm_backward_launches(s.N, s.W, col0, s.heads, s.hd); });
  }
}

}  // namespace shardlab::ops
