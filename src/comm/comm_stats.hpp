// comm_stats.hpp — what a communicator counts: each call's operation, its bus bytes (the table in
// communicator.hpp) in the logical dtype and as the transport carried them, per step and per axis,
// and, for traces, each call as issued; for a prediction's time, each call into its cost ledger.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <vector>

#include "src/comm/axes.hpp"

namespace shardlab {

class CostLedger;  // src/backend/cost.hpp

enum class CommOp : uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, reduce, gather, scatter, barrier, send, recv,
                              all_to_all, all_to_all_v };
inline constexpr int kNumCommOps = 12;
const char* comm_op_name(CommOp op);

struct OpCounter {
  uint64_t calls = 0;
  double bytes = 0;       // bus bytes in the logical dtype
  double wire_bytes = 0;  // bus bytes as carried by the transport
};

// A collective as issued, for traces: what, how many bus bytes, when.
struct CommEvent {
  CommOp op;
  double bytes;
  std::chrono::steady_clock::time_point issued;
};


struct CommStats {
  bool record_events = false;     // keep a CommEvent per call (off by default: it grows)
  std::vector<CommEvent> events;
  // A prediction's cost ledger: each call is written there with its axis and bus bytes, on the comm
  // stream (src/backend/cost.hpp). Communicators split after it is set inherit it.
  CostLedger* cost = nullptr;
  std::array<OpCounter, kNumCommOps> total{};
  std::array<OpCounter, kNumCommOps> step{};  // since the last end_step()
  int64_t steps = 0;                          // finished steps
  double last_step_bytes = 0;                 // bus bytes of the last finished step (nothing grows per step)
  std::array<double, kNumCommAxes> axis_step{}, last_step_axis{};  // bus bytes by axis (as step, last_step_bytes)

  void record(CommOp op, double bytes, double wire_bytes, CommAxis axis = CommAxis::world);
  void end_step();
  double total_bytes() const;
  double step_bytes() const;
};

}  // namespace shardlab
