#pragma once
#include <memory>

#include "memory/pool.hpp"
#include "src/comm/communicator.hpp"
#include "src/comm/mpi_runtime.hpp"

namespace shardlab::test {
extern MpiRuntime* g_mpi;  // set by mpi_main.cpp

// The device and transport the runs of a multi-rank test binary use: $SHARDLAB_TEST_DEVICE (cpu,
// cuda) and $SHARDLAB_TEST_COMM (mpi, staged, nccl; default: mpi on the cpu, staged on cuda, so
// several ranks share one GPU). ctest registers the staged and CUDA variants; a CUDA variant
// without a device exits 77 (skipped) from mpi_main.cpp.
Device test_device();
CommKind test_comm();
std::unique_ptr<Backend> test_backend();  // one thread on the cpu
std::unique_ptr<Communicator> test_communicator(Pool& pool);
}  // namespace shardlab::test
