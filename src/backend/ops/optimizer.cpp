// optimizer.cpp — the optimizer update family's checks and dispatch (optimizer.hpp).
#include "src/backend/ops/optimizer.hpp"

#include <algorithm>
#include <vector>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::ops {
namespace {
// n elements' AdamW step: p, m, v read and written; the gradient read in its own dtype.
OpCost adamw_cost(double n, DType grad) {
  return {.name = "adamw_update", .flops = 16.0 * n, .bytes = n * (6 * 4 + dtype_size(grad))};
}
// The buffers every AdamW entry takes: the same count each, the gradients f32 or bf16.
void check_adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const char* op) {
  check_same_numel(param, grad, op);
  check_same_numel(param, m, op);
  check_same_numel(param, v, op);
  SHARD_CHECK(grad.dtype() == DType::f32 || grad.dtype() == DType::bf16, "{}: f32 or bf16 gradients, got {}", op,
              dtype_name(grad.dtype()));
}
}  // namespace

void adamw_update(Backend& be, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWArgs& a) {
  check_adamw(param, grad, m, v, "adamw_update");
  const bool bf16 = grad.dtype() == DType::bf16;
  switch (be.device()) {
    case Device::cpu:
      if (bf16)
        return cpu::adamw_update_bf16_grad(param.ptr<float>(), static_cast<const uint16_t*>(grad.data()),
                                           m.ptr<float>(), v.ptr<float>(), param.numel(), a);
      return cpu::adamw_update(param.ptr<float>(), grad.ptr<float>(), m.ptr<float>(), v.ptr<float>(), param.numel(),
                               a);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::adamw_update(be, param, grad, m, v, a);
      return;
    case Device::meta:
      return charge(be, adamw_cost(static_cast<double>(param.numel()), grad.dtype()), [&] {
        return bf16 ? cuda::adamw_bf16_grad_launches(param.numel()) : cuda::adamw_update_launches(param.numel());
      });
  }
}

void adamw_update_segments(Backend& be, Tensor param, Tensor grad, Tensor m, Tensor v,
                           std::span<const AdamWSegment> segments, const AdamWArgs& a, Tensor rounded) {
  const char* op = "adamw_update_segments";
  constexpr size_t kPerCall = 8 * cuda::kAdamWSegmentsPerLaunch;  // what one Launches list holds
  if (segments.size() > kPerCall) {
    for (size_t first = 0; first < segments.size(); first += kPerCall)
      adamw_update_segments(be, param, grad, m, v, segments.subspan(first, std::min(kPerCall, segments.size() - first)),
                            a, rounded);
    return;
  }
  check_adamw(param, grad, m, v, op);
  if (rounded.data()) {
    check_same_numel(param, rounded, op);
    SHARD_CHECK(rounded.dtype() == DType::bf16, "{}: the rounded copy is bf16, got {}", op, dtype_name(rounded.dtype()));
  }
  double n = 0;
  std::vector<int64_t> numels;
  for (const AdamWSegment& s : segments) {
    SHARD_CHECK(s.offset >= 0 && s.numel >= 0 && s.offset + s.numel <= param.numel(),
                "{}: segment [{}, {}) of {} elements", op, s.offset, s.offset + s.numel, param.numel());
    n += static_cast<double>(s.numel);
    numels.push_back(s.numel);
  }
  const bool bf16 = grad.dtype() == DType::bf16;
  if (n == 0) return;  // nothing to update: no launch on CUDA, nothing in the ledger
  switch (be.device()) {
    case Device::cpu:
      for (const AdamWSegment& s : segments) {
        AdamWArgs b = a;
        b.weight_decay = s.weight_decay;
        adamw_update(be, param.slice(s.offset, s.numel), grad.slice(s.offset, s.numel), m.slice(s.offset, s.numel),
                     v.slice(s.offset, s.numel), b);
        if (rounded.data()) be.cast(rounded.slice(s.offset, s.numel), param.slice(s.offset, s.numel));
      }
      return;
    case Device::cuda:
      if constexpr (kWithCuda) cuda::adamw_update_segments(be, param, grad, m, v, segments, a, rounded);
      return;
    case Device::meta: {
      OpCost c = adamw_cost(n, grad.dtype());
      if (rounded.data()) c.bytes += 2 * n;  // the rounded copy written
      return charge(be, std::move(c), [&] { return cuda::adamw_segments_launches(numels, bf16); });
    }
  }
}

void sgd_update(Backend& be, Tensor param, Tensor grad, Tensor momentum, const SgdArgs& a) {
  check_same_numel(param, grad, "sgd_update");
  check_same_numel(param, momentum, "sgd_update");
  switch (be.device()) {
    case Device::cpu:
      return cpu::sgd_update(param.ptr<float>(), grad.ptr<float>(), momentum.ptr<float>(), param.numel(), a);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::sgd_update(be, param, grad, momentum, a);
      return;
    case Device::meta:
      return charge(be, {.name = "sgd_update", .flops = 4.0 * param.numel(), .bytes = pass_bytes(param.numel(), 3, 2)},
                    [&] { return cuda::sgd_update_launches(param.numel()); });
  }
}

}  // namespace shardlab::ops
