// axes.hpp — the device mesh's axes as a table: the grid's axes, outermost first, and each
// communicator axis as the set of grid axes its groups vary along. Everything the mesh derives
// (sizes, coordinates, ranks within a group, the groups' colours, names) reads these rows, so a new
// parallel axis is a value of each enum, a degree and a coordinate, and a row here.
#pragma once
#include <array>
#include <cstdint>

namespace shardlab {

// The grid: world rank = mixed radix over these axes, the first outermost (the pipeline crosses
// nodes) and the last innermost (consecutive ranks: tensor parallelism stays inside a node, and
// context parallelism's K/V exchange next to it).
enum class GridAxis : uint8_t { pp, dp_replicate, dp_shard, ep, cp, tp };
inline constexpr int kNumGridAxes = 6;

// Which ranks a communicator spans: the whole world, or one axis (or group of axes) of the device
// mesh (src/comm/mesh.hpp): pipeline stages, data-parallel replicas, data-parallel shards, the whole
// data-parallel group (replicas x shards), tensor-parallel ranks. A sub-communicator counts its
// traffic in its own stats and in its parent's under its axis, so reports can say which link the
// bytes crossed (tp stays inside a node, pp crosses nodes). Context parallelism (cp) splits each
// sequence over its ranks, so they hold different tokens of the same sequences: their gradients
// add up like data-parallel ranks', and ZeRO/FSDP shard over dp_shard x cp (dp_shard_cp), DDP
// replicates over dp x cp (dp_cp). At cp 1 those are the dp_shard and dp groups themselves.
// ZeRO++ (--ranks-per-node R) cuts the shard group (dp_shard_cp) by node, world rank / R: the
// group's ranks on this rank's node (dp_shard_node) and those with this rank's place in their
// node, one per node (dp_shard_cross). They are no lines of the grid (grid bits 0): the Mesh
// derives them from the node size.
// Expert parallelism (--ep) draws its ranks from the data-parallel ones: they hold different tokens
// (the data-parallel group dp, and dp_cp, include ep) and different experts of a mixture of
// experts, which the ep group's all-to-alls send tokens to. Every other tensor is replicated over
// ep, so a strategy shards and reduces over the ranks that hold the same tensors, dp x cp without
// ep (edp_cp: Megatron's expert-data-parallel group), and the dense gradients are summed over ep
// after (shard/parallel_model.cpp). At ep 1 edp_cp is dp_cp itself.
enum class CommAxis : uint8_t { world, pp, dp_replicate, dp_shard, dp, tp, cp, dp_shard_cp, dp_cp, dp_shard_node,
                                dp_shard_cross, ep, edp_cp };
inline constexpr int kNumCommAxes = 13;

struct CommAxisRow {
  CommAxis axis;
  const char* name;
  uint8_t grid;  // bit g: its groups vary along GridAxis g
};
constexpr uint8_t grid_bit(GridAxis g) { return static_cast<uint8_t>(1u << static_cast<int>(g)); }
inline constexpr std::array<CommAxisRow, kNumCommAxes> kCommAxes = {{
    {CommAxis::world, "world", 0x3f},
    {CommAxis::pp, "pp", grid_bit(GridAxis::pp)},
    {CommAxis::dp_replicate, "dp_replicate", grid_bit(GridAxis::dp_replicate)},
    {CommAxis::dp_shard, "dp_shard", grid_bit(GridAxis::dp_shard)},
    {CommAxis::dp, "dp",
     static_cast<uint8_t>(grid_bit(GridAxis::dp_replicate) | grid_bit(GridAxis::dp_shard) | grid_bit(GridAxis::ep))},
    {CommAxis::tp, "tp", grid_bit(GridAxis::tp)},
    {CommAxis::cp, "cp", grid_bit(GridAxis::cp)},
    {CommAxis::dp_shard_cp, "dp_shard_cp", static_cast<uint8_t>(grid_bit(GridAxis::dp_shard) | grid_bit(GridAxis::cp))},
    {CommAxis::dp_cp, "dp_cp",
     static_cast<uint8_t>(grid_bit(GridAxis::dp_replicate) | grid_bit(GridAxis::dp_shard) | grid_bit(GridAxis::ep) |
                          grid_bit(GridAxis::cp))},
    {CommAxis::dp_shard_node, "dp_shard_node", 0},
    {CommAxis::dp_shard_cross, "dp_shard_cross", 0},
    {CommAxis::ep, "ep", grid_bit(GridAxis::ep)},
    {CommAxis::edp_cp, "edp_cp",
     static_cast<uint8_t>(grid_bit(GridAxis::dp_replicate) | grid_bit(GridAxis::dp_shard) | grid_bit(GridAxis::cp))},
}};
constexpr const CommAxisRow& comm_axis_row(CommAxis a) { return kCommAxes[static_cast<size_t>(a)]; }
constexpr bool spans(CommAxis a, GridAxis g) { return (comm_axis_row(a).grid & grid_bit(g)) != 0; }
const char* comm_axis_name(CommAxis a);

}  // namespace shardlab
