// activation.cpp — the activation family's checks and dispatch (activation.hpp).
#include "src/backend/ops/activation.hpp"

#include <array>
#include <initializer_list>
#include <vector>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::ops {
namespace {

// {N, F}: out (N, F), gate_up (N, 2F).
std::array<int64_t, 2> swiglu_shape(const Tensor& out, const Tensor& gate_up, const char* op) {
  const int64_t F = out.ndim() >= 1 ? out.dim(out.ndim() - 1) : 0, N = F > 0 ? out.numel() / F : 0;
  SHARD_CHECK(F > 0 && gate_up.numel() == 2 * N * F, "{}: out {} must be (N, F) and gate_up {} (N, 2F)", op,
              out.shape_str(), gate_up.shape_str());
  return {N, F};
}

// Each tensor f32 or bf16 (the SwiGLU's stored operands; widened as read, rounded once as written).
void check_f32_or_bf16(std::initializer_list<const Tensor*> ts, const char* op) {
  for (const Tensor* t : ts)
    SHARD_CHECK(t->dtype() == DType::f32 || t->dtype() == DType::bf16, "{}: f32 or bf16 expected, got {}", op,
                dtype_name(t->dtype()));
}

}  // namespace

void gelu_forward(Backend& be, Tensor out, Tensor inp) {
  check_same_numel(out, inp, "gelu_forward");
  switch (be.device()) {
    case Device::cpu: return cpu::gelu_forward(out.ptr<float>(), inp.ptr<float>(), inp.numel());
    case Device::cuda:
      if constexpr (kWithCuda) cuda::gelu_forward(be, out, inp);
      return;
    case Device::meta:
      return charge(be, {.name = "gelu_forward", .flops = 8.0 * inp.numel(), .bytes = pass_bytes(inp.numel(), 1, 1)},
                    [&] { return cuda::gelu_forward_launches(inp.numel()); });
  }
}

void gelu_backward(Backend& be, Tensor dinp, Tensor inp, Tensor dout) {
  check_same_numel(dinp, inp, "gelu_backward");
  check_same_numel(dout, inp, "gelu_backward");
  switch (be.device()) {
    case Device::cpu: return cpu::gelu_backward(dinp.ptr<float>(), inp.ptr<float>(), dout.ptr<float>(), inp.numel());
    case Device::cuda:
      if constexpr (kWithCuda) cuda::gelu_backward(be, dinp, inp, dout);
      return;
    case Device::meta:
      return charge(be, {.name = "gelu_backward", .flops = 12.0 * inp.numel(), .bytes = pass_bytes(inp.numel(), 2, 1)},
                    [&] { return cuda::gelu_backward_launches(inp.numel()); });
  }
}

void swiglu_forward(Backend& be, Tensor out, Tensor gate_up) {
  const auto [N, F] = swiglu_shape(out, gate_up, "swiglu_forward");
  check_f32_or_bf16({&out, &gate_up}, "swiglu_forward");
  switch (be.device()) {
    case Device::cpu: {
      if (out.dtype() == DType::f32 && gate_up.dtype() == DType::f32)
        return cpu::swiglu_forward(out.ptr<float>(), gate_up.ptr<float>(), N, F);
      const std::vector<float> in = cpu_widened(gate_up);
      std::vector<float> wide(static_cast<size_t>(N * F));
      cpu::swiglu_forward(wide.data(), in.data(), N, F);
      return cpu_store(out, wide);
    }
    case Device::cuda:
      if constexpr (kWithCuda) cuda::swiglu_forward(be, out, gate_up, N, F);
      return;
    case Device::meta:
      return charge(be,
                    {.name = "swiglu_forward",
                     .flops = 6.0 * N * F,
                     .bytes = pass_bytes(N * F, 2, 0, dtype_size(gate_up.dtype())) +
                              pass_bytes(N * F, 0, 1, dtype_size(out.dtype()))},
                    [&] { return cuda::swiglu_forward_launches(N, F); });
  }
}

void swiglu_backward(Backend& be, Tensor dgate_up, Tensor gate_up, Tensor dout) {
  const auto [N, F] = swiglu_shape(dout, gate_up, "swiglu_backward");
  check_same_numel(dgate_up, gate_up, "swiglu_backward");
  check_f32_or_bf16({&dgate_up, &gate_up}, "swiglu_backward");
  switch (be.device()) {
    case Device::cpu: {
      if (dgate_up.dtype() == DType::f32 && gate_up.dtype() == DType::f32)
        return cpu::swiglu_backward(dgate_up.ptr<float>(), gate_up.ptr<float>(), dout.ptr<float>(), N, F);
      const std::vector<float> in = cpu_widened(gate_up);
      std::vector<float> wide(static_cast<size_t>(2 * N * F));
      cpu::swiglu_backward(wide.data(), in.data(), dout.ptr<float>(), N, F);
      return cpu_store(dgate_up, wide);
    }
    case Device::cuda:
      if constexpr (kWithCuda) cuda::swiglu_backward(be, dgate_up, gate_up, dout, N, F);
      return;
    case Device::meta:
      return charge(be,
                    {.name = "swiglu_backward",
                     .flops = 10.0 * N * F,
                     .bytes = pass_bytes(N * F, 1, 0) + pass_bytes(N * F, 2, 0, dtype_size(gate_up.dtype())) +
                              pass_bytes(N * F, 0, 2, dtype_size(dgate_up.dtype()))},
                    [&] { return cuda::swiglu_backward_launches(N, F); });
  }
}

}  // namespace shardlab::ops
