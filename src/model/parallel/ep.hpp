// ep.hpp — expert parallelism (--ep D): a mixture of experts' E experts split over the D ranks of an
// ep group in contiguous blocks of E / D (EpConfig), the tokens sent to their experts and the results
// brought back by all-to-all (GShard; Megatron's and torchtitan's token dispatcher).
//
// Every rank routes its own tokens over all E experts (the router is whole on each rank) and sorts
// its kept slots by expert (blocks/moe.cpp), so the rows bound for each peer are one contiguous run
// of its buffer. Per layer:
//
//   counts    an all-to-all of E / D counts per peer: how many rows of each of the peer's experts
//             this rank sends, and of each of its own experts it receives from each peer.
//   dispatch  an all-to-all of the rows (variable counts); the received rows (peer-major) are
//             reordered expert-major, so each local expert is one GEMM pair over one run of rows.
//   combine   the results reordered peer-major and sent back the same way: each rank gets its
//             slots' outputs in the order it sent them, and combines them as without --ep.
//
// Backward sends d(y) the dispatch's way and returns d(x) the combine's way. A rank's expert rows
// depend on the routing of the whole group: dropless, the buffers are sized to what arrives, so
// measured memory follows the routing, and the meta backend (plan, profile) assumes every rank
// routes as evenly as its round robin does; under --moe-capacity-factor they are sized for the
// capacity (every peer's full share), and measured = predicted.
#pragma once
#include <span>

#include "src/model/blocks/moe.hpp"

namespace shardlab {

// What a rank's MoE layers need to reach the experts of its ep group (UnitContext::ep points at it;
// none at --ep 1): which block of experts it holds, the group's communicator, and the seconds spent
// in the group's collectives, calls and waits (the trainer reads and resets it each step).
struct EpContext {
  EpConfig config;
  Communicator* comm = nullptr;
  double wait_s = 0;
  bool active() const { return config.degree > 1; }
};

}  // namespace shardlab

namespace shardlab::blocks {

// xs (kept, C): this rank's kept slots' tokens sorted by expert (per_expert: E counts); y (kept, C)
// receives their experts' outputs in the same order. What backward needs is saved in s ("moe_*").
// capacity: the rows an expert takes from each rank under --moe-capacity-factor (0: dropless); with
// one, the buffers are sized for every peer's full share, so memory does not follow the routing.
void ep_experts_forward(UnitContext& c, Saved& s, Tensor xs, Tensor y, std::span<const int32_t> per_expert,
                        const MoeWeights& w, int64_t capacity);
// dy (kept, C): d(y) in xs's order; dxs (kept, C) receives d(xs); the local experts' gradients
// accumulate into g.
void ep_experts_backward(UnitContext& c, Saved& s, Tensor dy, Tensor dxs, std::span<const int32_t> per_expert,
                         const MoeWeights& w, const MoeWeights& g, int64_t capacity);

}  // namespace shardlab::blocks
