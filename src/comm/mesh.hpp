// mesh.hpp — ParallelDims and Mesh: one layout of the ranks for every parallel axis.
//
// The world is a 6-D grid, pp x dp_replicate x dp_shard x ep x cp x tp (the rows of
// src/comm/axes.hpp), with tp innermost (consecutive ranks: tensor parallelism stays inside a node)
// and pp outermost (the pipeline crosses nodes):
//
//   world rank = ((((pp_i * dp_replicate + replicate_i) * dp_shard + shard_i) * ep + ep_i) * cp + cp_i) * tp + tp_i
//
// An ep group varies ep_i: data-parallel ranks that hold different experts of a mixture of experts
// (expert parallelism); the data-parallel group dp spans replicate_i, shard_i and ep_i.
//
// A cp group varies cp_i: the ranks that split each of their sequences (context parallelism).
//
// Every group is a line or a plane of that grid: a tp group varies tp_i, a dp_shard group shard_i,
// a dp_replicate group replicate_i, the data-parallel group (dp) both replicate_i and shard_i, a pp
// group pp_i. ZeRO/FSDP shard over dp_shard and replicate over dp_replicate (hybrid sharding when
// both exceed 1); DDP and DP replicate over the whole dp group. The Mesh is built once from the
// world communicator and is the only code that splits communicators; it keeps no rank arithmetic
// anywhere else.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "src/comm/communicator.hpp"

namespace shardlab {

// The degree of each axis (torchtitan's ParallelDims). 0 leaves a data-parallel degree to what the
// others leave of the world: dp_shard when neither is given (plain ZeRO/FSDP), the one not given
// otherwise (--dp-shard S alone is hybrid sharding over world / S replicas).
struct ParallelDims {
  int pp = 1;
  int dp_replicate = 0;
  int dp_shard = 0;
  int tp = 1;
  int cp = 1;  // last, so {pp, dp_replicate, dp_shard, tp} still reads as it always did
  // Expert parallelism: data-parallel ranks that split a mixture of experts' experts between them
  // (the data-parallel degree dp() is dp_replicate x dp_shard x ep).
  int ep = 1;

