#include <catch2/catch.hpp>
#include <cmath>
#include <string_view>
#include <vector>

#include "src/core/hash.hpp"
#include "src/core/rng.hpp"

using namespace shardlab;

TEST_CASE("Philox4x32-10 matches the published known-answer vectors", "[rng]") {
  // Random123's kat_vectors for philox4x32_10.
  PhiloxBlock zero = philox4x32_10({0, 0, 0, 0}, 0, 0);
  CHECK(zero == PhiloxBlock{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  PhiloxBlock ones = philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0xffffffffu, 0xffffffffu);
  CHECK(ones == PhiloxBlock{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  PhiloxBlock pi = philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u, 0x299f31d0u);
  CHECK(pi == PhiloxBlock{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("any slice of a tensor initialises alone to the same values", "[rng]") {
  Rng rng(42, "h.0.attn.c_attn.weight");
  const size_t n = 1001;
  std::vector<float> whole(n);
  rng.fill_normal(whole, 0, 0.f, 0.02f);
  // Shards of a world of 3 (uneven: 334 + 334 + 333), each filled on its own.
  for (size_t start = 0; start < n; start += 334) {
    size_t len = std::min<size_t>(334, n - start);
    std::vector<float> shard(len);
    Rng(42, "h.0.attn.c_attn.weight").fill_normal(shard, start, 0.f, 0.02f);
    for (size_t j = 0; j < len; ++j) REQUIRE(shard[j] == whole[start + j]);
  }
}

TEST_CASE("seed and name both change the stream", "[rng]") {
  std::vector<float> a(64), b(64), c(64);
  Rng(1, "wte.weight").fill_uniform(a, 0, 0.f, 1.f);
  Rng(2, "wte.weight").fill_uniform(b, 0, 0.f, 1.f);
  Rng(1, "wpe.weight").fill_uniform(c, 0, 0.f, 1.f);
  int same_ab = 0, same_ac = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    same_ab += a[i] == b[i];
    same_ac += a[i] == c[i];
  }
  CHECK(same_ab == 0);
  CHECK(same_ac == 0);
}

TEST_CASE("uniform and normal draws have the right moments", "[rng]") {
  const size_t n = 1 << 20;
  std::vector<float> u(n), z(n);
  Rng(3, "u").fill_uniform(u, 0, 0.f, 1.f);
  Rng(3, "z").fill_normal(z, 0, 0.f, 1.f);
  double su = 0, sz = 0, szz = 0, sz4 = 0;
  float umin = 1, umax = 0;
  for (size_t i = 0; i < n; ++i) {
    su += u[i];
    umin = std::min(umin, u[i]);
    umax = std::max(umax, u[i]);
    sz += z[i];
    szz += static_cast<double>(z[i]) * z[i];
    sz4 += std::pow(static_cast<double>(z[i]), 4);
  }
  CHECK(umin >= 0.f);
  CHECK(umax < 1.f);
  CHECK(std::fabs(su / n - 0.5) < 2e-3);
  double mean = sz / n, var = szz / n - mean * mean;
  CHECK(std::fabs(mean) < 5e-3);
  CHECK(std::fabs(var - 1.0) < 5e-3);
  CHECK(std::fabs(sz4 / n - 3.0) < 5e-2);  // kurtosis of a normal
  std::vector<float> scaled(1000);
  Rng(3, "z").fill_normal(scaled, 0, 1.f, 0.5f);
  for (size_t i = 0; i < scaled.size(); ++i) CHECK(scaled[i] == Approx(1.f + 0.5f * z[i]).margin(1e-6));
}

TEST_CASE("a tensor's key is pinned: the initial model never changes", "[rng]") {
  // Values of the key derivation (FNV-1a 64 of the name, mixed with the seed by splitmix64) as first
  // released; a change to either hash changes every initial weight.
  CHECK(Rng(1337, "h.0.attn.c_attn.weight").key() == 0x3bc6e3f752eff676ull);
  CHECK(Rng(0, "").key() == 0x5b21f68ffa77f14cull);
}

TEST_CASE("FNV-1a 64 matches the reference vectors and continues across chunks", "[hash]") {
  static_assert(fnv1a64("") == 0xcbf29ce484222325ull);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  CHECK(fnv1a64("foobar") == 0x85944171f73967e8ull);
  CHECK(fnv1a64("bar", fnv1a64("foo")) == fnv1a64("foobar"));
  CHECK(fnv1a64("\xff") == 0xaf64724c8602eb6eull);  // bytes are unsigned: a sign-extended char would differ
}
