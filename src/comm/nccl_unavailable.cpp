// nccl_unavailable.cpp — the NCCL communicator of a build without CUDA: a clear error.
#include "src/comm/nccl_comm.hpp"

namespace shardlab {

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, Backend&) {
  throw InputError("--comm nccl: shardlab was built without CUDA and NCCL (configure with -DSHARDLAB_CUDA=ON)");
}

}  // namespace shardlab
