// mla_heads.hpp — the shape of one latent attention call (ops/mla.hpp), shared by its CPU and CUDA
// kernels and by launches.hpp (plain data: nvcc includes it too).
#pragma once
#include <cstdint>

namespace shardlab {

// One rank's heads of a latent attention: H heads whose query and key are [nope | rope] channels
// and whose value is v; the latent's kv_rank channels lead kva's rows, the rotary key every head
// shares follows them. interleave: RoPE rotates channel pairs (2i, 2i + 1) (HF's rope_interleave;
// transformers writes the pairs out de-interleaved, which changes no score), else (i, i + rope/2).
struct MlaHeads {
  int64_t heads = 0, nope = 0, rope = 0, v = 0, kv_rank = 0;
  bool interleave = true;
  int64_t qk() const { return nope + rope; }
  int64_t width() const { return heads * (2 * qk() + v); }  // a packed [q | k | v] row
};

}  // namespace shardlab
