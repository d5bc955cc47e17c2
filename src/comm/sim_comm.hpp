// sim_comm.hpp — SimCommunicator: one process plays rank r of a world of N.
//
// Used to measure per-rank memory and step time at world sizes this machine cannot host. Results
// have the sizes a real run produces, and the byte counters equal what a real run of N moves. The
// values follow one stated assumption: every other rank holds exactly what this rank holds. So
//   all_reduce(sum)     buf  <- N * buf           all_reduce(max)     buf unchanged
//   reduce_scatter(sum) recv <- N * send[chunk r] reduce_scatter(max) recv <- send[chunk r]
//   all_gather          every chunk <- send       broadcast           buf unchanged
//   reduce(sum) at root recv <- N * send          reduce(max)         recv <- send
//   gather at root      every chunk <- send       scatter             recv <- chunk r of send at
//                                                                     the root, else unchanged
// Numbers, not correctness: parity is tested with real ranks (mpi), never with sim.
#pragma once
#include <memory>

#include "memory/pool.hpp"
#include "src/comm/communicator.hpp"

namespace shardlab {

// Buffers may live on the host or on pool's device; data moves through pool's Backend.
std::unique_ptr<Communicator> make_sim_communicator(int rank, int world, Pool& pool);

}  // namespace shardlab
