// schedule.hpp — pipeline parallelism as data: how the units split into stages, and each rank's
// list of forward/backward actions for a step (the schedule), built once and checked before any
// of it runs. The runner (shard/pipeline/executor) executes one rank's list; nothing here computes.
//
// Chunks: the U units split into P x V contiguous chunks in model order (V = --pp-virtual, 1
// without virtual stages). Chunk c lives on pipeline rank c % P as that rank's virtual stage c / P
// (Megatron's interleaving: rank r holds chunks r, r + P, r + 2P, ...), so activations always flow
// from rank r to rank (r + 1) % P, and gradients back. A schedule placed in a V (zb-v: V = 2,
// PpScheduleDef::v_shape) puts chunk c on rank c for c < P and on rank 2P - 1 - c after: rank r
// holds chunks r and 2P - 1 - r, activations flow down the ranks and back up, and the turn (chunk
// P - 1 to chunk P) and the loss stay on rank P - 1 and rank 0: those messages never leave the rank.
//
// The schedules themselves (their orders over M micro-batches, requirements and bubbles) are
// registry entries, one file each under shard/pipeline/schedules/ (registry.hpp).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "shard/pipeline/registry.hpp"

namespace shardlab {

// The pipeline rank of `chunk` of P x V: interleaved (c % P) or in a V (c, then 2P - 1 - c).
inline int chunk_rank(int chunk, int pp, bool v_shape) {
  return v_shape && chunk >= pp ? 2 * pp - 1 - chunk : chunk % pp;
}

// The units of each chunk, in model order: chunk c holds units [begin(c), begin(c) + count(c)).
struct StageSplit {
  int pp = 1, virtual_stages = 1;
  std::vector<int> counts;  // P x V entries, each >= 1, summing to the number of units
  bool v_shape = false;     // chunks placed in a V (two per rank), not interleaved
  int chunks() const { return pp * virtual_stages; }
  int rank_of(int chunk) const { return chunk_rank(chunk, pp, v_shape); }
  int begin(int chunk) const;                 // its first unit
  int count(int chunk) const { return counts[static_cast<size_t>(chunk)]; }
  int chunk_of_unit(int unit) const;
  // The chunks of pipeline rank r, in model order (its virtual stages 0..V-1).
  std::vector<int> chunks_of(int r) const;
  // The units of pipeline rank r, in model order (chunk by chunk).
  std::vector<int> units_of(int r) const;
  std::string describe() const;  // "stage 0: units 0-3 (embedding .. h.2) | stage 1: ..." given names
  std::string describe(const std::vector<std::string>& unit_names) const;
};

// Units split as given (--pp-split 3,3,2: one count per chunk, P x V of them). InputError when
// the counts are not P x V positive numbers summing to `units`.
StageSplit explicit_split(const std::vector<int>& counts, int pp, int virtual_stages, int units);
// Units split by cost: `cost[u]` of each unit (predicted time: its FLOPs per token plus, for the
// embedding and the head, their weight), contiguous chunks minimising the largest chunk's cost
// (ties: the earlier chunks lighter). InputError when there are fewer units than P x V chunks.
StageSplit balanced_split(const std::vector<double>& cost, int pp, int virtual_stages);
// "3,3,2" -> {3, 3, 2}; InputError for anything else (names the text).
std::vector<int> parse_pp_split(const std::string& s);

// Every rank's actions for one step, in the order it runs them.
struct PipeSchedule {
  PpSchedule kind;
  int pp = 1, virtual_stages = 1, micro_batches = 1;
  std::vector<std::vector<PipeAction>> ranks;  // pp lists
  int rank_of(int chunk) const { return chunk_rank(chunk, pp, kind->v_shape); }
  // The most micro-batches whose forward has run and whose backward has not, at once, per rank
  // and chunk: what the schedule makes a stage hold (every micro-batch for gpipe, ...).
  int in_flight(int rank) const;
  // Split backwards: the most micro-batches whose backward (B) has run and whose weight action (W)
  // has not, at once: what the stage keeps for its deferred weight gradients (0 without a split).
  int weights_owed(int rank) const;
  std::string describe() const;  // one line per rank: "rank 0: F0c0 F1c0 B0c0 ..."
};

// The schedule, built and checked (check_schedule). InputError for a combination that has none
// (M < 1, or one its entry's requirements refuse: require_pp_schedule). A runnable but poor one
// (1f1b with M < P) runs: printing the entry's warning is the caller's.
PipeSchedule build_schedule(PpSchedule kind, int pp, int virtual_stages, int micro_batches);
// The same, built and checked anew (build_schedule keeps what it built: schedule_cache.cpp).
PipeSchedule build_schedule_uncached(PpSchedule kind, int pp, int virtual_stages, int micro_batches);
// InternalError naming the first violation: each (chunk, micro) forward and backward exactly once,
// on the chunk's rank; a chunk's backward of m after its own forward of m; where the schedule
// splits backwards, each weight action once, after its backward, in the order of the rank's
// backwards (and none where it does not); and the schedule runs
// to completion under the runner's point-to-point semantics, simulated:
//   - a forward of chunk c > 0 needs the activation of (c - 1, m) from rank_of(c - 1); a backward
//     of chunk c < last needs the gradient of (c + 1, m) from rank_of(c + 1); the first chunk's
//     forward and the last chunk's backward need nothing;
//   - after computing, a forward of c < last sends its activation to rank_of(c + 1), a backward of
//     c > 0 its gradient to rank_of(c - 1): the send is posted and the rank moves on;
//   - at each action the rank posts the receive of its message (if it needs one) and those of the
//     next forward and the next backward after it that need one (Megatron pairs each send with the
//     next receives so; its interleaved order deadlocks without it), or under a schedule that posts
//     per chunk (zb-v) those of the next forward and backward of each of its chunks from that action
//     on (receives_to_post); a message between two chunks of one rank is handed over, never
//     received, and is not waited for beyond its arrival; at an action that needs a message
//     it then waits until every send it has posted is received (a send completes once its receiver
//     has posted the receive for it: the runner frees the sent buffer there), then for its message;
//   - a weight action needs and sends nothing;
//   - at the end of its list it waits for its posted sends.
// Messages are told apart by (kind, chunk, micro), not by their order. A state where no rank can
// advance is a deadlock: the error names each rank's position and what it waits for.
void check_schedule(const PipeSchedule& s);

// The receives a rank posts on reaching action i of its `list` (check_schedule's rule for `kind`):
// the indices of the actions whose messages they are, in the order posted. `remote(a)`: whether
// action a takes a message from another rank.
std::vector<size_t> receives_to_post(PpSchedule kind, const std::vector<PipeAction>& list, size_t i,
                                     const std::function<bool(const PipeAction&)>& remote);

// The schedule's theory (its entry's): the bubble's share of a step (0 for pp 1).
double bubble_fraction(PpSchedule kind, int pp, int virtual_stages, int micro_batches);

// The time of each pass (per chunk) in the simulation: a forward, a backward's input gradient (B)
// and its weight gradients (W). A schedule that does not split backwards runs B + W as one action.
struct PassTimes {
  double forward = 1, input = 1, weight = 1;
};
// The schedule run under check_schedule's semantics with these times and messages taking no time:
// the step's makespan, and each rank's idle share of it (1 - its compute / the makespan) averaged
// over the ranks. InternalError for a schedule that does not pass check_schedule.
double simulated_makespan(const PipeSchedule& s, PassTimes t);
double simulated_bubble(const PipeSchedule& s, PassTimes t);
// The theory's convention: a backward of `backward_time`, split evenly into B and W where split.
double simulated_bubble(const PipeSchedule& s, double forward_time, double backward_time);

}  // namespace shardlab
