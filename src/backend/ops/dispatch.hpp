// dispatch.hpp — what the operation families (ops/*.hpp) share.
//
// An operation family is a header of free functions (`ops::layernorm_forward(be, ...)`) and one
// .cpp that checks the tensors once and switches on the backend's device to its implementation:
// cpu/<family>.cpp (kernels on raw pointers), cuda/<family>.cpp (launchers of cuda/<family>.cu,
// declared in cuda/ops.hpp), and nothing on the meta backend, which computes nothing (its memory is
// the Pool's, and the checks above ran). A new operation is its kernels' files, its function in a
// family (or a new family), one case per device, and a case in tests/test_backend_ops.cpp.
//
// The layers' operations are f32. Shapes: B batch, T time, C channels, H heads, V vocab, N rows.
// Token ids are int32 in host memory on every backend (the CUDA implementation copies them to the
// device itself; the caller may reuse them once the call returns). "accumulate" gradients add to
// what the buffer holds.
#pragma once
#include <utility>
#include <vector>

#include "src/backend/backend.hpp"
#include "src/backend/cost.hpp"
#include "src/backend/cuda/launches.hpp"

#ifndef SHARDLAB_WITH_CUDA
#define SHARDLAB_WITH_CUDA 0
#endif

namespace shardlab::ops {

// Whether the CUDA implementations are linked in. Without them no Backend reports Device::cuda,
// and the families' `if constexpr (kWithCuda)` branches name cuda:: functions that are not defined,
// which a discarded branch may.
inline constexpr bool kWithCuda = SHARDLAB_WITH_CUDA != 0;

// Raw f32 data of a tensor that may be empty (an optional operand), else nullptr.
inline float* f32_or_null(const Tensor& t) { return t.data() != nullptr ? t.ptr<float>() : nullptr; }

// The CPU case of an operation a GPU also runs on bf16 operands (its products rounding them): the
// CPU computes in f32, on a widened copy of a host tensor, and stores its f32 result rounded once.
inline std::vector<float> cpu_widened(const Tensor& t) {
  std::vector<float> w(static_cast<size_t>(t.numel()));
  convert(t.data(), t.dtype(), w.data(), DType::f32, w.size());
  return w;
}
inline void cpu_store(Tensor to, const std::vector<float>& from) {
  convert(from.data(), DType::f32, to.data(), to.dtype(), from.size());
}

// Ids of the whole vocabulary seen by one shard of it: only their sign can be checked there (the
// upper bound is the whole vocabulary's, which a shard's operation is not told).
void check_shard_ids(const int32_t* ids, int64_t n, const char* what);

// The meta case of an operation: its cost written to the backend's ledger (src/backend/cost.hpp)
// when one is attached. `launches` is called only when the ledger stands for a CUDA device: it
// returns the commands the CUDA implementation issues, from the same declarations its launcher
// reads (cuda/launches.hpp), so the ledger counts what the GPU runs. On the CPU an operation is a
// function call: no launches.
// `library`: cuBLAS calls the operation makes through the Backend beside the list (the naive
// attention's products); `times`: how often the operation issues the list (once per batch entry).
void add_launches(OpCost& c, const cuda::Launches& l, int64_t times = 1);
template <class LaunchesOf>
void charge(Backend& be, OpCost c, LaunchesOf&& launches, int64_t library = 0, int64_t times = 1) {
  CostLedger* l = be.cost_ledger();
  if (l == nullptr || l->paused()) return;
  if (l->target() == Device::cuda) {
    add_launches(c, std::forward<LaunchesOf>(launches)(), times);
    c.launches += static_cast<int>(library);
  }
  l->add(std::move(c));
}

}  // namespace shardlab::ops
