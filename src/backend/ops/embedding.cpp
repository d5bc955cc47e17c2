// embedding.cpp — the embedding family's checks and dispatch (embedding.hpp).
#include "src/backend/ops/embedding.hpp"

#include <algorithm>

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::ops {
namespace {

// C, from wte (rows, C); out holds B*T rows, wpe (when not empty) at least T.
int64_t forward_shape(const Tensor& out, const Tensor& wte, const Tensor& wpe, int64_t B, int64_t T, const char* op) {
  const int64_t C = wte.dim(1);
  SHARD_CHECK(out.numel() == B * T * C && (wpe.data() == nullptr || (wpe.dim(0) >= T && wpe.dim(1) == C)),
              "{}: out {} wte {} wpe {} B={} T={}", op, out.shape_str(), wte.shape_str(), wpe.shape_str(), B, T);
  return C;
}

int64_t backward_shape(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, int64_t B, int64_t T,
                       const char* op) {
  const int64_t C = dwte.dim(1);
  SHARD_CHECK(dout.numel() == B * T * C && (dwpe.data() == nullptr || dwpe.dim(1) == C), "{}: dout {} dwte {} dwpe {}",
              op, dout.shape_str(), dwte.shape_str(), dwpe.shape_str());
  return C;
}

// B T rows of C gathered from wte (and wpe's T rows added); backward adds them back into the
// table's rows (read and written) and wpe's.
OpCost forward_cost(int64_t B, int64_t T, int64_t C, const Tensor& wpe) {
  return {.name = "embedding_forward", .bytes = pass_bytes(B * T * C, 1, 1) + pass_bytes(T * C, wpe.data() ? 1 : 0, 0)};
}
OpCost backward_cost(int64_t B, int64_t T, int64_t C, const Tensor& dwpe) {
  const int pos = dwpe.data() ? 1 : 0;
  return {.name = "embedding_backward",
          .flops = 2.0 * B * T * C,
          .bytes = pass_bytes(B * T * C, 2, 1) + pass_bytes(T * C, pos, pos)};
}
// What the CUDA backward grids by: the distinct rows among the ids, at most one per id and per row.
int64_t bucket_bound(int64_t B, int64_t T, const Tensor& dwte) { return std::min(B * T, dwte.dim(0)); }
}  // namespace

void check_shard_ids(const int32_t* ids, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i) SHARD_CHECK(ids[i] >= 0, "{} id {} at position {} is negative", what, ids[i], i);
}

void embedding_forward(Backend& be, Tensor out, const int32_t* tokens, int64_t B, int64_t T, Tensor wte, Tensor wpe) {
  const int64_t C = forward_shape(out, wte, wpe, B, T, "embedding_forward");
  switch (be.device()) {
    case Device::cpu:
      return cpu::embedding_forward(out.ptr<float>(), tokens, wte.ptr<float>(), f32_or_null(wpe), B, T, C, wte.dim(0));
    case Device::cuda:
      if constexpr (kWithCuda) cuda::embedding_forward(be, out, tokens, B, T, wte, wpe, C);
      return;
    case Device::meta:
      return charge(be, forward_cost(B, T, C, wpe), [&] { return cuda::embedding_forward_launches(B, T, C); });
  }
}

void embedding_backward(Backend& be, Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int64_t B,
                        int64_t T) {
  const int64_t C = backward_shape(dwte, dwpe, dout, B, T, "embedding_backward");
  switch (be.device()) {
    case Device::cpu:
      return cpu::embedding_backward(dwte.ptr<float>(), f32_or_null(dwpe), dout.ptr<float>(), tokens, B, T, C);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::embedding_backward(be, dwte, dwpe, dout, tokens, B, T, C);
      return;
    case Device::meta:
      return charge(be, backward_cost(B, T, C, dwpe), [&] {
        return cuda::embedding_backward_launches(B, T, C, dwpe.data() != nullptr, bucket_bound(B, T, dwte));
      });
  }
}

void embedding_forward_shard(Backend& be, Tensor out, const int32_t* tokens, int64_t B, int64_t T, Tensor wte,
                             Tensor wpe, int64_t v0) {
  SHARD_CHECK(v0 >= 0, "embedding_forward_shard: the shard's first row {} is negative", v0);
  const int64_t C = forward_shape(out, wte, wpe, B, T, "embedding_forward_shard");
  switch (be.device()) {
    case Device::cpu:
      check_shard_ids(tokens, B * T, "token");
      return cpu::embedding_forward_shard(out.ptr<float>(), tokens, wte.ptr<float>(), f32_or_null(wpe), B, T, C,
                                          wte.dim(0), v0);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::embedding_forward_shard(be, out, tokens, B, T, wte, wpe, v0, C);
      return;
    case Device::meta:
      return charge(be, forward_cost(B, T, C, wpe),
                    [&] { return cuda::embedding_forward_shard_launches(B, T, v0, C); });
  }
}

void embedding_backward_shard(Backend& be, Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int64_t B,
                              int64_t T, int64_t v0) {
  SHARD_CHECK(v0 >= 0, "embedding_backward_shard: the shard's first row {} is negative", v0);
  const int64_t C = backward_shape(dwte, dwpe, dout, B, T, "embedding_backward_shard");
  switch (be.device()) {
    case Device::cpu:
      check_shard_ids(tokens, B * T, "token");
      return cpu::embedding_backward_shard(dwte.ptr<float>(), f32_or_null(dwpe), dout.ptr<float>(), tokens, B, T, C,
                                           dwte.dim(0), v0);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::embedding_backward_shard(be, dwte, dwpe, dout, tokens, B, T, v0, C);
      return;
    case Device::meta:
      return charge(be, backward_cost(B, T, C, dwpe), [&] {
        return cuda::embedding_backward_shard_launches(B, T, v0, C, dwpe.data() != nullptr, bucket_bound(B, T, dwte));
      });
  }
}

}  // namespace shardlab::ops
