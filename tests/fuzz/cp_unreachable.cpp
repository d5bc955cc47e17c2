// The fuzz targets link the model families but never run a unit: context parallelism's attention
// (src/model/parallel/cp_attention.cpp) needs the communicator, which the fuzzers' clang cannot
// compile (std::source_location), so it is linked as traps here, as tp_unreachable.cpp does for tp.
#include <cstdlib>

#include "src/model/parallel/cp_attention.hpp"

namespace shardlab::cp {

[[noreturn]] static void unreachable() { std::abort(); }

Tensor attention_forward(UnitContext&, Saved&, Tensor, const blocks::AttentionShape&) { unreachable(); }
int64_t attention_scratch_elems(const UnitContext&, const blocks::AttentionShape&) { unreachable(); }
void attention_backward(UnitContext&, Saved&, Tensor, Tensor, Tensor, const blocks::AttentionShape&) { unreachable(); }
double micro_step_bus_bytes(const ModelSpec&, CpMethod, int, int, int, int64_t, Checkpointing) { unreachable(); }

}  // namespace shardlab::cp
