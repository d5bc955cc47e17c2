// hash.hpp — FNV-1a 64 (Fowler–Noll–Vo), the one non-cryptographic hash in shardlab.
//
// It derives the RNG's per-tensor keys (rng.cpp: the initial model depends on it) and checksums
// checkpoint files (the manifest's "fnv1a64:<hex>"), so its outputs are part of the initial weights
// and of the on-disk format: never change them.
#pragma once
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace shardlab {

inline constexpr uint64_t kFnv1a64Basis = 0xcbf29ce484222325ull;  // the hash of no bytes

// FNV-1a 64 over `bytes`, continued from h, so data can be hashed in chunks:
// fnv1a64(b, fnv1a64(a)) == fnv1a64(a + b).
constexpr uint64_t fnv1a64(std::string_view bytes, uint64_t h = kFnv1a64Basis) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;  // the 64-bit FNV prime
  }
  return h;
}

// A hash as manifests write it: "fnv1a64:" and 16 lower-case hex digits.
inline std::string fnv1a64_text(uint64_t h) {
  char buf[8 + 16 + 1];
  std::snprintf(buf, sizeof buf, "fnv1a64:%016" PRIx64, h);
  return buf;
}

}  // namespace shardlab
