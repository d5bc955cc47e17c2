// elem_range.hpp — a run of elements of a flat buffer (Backend::cast_ranges; a CUDA kernel's
// launch list, so no heavier header than this).
#pragma once
#include <cstdint>

namespace shardlab {

// Elements [offset, offset + count) of a flat buffer.
struct ElemRange {
  int64_t offset = 0, count = 0;
};

}  // namespace shardlab
