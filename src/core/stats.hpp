// stats.hpp — the one summary statistic the reports use for timings.
#pragma once
#include <algorithm>
#include <vector>

#include "src/core/check.hpp"

namespace shardlab {

// The median of a non-empty sample (the upper one of an even count), as step times are reported.
inline double median(std::vector<double> v) {
  SHARD_CHECK(!v.empty(), "median of an empty sample");
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace shardlab
