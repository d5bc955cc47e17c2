// mpi_backed.hpp — the part the GPU transports (staged, nccl) share: an mpi communicator of their
// own over a duplicate of the MPI communicator, which gives them their rank and size, their
// control channel, a path for host buffers, and MPI_Comm_split for sub-communicators. Its f32
// staging of bf16/f16 reductions comes from a private pool on the host backend: transport memory,
// outside the rank's ledger (as NCCL's buffers are).
#pragma once
#include <mpi.h>

#include <memory>

#include "memory/pool.hpp"
#include "src/comm/communicator.hpp"

namespace shardlab {

class MpiBackedCommunicator : public Communicator {
 public:
  MpiBackedCommunicator(MPI_Comm comm, Backend& be);  // duplicates comm
  ~MpiBackedCommunicator() override;
  int rank() const override { return mpi_->rank(); }
  int world_size() const override { return mpi_->world_size(); }

 protected:
  std::vector<std::string> exchange(const std::string& mine) override { return mpi_->all_gather_strings(mine); }
  void do_post_control(int peer, const std::string& bytes) override { mpi_->post_control(peer, bytes); }
  std::string do_take_control(int peer) override { return mpi_->take_control(peer); }
  // A communicator of the same kind over MPI_Comm_split of this one.
  std::unique_ptr<Communicator> do_split(int color, int key, int size, int rank) override;
  virtual std::unique_ptr<Communicator> same_kind(MPI_Comm comm) = 0;

  Backend& be_;
  Pool host_pool_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::unique_ptr<Communicator> mpi_;  // host buffers, control, barrier
};

}  // namespace shardlab
