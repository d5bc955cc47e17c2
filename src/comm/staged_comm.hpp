// staged_comm.hpp — StagedCommunicator: device buffers carried over MPI through host copies.
//
// For several ranks sharing one GPU, which NCCL refuses (one rank per device), so every multi-rank
// GPU test and comparison runs on a one-GPU machine. Each collective copies its device inputs to
// host staging buffers (pinned on CUDA, from Backend::raw_alloc_host), runs the MPI collective on
// them, and copies the results back when the Work is waited on. Host tensors pass straight to MPI.
//
// Its staging lives outside the rank's Pool, like NCCL's internal buffers: it is transport
// memory, not model memory, so the device ledger of a staged run equals an NCCL run's.
#pragma once
#include <mpi.h>

#include <memory>

#include "src/backend/backend.hpp"
#include "src/comm/communicator.hpp"

namespace shardlab {

// Duplicates `comm`. Device buffers move through `be` (any backend: on the CPU backend the copies
// are memcpys, which is how the staged path is tested without a GPU).
std::unique_ptr<Communicator> make_staged_communicator(MPI_Comm comm, Backend& be);

}  // namespace shardlab
