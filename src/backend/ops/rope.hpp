// rope.hpp — the rotary position embedding (Llama's positions). Conventions: ops/dispatch.hpp.
#pragma once
#include <array>

#include "src/backend/ops/dispatch.hpp"

namespace shardlab {

// Rotary position embedding's frequencies for one head size, computed on the host by the model
// (HF's inv_freq = 1 / theta^(2i / head_dim), with Llama 3.1's frequency scaling when asked) and
// passed by value, so a CUDA kernel takes them as a parameter with no device copy.
struct RopeFreqs {
  static constexpr int kMaxHalf = 256;  // head_dim up to 512
  int64_t half = 0;                     // head_dim / 2
  std::array<float, kMaxHalf> inv_freq{};
};

namespace ops {

// Rotary position embedding in place, in HF's convention (rotate_half): x is (B, T, W), and in
// every row the first `heads` heads of head_dim channels (W >= heads * head_dim) rotate pairs
// (i, i + head_dim/2) by the angle (pos0 + t) * inv_freq[i], with the angle and its cos and sin
// computed in f32. inverse rotates by minus the angle: a rotation's gradient, so backward is
// rope(dx, ..., inverse = true).
void rope(Backend& be, Tensor x, int64_t heads, int64_t head_dim, const RopeFreqs& freqs, int64_t pos0, bool inverse);

}  // namespace ops
}  // namespace shardlab
