// The fuzz targets link the model families but never run a unit: expert parallelism's dispatch
// (src/model/parallel/ep.cpp) needs the communicator, which the fuzzers' clang cannot compile
// (std::source_location), so it is linked as traps here, as cp_unreachable.cpp does for cp.
#include <cstdlib>

#include "src/model/parallel/ep.hpp"

namespace shardlab::blocks {

[[noreturn]] static void unreachable() { std::abort(); }

void ep_experts_forward(UnitContext&, Saved&, Tensor, Tensor, std::span<const int32_t>, const MoeWeights&, int64_t) {
  unreachable();
}
void ep_experts_backward(UnitContext&, Saved&, Tensor, Tensor, std::span<const int32_t>, const MoeWeights&,
                         const MoeWeights&, int64_t) {
  unreachable();
}

}  // namespace shardlab::blocks
