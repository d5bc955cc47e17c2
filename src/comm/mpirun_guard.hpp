// mpirun_guard.hpp — a plain mpirun that waits on a host it cannot reach is ended, not left hanging.
//
// When a rank ends the job (the watchdog's report, exit 5), Open MPI 4.1's mpirun tells every host's
// daemon to end its ranks and waits for each to answer. A daemon behind a link that went down never
// answers, and mpirun waits out TCP's retransmissions (a quarter of an hour) before it notices. The
// --nproc launcher ends such an mpirun itself (tools/launch.cpp) and exits 5. Under a plain mpirun
// (what a cluster's users run) the rank that reported says, with its report, that mpirun will be
// ended, and leaves a small process behind: when mpirun is the rank's parent and still there kGraceS
// (5 s) after the report, it ends mpirun with SIGKILL, so the job exits 137 (128 + SIGKILL; the
// exit-code table). The ranks on the host mpirun cannot reach end on their own timeout.
#pragma once
#include <string>

namespace shardlab {

// Called by the rank that reported, just before it exits; `who` begins its line ("shardlab [rank
// 0/4]"). Does nothing under the --nproc launcher, or when the parent is not mpirun (another host's
// daemon, srun's slurmstepd: see docs/long-runs-and-faults.md for Slurm).
void guard_stuck_mpirun(const std::string& who);

}  // namespace shardlab
