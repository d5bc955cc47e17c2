// rope.cpp — the rotary position embedding's checks and dispatch (rope.hpp).
#include "src/backend/ops/rope.hpp"

#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::ops {

void rope(Backend& be, Tensor x, int64_t heads, int64_t head_dim, const RopeFreqs& freqs, int64_t pos0, bool inverse) {
  SHARD_CHECK(x.ndim() == 3 && heads > 0 && head_dim > 0 && head_dim % 2 == 0 && heads * head_dim <= x.dim(2) &&
                  freqs.half == head_dim / 2 && freqs.half <= RopeFreqs::kMaxHalf,
              "rope: x {} must be (B, T, W) with W >= heads {} x head_dim {} (even, at most {}); freqs for {} pairs",
              x.shape_str(), heads, head_dim, 2 * RopeFreqs::kMaxHalf, freqs.half);
  const int64_t B = x.dim(0), T = x.dim(1), W = x.dim(2);
  switch (be.device()) {
    case Device::cpu: return cpu::rope(x.ptr<float>(), B, T, W, heads, head_dim, freqs, pos0, inverse);
    case Device::cuda:
      if constexpr (kWithCuda) cuda::rope(be, x, heads, freqs, pos0, inverse, B, T, W);
      return;
    case Device::meta:
      return charge(be,
                    {.name = "rope",
                     .flops = 6.0 * B * T * heads * head_dim,
                     .bytes = pass_bytes(B * T * heads * head_dim, 1, 1)},
                    [&] { return cuda::rope_launches(heads, freqs.half, pos0, inverse, B, T, W); });
  }
}

}  // namespace shardlab::ops
