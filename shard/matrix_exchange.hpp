// matrix_exchange.hpp — Muon's MatrixExchange (optim/muon.hpp) over one of the mesh's groups: a
// ZeRO shard group (a unit's slices made whole) or the tensor-parallel group (a matrix's parts).
#pragma once
#include "optim/muon.hpp"
#include "src/comm/communicator.hpp"

namespace shardlab {

class CommExchange final : public MatrixExchange {
 public:
  explicit CommExchange(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int ranks() const override { return comm_.world_size(); }
  void gather(Tensor part, Tensor whole) override { comm_.all_gather(part, whole).wait(); }
  void scatter(Tensor whole, Tensor part) override { comm_.reduce_scatter(whole, part).wait(); }

 private:
  Communicator& comm_;
};

}  // namespace shardlab
