// The fuzz targets link the model families (the manifest names its family) but never run a unit:
// the tensor-parallel region collectives (src/model/tp.cpp) need the communicator, which the
// fuzzers' clang cannot compile (std::source_location), so they are linked as traps here.
#include <cstdlib>

#include "src/model/tp.hpp"

namespace shardlab {

[[noreturn]] static void unreachable() { std::abort(); }

int64_t tp_local_rows(const TpContext& tp, int64_t N) { return tp.sequence_parallel() ? (unreachable(), 0) : N; }
int64_t tp_unit_rows(const UnitContext&, const TpConfig&) { unreachable(); }
Block tp_whole_rows(UnitContext&, const std::string&) { unreachable(); }
Tensor tp_whole_or(const Block&, const UnitContext&, Tensor) { unreachable(); }
Tensor tp_region_input(UnitContext&, Tensor, Tensor) { unreachable(); }
void tp_region_input_backward(UnitContext&, Tensor, Tensor) { unreachable(); }
void tp_region_output(UnitContext&, Tensor, Tensor) { unreachable(); }
Tensor tp_region_output_backward(UnitContext&, Tensor, Tensor) { unreachable(); }
void tp_sum(UnitContext&, Tensor) { unreachable(); }
void tp_max(UnitContext&, Tensor) { unreachable(); }
TpPartialGrads::TpPartialGrads(UnitContext& c, const ParamSet&, std::vector<std::string>, const std::string&, bool)
    : c_(c) {
  unreachable();
}
Tensor TpPartialGrads::operator()(const std::string&) const { unreachable(); }
void TpPartialGrads::reduce() { unreachable(); }

}  // namespace shardlab
