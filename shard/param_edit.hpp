// param_edit.hpp — a change of parameters the optimizer does not make (DeepSeek-V3's correction
// bias, moved by the experts' loads: blocks/moe.hpp), which Strategy::optimizer_step makes with its
// update, on whatever copy each rank updates (the f32 master under mixed precision, a ZeRO shard).
#pragma once
#include <cstdint>
#include <functional>
#include <span>

#include "src/model/spec.hpp"

namespace shardlab {

// For each tensor `pick` selects, each part of it the rank updates: fn(unit, tensor, first, values)
// changes the part's f32 values in place, values[i] being the tensor's element first + i.
// Value-initialised ({}): no edit.
struct ParamEdit {
  bool (*pick)(const TensorDecl&);
  std::function<void(const UnitLayout&, const TensorDecl&, int64_t first, std::span<float> values)> fn;
};

}  // namespace shardlab
