#include "src/comm/mpi_backed.hpp"

#include "src/comm/mpi_comm.hpp"
#include "src/comm/mpi_runtime.hpp"

namespace shardlab {

MpiBackedCommunicator::MpiBackedCommunicator(MPI_Comm comm, Backend& be) : be_(be), host_pool_(be.host()) {
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  mpi_ = make_mpi_communicator(comm_, host_pool_);
}

MpiBackedCommunicator::~MpiBackedCommunicator() {
  mpi_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

std::unique_ptr<Communicator> MpiBackedCommunicator::do_split(int color, int key, int, int) {
  MPI_Comm part = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(comm_, color, key, &part));
  std::unique_ptr<Communicator> c = same_kind(part);  // duplicates it
  MPI_CHECK(MPI_Comm_free(&part));
  return c;
}

}  // namespace shardlab
