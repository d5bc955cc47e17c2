// flat_param.hpp — FlatParam: one unit's parameters as one contiguous buffer, padded to a multiple
// of the world size so it splits into equal shards; rank r owns elements [r*S, (r+1)*S).
// Padding elements are zero, get zero gradients and stay zero.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "optim/optimizer.hpp"
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

// The optimizer's segments of elements [first, first + count) of a unit's flat buffer, relative to
// `first`: each tensor's range with its weight-decay flag; padding past the last tensor gets a
// no-decay segment (its gradient is zero, so it stays zero).
inline std::vector<ParamSegment> unit_segments(const UnitLayout& unit, int64_t first, int64_t count) {
  std::vector<ParamSegment> segs;
  const int64_t last = first + count;
  for (const TensorDecl& t : unit.tensors) {
    int64_t lo = std::max(first, t.offset), hi = std::min(last, t.offset + t.numel);
    if (lo < hi) segs.push_back({lo - first, hi - lo, t.decay});
  }
  if (last > unit.numel) {
    int64_t lo = std::max(first, unit.numel);
    segs.push_back({lo - first, last - lo, false});
  }
  return segs;
}

// The matrices Muon updates in a unit (torch.optim.Muon users' choice): every 2-D weight but the
// embeddings and the LM head (the units "embedding" and "head", where a tied copy lives too): the
// attention and MLP projections, each expert's matrices, the routers. The learning-rate ratio
// comes from Hugging Face's shape of the whole tensor; a tensor-parallel split is recorded.
inline std::vector<MuonMatrix> muon_matrices(const UnitLayout& unit, MuonAdjustLr how) {
  std::vector<MuonMatrix> out;
  if (unit.name == "embedding" || unit.name == "head") return out;
  for (const TensorDecl& t : unit.tensors) {
    if (t.shape.size() != 2 || t.tied_copy) continue;
    const std::vector<int64_t>& hf = t.full_shape.empty() ? t.shape : t.full_shape;
    MuonMatrix m{t.offset, t.shape[0], t.shape[1], muon_lr_ratio(how, hf[0], hf[1]), 0, -1, 1};
    if (t.tp.split() && unit.tp_degree > 1) m.tp_dim = t.tp.dim, m.tp_parts = t.tp.parts;
    out.push_back(m);
  }
  return out;
}

}  // namespace shardlab
