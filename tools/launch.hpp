// launch.hpp — how shardlab's programs start their ranks.
//
// `mpirun -np N prog ...` works as it does for any MPI program. `prog ... --nproc N` does the same
// by running itself under mpirun, with the flags a small machine needs: --oversubscribe
// (more ranks than cores: tests use 4 ranks on 2 cores), --bind-to none (a rank's threads may use
// any core), and --allow-run-as-root when running as root (containers, CI).
#pragma once
#include <string>
#include <vector>

namespace shardlab {

// True when this process was started by an MPI launcher (mpirun, srun with PMI/PMIx).
bool under_mpi_launcher();

// Removes "--nproc N" / "--nproc=N" from args and returns N, or 0 when absent. Throws InputError
// on a missing or non-positive value.
int take_nproc(std::vector<std::string>& args);

// The mpirun command line that runs `exe args...` on nproc ranks ($SHARDLAB_MPIRUN overrides mpirun).
std::vector<std::string> mpirun_command(int nproc, const std::string& exe, const std::vector<std::string>& args);

// Call first in main(). With --nproc N and no launcher around us: run mpirun as a child and exit
// with the job's status (launch.cpp says why a child; does not return).
// Under a launcher, checks that N matches the world size. Returns the arguments without --nproc.
std::vector<std::string> launch_or_continue(int argc, char** argv);

}  // namespace shardlab
