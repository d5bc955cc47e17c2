// comm_stats.hpp — what a communicator counts: each call's operation, its bus bytes (the table in
// communicator.hpp) in the logical dtype and as the transport carried them, per step and per axis,
// and, for traces, each call as issued.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <vector>

#include "src/comm/axes.hpp"

namespace shardlab {

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
