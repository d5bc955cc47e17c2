// nccl_comm.hpp — NcclCommunicator: device buffers over NCCL, one rank per GPU.
//
// The ncclUniqueId travels over MPI; collectives run on the backend's comm stream, which first
// waits on an event recorded on the compute stream (so inputs are complete), and Work::wait makes
// the compute stream wait on the collective's event: ordering by events only, no host sync, so
// communication overlaps the kernels issued after it. Host tensors (a gradient norm, a loss) go
// over MPI instead. bf16/f16 reduce natively (no widening, no staging).
#pragma once
#include <mpi.h>

#include <memory>

#include "src/backend/backend.hpp"
#include "src/comm/communicator.hpp"

namespace shardlab {

// Duplicates `comm`; `be` must be the CUDA backend. Throws InputError without CUDA/NCCL, or when
// two ranks of `comm` share a GPU (NCCL refuses that: use the staged communicator).
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, Backend& be);

}  // namespace shardlab
