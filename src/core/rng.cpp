#include "src/core/rng.hpp"

#include <cmath>

#include "src/core/hash.hpp"

namespace shardlab {
namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

Rng::Rng(uint64_t seed, std::string_view tensor_name)
    : key_(splitmix64(fnv1a64(tensor_name) ^ splitmix64(seed))) {}

std::array<uint32_t, 2> Rng::bits(uint64_t i) const {
  uint64_t block = i >> 1;
  PhiloxBlock c{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u};
  PhiloxBlock r = philox4x32_10(c, static_cast<uint32_t>(key_), static_cast<uint32_t>(key_ >> 32));
  return (i & 1) ? std::array<uint32_t, 2>{r[2], r[3]} : std::array<uint32_t, 2>{r[0], r[1]};
}

float Rng::uniform(uint64_t i) const { return static_cast<float>(bits(i)[0] >> 8) * 0x1p-24f; }

float Rng::normal(uint64_t i, float mean, float std) const {
  auto w = bits(i);
  double u1 = (static_cast<double>(w[0] >> 8) + 1.0) * 0x1p-24;  // (0, 1]: log is finite
  double u2 = static_cast<double>(w[1] >> 8) * 0x1p-24;
  double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  return static_cast<float>(mean + std * z);
}

void Rng::fill_uniform(std::span<float> out, uint64_t first, float lo, float hi) const {
  for (size_t j = 0; j < out.size(); ++j) out[j] = lo + (hi - lo) * uniform(first + j);
}

void Rng::fill_normal(std::span<float> out, uint64_t first, float mean, float std) const {
  for (size_t j = 0; j < out.size(); ++j) out[j] = normal(first + j, mean, std);
}

}  // namespace shardlab
