// sim_comm.hpp — SimCommunicator: one process plays rank r of a world of N.
//
// Used to measure and predict per-rank memory and step time at world sizes this machine cannot
// host. Results have the sizes a real run produces, and the byte counters equal what a real run
// of N moves. The values follow one stated assumption: every other rank holds exactly what this
// rank holds. So
//   all_reduce(sum)     buf  <- N * buf           all_reduce(max)     buf unchanged
//   reduce_scatter(sum) recv <- N * send[chunk r] reduce_scatter(max) recv <- send[chunk r]
//   all_gather          every chunk <- send       broadcast           buf unchanged
//   reduce(sum) at root recv <- N * send          reduce(max)         recv <- send
//   gather at root      every chunk <- send       scatter             recv <- chunk r of send at
//                                                                     the root, else unchanged
//   send                nothing moves             recv                buf unchanged
//   control exchanges   every rank sent what this rank sent; point-to-point control: nothing
//                       (so a receive has no sender's fingerprint to compare)
// Memory: the transport it stands in for is MPI, so it holds what the mpi communicator holds and
// for as long: a bf16/f16 reduction stages an f32 copy of its send buffer (and a received f32
// buffer for reduce_scatter, and for reduce at the root) until the Work is waited on, and results
// are written then. That is what makes a prediction on the meta backend equal an MPI run's ledger.
// Standing in for a GPU transport (nccl, staged: SimTransport::gpu) it holds nothing in the rank's
// pool, as they hold nothing there.
// Numbers, not correctness: parity is tested with real ranks (mpi), never with sim.
#pragma once
#include <memory>

#include "memory/pool.hpp"
#include "src/comm/communicator.hpp"

namespace shardlab {

// Which transport's memory the sim holds: mpi's f32 staging of reductions, or none (nccl, staged).
enum class SimTransport : uint8_t { mpi, gpu };
inline SimTransport sim_transport(CommKind k) { return k == CommKind::mpi ? SimTransport::mpi : SimTransport::gpu; }

// Buffers may live on the host or on pool's device; data moves through pool's Backend.
std::unique_ptr<Communicator> make_sim_communicator(int rank, int world, Pool& pool,
                                                    SimTransport transport = SimTransport::mpi);

}  // namespace shardlab
