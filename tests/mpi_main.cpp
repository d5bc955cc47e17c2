// mpi_main.cpp — Catch2 runner for multi-rank tests (ctest runs it as `mpirun -np N mpi_tests`).
// Every rank runs every test; the job fails when any rank fails. Tests issue all collectives
// before asserting, and assert with CHECK (never REQUIRE) after a collective, so a failure on one
// rank cannot leave the others waiting in a collective it skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "src/comm/mpi_runtime.hpp"
#include "tests/mpi_test_env.hpp"

#include <cstdlib>
#include <string>

#include "src/backend/backend.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/comm/nccl_comm.hpp"
#include "src/comm/staged_comm.hpp"

namespace shardlab::test {
MpiRuntime* g_mpi = nullptr;

namespace {
std::string env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}
}  // namespace

Device test_device() { return parse_device(env("SHARDLAB_TEST_DEVICE", "cpu")); }

CommKind test_comm() {
  const Device d = test_device();
  return resolve_comm(parse_comm(env("SHARDLAB_TEST_COMM", d == Device::cuda ? "staged" : "mpi")), d,
                      g_mpi->local_size(), d == Device::cuda ? cuda_device_count() : 0);
}

std::unique_ptr<Backend> test_backend() {
  BackendConfig bc;
  bc.threads = 1;
  bc.local_rank = g_mpi->local_rank();
  return test_device() == Device::cuda ? make_cuda_backend(bc) : make_cpu_backend(bc);
}

std::unique_ptr<Communicator> test_communicator(Pool& pool) {
  switch (test_comm()) {
    case CommKind::staged: return make_staged_communicator(MPI_COMM_WORLD, pool.backend());
    case CommKind::nccl: return make_nccl_communicator(MPI_COMM_WORLD, pool.backend());
    default: return make_mpi_communicator(MPI_COMM_WORLD, pool);
  }
}
}  // namespace shardlab::test

int main(int argc, char** argv) {
  shardlab::MpiRuntime mpi(&argc, &argv);
  shardlab::test::g_mpi = &mpi;
  if (shardlab::test::test_device() == shardlab::Device::cuda && shardlab::cuda_device_count() == 0) {
    if (mpi.rank() == 0)
      std::printf("SKIPPED: %s with SHARDLAB_TEST_DEVICE=cuda: %s\n", argv[0],
                  shardlab::cuda_compiled() ? "no CUDA device is visible" : "shardlab was built without CUDA");
    return 77;
  }
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  int failed = session.run();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (mpi.rank() == 0)
    std::printf("%s: %d ranks, %s\n", argv[0], mpi.world(), any_failed ? "FAILED on some rank" : "all ranks passed");
  return any_failed ? 1 : 0;
}
