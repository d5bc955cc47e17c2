// loss.cpp — the loss family's checks and dispatch (loss.hpp).
#include "src/backend/ops/loss.hpp"

#include <array>
#include <initializer_list>
#include <vector>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::ops {
namespace {

// The vocabulary-parallel loss's {N, Vl}: N rows from mx, Vl columns from logits, valid of them
// real; the other per-row tensors hold N.
std::array<int64_t, 2> vocab_ce_check(const Tensor& mx, const Tensor& logits, int64_t valid, const char* op,
                                      std::initializer_list<const Tensor*> rows) {
  const int64_t N = mx.numel();
  SHARD_CHECK(N > 0 && logits.numel() % N == 0 && valid >= 0 && valid <= logits.numel() / N,
              "{}: logits {} for {} rows with {} valid columns", op, logits.shape_str(), N, valid);
  for (const Tensor* t : rows) check_same_numel(*t, mx, op);
  return {N, logits.numel() / N};
}

}  // namespace

void cross_entropy(Backend& be, Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets,
                   float dloss_scale) {
  const int64_t N = losses.numel();
  SHARD_CHECK(N > 0 && logits.numel() % N == 0, "cross_entropy: logits {} losses {}", logits.shape_str(),
              losses.shape_str());
  const bool grads = dlogits.data() != nullptr;
  if (grads) {
    check_same_numel(dlogits, logits, "cross_entropy");
    SHARD_CHECK(dlogits.dtype() == DType::f32 || (dlogits.dtype() == DType::bf16 && dlogits.data() != logits.data()),
                "cross_entropy: {} dlogits{}: f32, or bf16 in a buffer of their own", dtype_name(dlogits.dtype()),
                dlogits.data() == logits.data() ? " over the logits" : "");
  }
  const int64_t V = logits.numel() / N;
  switch (be.device()) {
    case Device::cpu: {
      if (!grads || dlogits.dtype() == DType::f32)
        return cpu::cross_entropy(losses.ptr<float>(), f32_or_null(dlogits), logits.ptr<float>(), targets, N, V,
                                  dloss_scale);
      std::vector<float> d(static_cast<size_t>(N * V));  // each gradient rounded once, as the GPU's kernel rounds it
      cpu::cross_entropy(losses.ptr<float>(), d.data(), logits.ptr<float>(), targets, N, V, dloss_scale);
      return cpu_store(dlogits, d);
    }
    case Device::cuda:
      if constexpr (kWithCuda) cuda::cross_entropy(be, losses, dlogits, logits, targets, dloss_scale, N, V);
      return;
    case Device::meta:
      return charge(be,
                    {.name = "cross_entropy",
                     .flops = 6.0 * N * V,
                     .bytes = pass_bytes(N * V, 1, 0) + (grads ? pass_bytes(N * V, 0, 1, dtype_size(dlogits.dtype())) : 0)},
                    [&] { return cuda::cross_entropy_launches(N, V); });
  }
}

void vocab_ce_max(Backend& be, Tensor mx, Tensor logits, int64_t valid) {
  const auto [N, Vl] = vocab_ce_check(mx, logits, valid, "vocab_ce_max", {});
  switch (be.device()) {
    case Device::cpu: return cpu::vocab_ce_max(mx.ptr<float>(), logits.ptr<float>(), N, Vl, valid);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::vocab_ce_max(be, mx, logits, valid, N, Vl);
      return;
    case Device::meta:
      return charge(be, {.name = "vocab_ce_max", .flops = 1.0 * N * Vl, .bytes = pass_bytes(N * Vl, 1, 0)},
                    [&] { return cuda::vocab_ce_max_launches(N, Vl); });
  }
}

void vocab_ce_sums(Backend& be, Tensor sumexp, Tensor tlogit, Tensor logits, const int32_t* targets, int64_t v0,
                   int64_t valid, Tensor mx) {
  SHARD_CHECK(v0 >= 0, "vocab_ce_sums: the shard's first column {} is negative", v0);
  const auto [N, Vl] = vocab_ce_check(mx, logits, valid, "vocab_ce_sums", {&sumexp, &tlogit});
  switch (be.device()) {
    case Device::cpu:
      check_shard_ids(targets, N, "target");
      return cpu::vocab_ce_sums(sumexp.ptr<float>(), tlogit.ptr<float>(), logits.ptr<float>(), targets, N, Vl, v0,
                                valid, mx.ptr<float>());
    case Device::cuda:
      if constexpr (kWithCuda) cuda::vocab_ce_sums(be, sumexp, tlogit, logits, targets, v0, valid, mx, N, Vl);
      return;
    case Device::meta:
      return charge(be, {.name = "vocab_ce_sums", .flops = 4.0 * N * Vl, .bytes = pass_bytes(N * Vl, 1, 0)},
                    [&] { return cuda::vocab_ce_sums_launches(N, Vl); });
  }
}

void vocab_ce_finish(Backend& be, Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets, int64_t v0,
                     int64_t valid, Tensor mx, Tensor sumexp, Tensor tlogit, float dloss_scale) {
  SHARD_CHECK(v0 >= 0, "vocab_ce_finish: the shard's first column {} is negative", v0);
  const auto [N, Vl] = vocab_ce_check(mx, logits, valid, "vocab_ce_finish", {&losses, &sumexp, &tlogit});
  if (dlogits.data() != nullptr) check_same_numel(dlogits, logits, "vocab_ce_finish");
  switch (be.device()) {
    case Device::cpu:
      check_shard_ids(targets, N, "target");
      return cpu::vocab_ce_finish(losses.ptr<float>(), f32_or_null(dlogits), logits.ptr<float>(), targets, N, Vl, v0,
                                  valid, mx.ptr<float>(), sumexp.ptr<float>(), tlogit.ptr<float>(), dloss_scale);
    case Device::cuda:
      if constexpr (kWithCuda)
        cuda::vocab_ce_finish(be, losses, dlogits, logits, targets, v0, valid, mx, sumexp, tlogit, dloss_scale, N, Vl);
      return;
    case Device::meta:
      return charge(
          be,
          {.name = "vocab_ce_finish", .flops = 4.0 * N * Vl, .bytes = pass_bytes(N * Vl, 1, dlogits.data() ? 1 : 0)},
          [&] { return cuda::vocab_ce_finish_launches(N, Vl); });
  }
}

}  // namespace shardlab::ops
