// category.hpp — what each byte a rank holds is for. Every Pool allocation carries one.
#pragma once
#include <array>
#include <cstdint>
#include <string_view>

namespace shardlab {

enum class Category : uint8_t {
  param_shard,     // this rank's slice of the (compute-dtype) parameters
  param_full,      // gathered (unsharded) parameters of a unit, or a full replica
  grad_shard,      // this rank's slice of the reduced gradients
  grad_full,       // a unit's full gradient before it is reduced
  master_weights,  // fp32 master copy of the parameters (mixed precision)
  optim_state,     // optimizer moments (Adam m and v, SGD momentum)
  activations,     // tensors saved in forward for backward
  comm_buffer,     // staging buffers of collectives
  workspace,       // scratch that lives for one kernel or one unit
  secondary_shard, // ZeRO++ hpZ: a unit's parameters sharded within the node, from forward to backward
};
inline constexpr int kNumCategories = 10;

inline constexpr std::array<std::string_view, kNumCategories> kCategoryNames = {
    "param_shard", "param_full", "grad_shard", "grad_full", "master_weights",
    "optim_state", "activations", "comm_buffer", "workspace", "secondary_shard"};

inline std::string_view category_name(Category c) { return kCategoryNames[static_cast<int>(c)]; }

// Where a byte lives: the device's memory (--device-memory) or the host's (--host-memory; pinned
// on CUDA). On the CPU backend both tiers are RAM, with their own pools, budgets and copies.
enum class Tier : uint8_t { device, host };
inline constexpr int kNumTiers = 2;
inline std::string_view tier_name(Tier t) { return t == Tier::device ? "device" : "host"; }

}  // namespace shardlab
