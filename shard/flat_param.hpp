// flat_param.hpp — FlatParam: one unit's parameters as one contiguous buffer, padded to a multiple
// of the world size so it splits into equal shards; rank r owns elements [r*S, (r+1)*S).
// Padding elements are zero, get zero gradients and stay zero.
#pragma once
#include <cstdint>

#include "src/model/spec.hpp"

namespace shardlab {

struct FlatParam {
  const UnitLayout* unit = nullptr;
  int world = 1, rank = 0;
  int64_t numel = 0;   // real elements
  int64_t padded = 0;  // numel rounded up to a multiple of world
  int64_t shard = 0;   // padded / world
  int64_t shard_begin() const { return static_cast<int64_t>(rank) * shard; }
};

inline FlatParam make_flat_param(const UnitLayout& unit, int world, int rank) {
  FlatParam f;
  f.unit = &unit;
  f.world = world;
  f.rank = rank;
  f.numel = unit.numel;
  f.padded = (unit.numel + world - 1) / world * world;
  f.shard = f.padded / world;
  return f;
}

}  // namespace shardlab
