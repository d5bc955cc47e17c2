// mpi_comm.hpp — MpiCommunicator: CPU buffers over MPI's non-blocking collectives.
#pragma once
#include <mpi.h>

#include <memory>

#include "memory/pool.hpp"
#include "src/comm/communicator.hpp"

namespace shardlab {

// Duplicates `comm` (so shardlab's traffic never matches a user's) and frees the duplicate on
// destruction. Staging buffers for widened bf16/f16 reductions come from `pool` as comm_buffer.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, Pool& pool);

}  // namespace shardlab
