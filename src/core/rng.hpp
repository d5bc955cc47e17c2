// rng.hpp — counter-based random numbers: value = f(seed, tensor name, element index).
//
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) maps a
// 128-bit counter and a 64-bit key to 128 random bits with no state. The key is derived from the
// seed and the tensor's name; the counter is the element index. So any slice of a tensor — a rank's
// shard at any world size — is initialised on its own and equals the same slice of the whole
// tensor, and the initial model is the same whatever the world size.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#if defined(__CUDACC__)
#define SHARDLAB_HD __host__ __device__
#else
#define SHARDLAB_HD
#endif

namespace shardlab {

using PhiloxBlock = std::array<uint32_t, 4>;

SHARDLAB_HD inline PhiloxBlock philox4x32_10(PhiloxBlock c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// A stream of random values for one named tensor. Cheap to construct; holds only the key.
class Rng {
 public:
  Rng(uint64_t seed, std::string_view tensor_name);
  uint64_t key() const { return key_; }

  // Two independent 32-bit words for element i (each element owns half a Philox block).
  std::array<uint32_t, 2> bits(uint64_t i) const;
  // Uniform in [0, 1) with 24 random bits.
  float uniform(uint64_t i) const;
  // Normal(mean, std) by Box–Muller on element i's two words.
  float normal(uint64_t i, float mean = 0.f, float std = 1.f) const;

  // Fill out[j] with the value of element first + j.
  void fill_uniform(std::span<float> out, uint64_t first, float lo, float hi) const;
  void fill_normal(std::span<float> out, uint64_t first, float mean, float std) const;

 private:
  uint64_t key_;
};

}  // namespace shardlab
