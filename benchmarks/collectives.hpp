// collectives.hpp — the collective benchmark, in nccl-tests' shape: for each collective, a sweep of
// sizes, each line `size count type redop root | time algbw busbw #wrong`.
//
//   size   bytes of the full buffer as nccl-tests counts it: the gathered buffer for all_gather,
//          the pre-scatter buffer for reduce_scatter, the buffer itself otherwise.
//   time   mean microseconds per call, slowest rank, over `iters` calls after `warmup` calls.
//   algbw  size / time.
//   busbw  algbw * factor; factor = 2(N-1)/N all_reduce, (N-1)/N all_gather, reduce_scatter,
//          gather and scatter, 1 broadcast and reduce. busbw is comparable across world sizes and with nccl-tests.
//   #wrong elements that differ from the locally computed expectation, in a separate checked call
//          on fresh inputs chosen so every dtype represents every sum exactly.
#pragma once
#include <cstdint>
#include <cstdio>
#include <vector>

#include "memory/pool.hpp"
#include "src/comm/communicator.hpp"

namespace shardlab {

struct CollectiveBenchConfig {
  std::vector<CommOp> ops = {CommOp::all_reduce, CommOp::reduce_scatter, CommOp::all_gather, CommOp::broadcast,
                             CommOp::reduce,     CommOp::gather,         CommOp::scatter};
  DType dtype = DType::f32;
  uint64_t min_bytes = 1024;
  uint64_t max_bytes = 64ull << 20;
  uint64_t step_factor = 4;
  int warmup = 3;
  int iters = 10;
};

// Times `comm`'s collectives and prints the tables on rank 0 (to `out`); returns the number of
// wrong elements over all ranks, on every rank. `processes` spans the processes that really run:
// times and wrong counts are combined over it. It is `comm` itself, except under the sim
// communicator, where one process stands in for every rank (then a sim world of one).
uint64_t run_collective_benchmark(Communicator& comm, Communicator& processes, Pool& pool,
                                  const CollectiveBenchConfig& cfg, std::FILE* out);

// "all_reduce,all_gather" -> ops; throws InputError on an unknown name.
std::vector<CommOp> parse_comm_ops(const std::string& list);

}  // namespace shardlab
