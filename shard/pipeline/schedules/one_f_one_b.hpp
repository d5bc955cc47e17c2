// one_f_one_b.hpp — the 1F1B merge that 1f1b and interleaved-1f1b share: warm-up forwards, then a
// forward and a backward in turn, then the remaining backwards.
#pragma once
#include <algorithm>
#include <vector>

#include "shard/pipeline/registry.hpp"

namespace shardlab {

// `total` forwards and backwards, the i-th of each fwd(i) and bwd(i), after `warmup` forwards.
template <class Fwd, class Bwd>
std::vector<PipeAction> one_f_one_b_order(int total, int warmup, Fwd fwd, Bwd bwd) {
  std::vector<PipeAction> l;
  for (int k = 0; k < warmup; ++k) l.push_back(fwd(k));
  for (int k = 0; k + warmup < total; ++k) {
    l.push_back(fwd(k + warmup));
    l.push_back(bwd(k));
  }
  for (int k = std::max(0, total - warmup); k < total; ++k) l.push_back(bwd(k));
  return l;
}

}  // namespace shardlab