  // Both data-parallel degrees filled in and the product checked against `world`: InputError
  // naming every degree and the world otherwise. Resolving resolved dims again only checks them.
  ParallelDims resolved(int world) const;
  bool is_resolved() const { return dp_replicate > 0 && dp_shard > 0; }
  int dp() const { return dp_replicate * dp_shard * ep; }  // the ranks that hold different tokens (x cp)
  // Hybrid sharding: the state replicated over more than one shard group.
  bool hybrid() const { return dp_replicate > 1 || (dp_shard > 0 && dp_replicate == 0); }  // data-parallel ranks (replicas x shards)
  int world() const { return pp * dp() * cp * tp; }
  int size(CommAxis a) const;  // ranks of one group along a (world: all of them)
  // The degree along grid axis g (src/comm/axes.hpp): the one place a grid axis meets its field.
  int degree(GridAxis g) const {
    static constexpr int ParallelDims::*field[kNumGridAxes] = {
        &ParallelDims::pp, &ParallelDims::dp_replicate, &ParallelDims::dp_shard, &ParallelDims::ep, &ParallelDims::cp,
        &ParallelDims::tp};
    return this->*field[static_cast<int>(g)];
  }
  bool operator==(const ParallelDims&) const = default;
  // "pp 1 x dp_replicate 2 x dp_shard 2 x tp 1" (" x ep E" and " x cp C" before tp when above 1)
  std::string describe() const;

};

// A rank's place in the grid.
struct MeshCoord {
  int pp = 0, dp_replicate = 0, dp_shard = 0, tp = 0, cp = 0, ep = 0;
  int rank_in(CommAxis a, const ParallelDims& d) const;  // its rank within its group along a
  // The coordinate along grid axis g (src/comm/axes.hpp).
  int& at(GridAxis g) { return this->*field(g); }
  int at(GridAxis g) const { return this->*field(g); }
  static int MeshCoord::*field(GridAxis g) {
    static constexpr int MeshCoord::*fields[kNumGridAxes] = {
        &MeshCoord::pp, &MeshCoord::dp_replicate, &MeshCoord::dp_shard, &MeshCoord::ep, &MeshCoord::cp, &MeshCoord::tp};
    return fields[static_cast<int>(g)];
  }
};
MeshCoord mesh_coord(const ParallelDims& d, int world_rank);
int mesh_rank(const ParallelDims& d, const MeshCoord& c);
// Whether the group along `a` that holds `me` spans more than one node of `ranks_per_node` ranks
// (never without a node size; the node-cut groups of ZeRO++ are the Mesh's to answer).
bool group_crosses_nodes(const ParallelDims& d, const MeshCoord& me, CommAxis a, int ranks_per_node);

class Mesh {
 public:
  // Collective over `world`: one communicator per axis group this rank belongs to, split in a fixed
  // order, so each axis counts its own traffic; the data-parallel group is `world` itself when it
  // spans the world. `dims` must be resolved against world.world_size(). ranks_per_node > 0
  // (--ranks-per-node) tells which groups cross a node boundary; with node_groups (ZeRO++'s hpZ and
  // qgZ) the shard group is also split by node (dp_shard_node, dp_shard_cross): InputError when
  // the world or the shard group does not divide into equal nodes.
  Mesh(Communicator& world, ParallelDims dims, int ranks_per_node = 0, bool node_groups = false);
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const ParallelDims& dims() const { return dims_; }
  const MeshCoord& coord() const { return me_; }
  Communicator& world() { return world_; }
  // The group along a; at cp 1 the cp group has no communicator (nothing asks for one).
  Communicator& comm(CommAxis a) {
    SHARD_CHECK(comms_[static_cast<size_t>(a)], "no {} communicator on a mesh {}", comm_axis_name(a), dims_.describe());
    return *comms_[static_cast<size_t>(a)];
  }
  Communicator& dp() { return comm(CommAxis::dp); }
  // The ranks whose gradients add up: the data-parallel ranks and, under context parallelism, the
  // ranks holding other pieces of their sequences (dp at cp 1).
  Communicator& dp_cp() { return comm(CommAxis::dp_cp); }
  // The ranks that hold the same tensors and add up their gradients: dp_cp without ep (dp_cp itself
  // at ep 1), what a strategy shards and reduces over.
  Communicator& edp_cp() { return comm(CommAxis::edp_cp); }
  int rank(CommAxis a) const { return node_axis(a) ? comms_[static_cast<size_t>(a)]->rank() : me_.rank_in(a, dims_); }
  int size(CommAxis a) const {
    return node_axis(a) ? comms_[static_cast<size_t>(a)]->world_size() : dims_.size(a);
  }
  // Ranks per node (0: the whole world is one node), and whether this rank's group along a spans
  // more than one node (its bytes cross the slower link).
  int ranks_per_node() const { return ranks_per_node_; }
  bool crosses_nodes(CommAxis a) const;
  // Every communicator of this rank whose group spans nodes paces its calls to bytes_per_s
  // (Communicator::pace): an emulated network between nodes, for benchmarks on one machine.
  void pace_inter_node(double bytes_per_s);
  bool has(CommAxis a) const { return comms_[static_cast<size_t>(a)] != nullptr; }
  int dp_rank() const { return rank(CommAxis::dp); }
  int dp_size() const { return size(CommAxis::dp); }
  // Pipeline neighbours as ranks of comm(CommAxis::pp); -1 at the first (prev) or last (next) stage.
  int pp_prev() const { return me_.pp > 0 ? me_.pp - 1 : -1; }
  int pp_next() const { return me_.pp + 1 < dims_.pp ? me_.pp + 1 : -1; }
  // Pipeline parallelism: the ranks of the first and the last stage with this rank's tensor-parallel
  // coordinate (2 x dp x cp ranks; Megatron's embedding group), over which a tied token embedding's
  // gradient is summed; null at pp 1 and on the stages between. Counted on the pp axis.
  Communicator* tied() { return tied_; }
  // Bus bytes of the last finished step that crossed each axis, as the world communicator counted
  // them (its own traffic under world).
  const std::array<double, kNumCommAxes>& last_step_bytes() const { return world_.stats().last_step_axis; }
  // The same summed over the axes whose groups stay inside a node and over those that cross one
  // (crosses_nodes; everything is intra-node without --ranks-per-node).
  struct LinkBytes {
    double intra = 0, inter = 0;
  };
  LinkBytes last_step_bytes_by_link() const;

 private:
  bool node_axis(CommAxis a) const {
    const bool n = a == CommAxis::dp_shard_node || a == CommAxis::dp_shard_cross;
    SHARD_CHECK(!n || comms_[static_cast<size_t>(a)], "no {} communicator: the mesh was built without --ranks-per-node",
                comm_axis_name(a));
    return n;
  }
  void split_nodes();
  Communicator& world_;
  ParallelDims dims_;
  int ranks_per_node_ = 0;
  MeshCoord me_;
  std::array<Communicator*, kNumCommAxes> comms_{};
  Communicator* tied_ = nullptr;
  std::vector<std::unique_ptr<Communicator>> owned_;
};


}  // namespace shardlab
