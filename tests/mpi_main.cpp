// mpi_main.cpp — Catch2 runner for multi-rank tests (ctest runs it as `mpirun -np N mpi_tests`).
// Every rank runs every test; the job fails when any rank fails. Tests issue all collectives
// before asserting, and assert with CHECK (never REQUIRE) after a collective, so a failure on one
// rank cannot leave the others waiting in a collective it skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "src/comm/mpi_runtime.hpp"
#include "tests/mpi_test_env.hpp"

namespace shardlab::test {
MpiRuntime* g_mpi = nullptr;
}

int main(int argc, char** argv) {
  shardlab::MpiRuntime mpi(&argc, &argv);
  shardlab::test::g_mpi = &mpi;
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  int failed = session.run();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (mpi.rank() == 0)
    std::printf("%s: %d ranks, %s\n", argv[0], mpi.world(), any_failed ? "FAILED on some rank" : "all ranks passed");
  return any_failed ? 1 : 0;
}
