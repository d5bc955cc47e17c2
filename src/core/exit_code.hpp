// exit_code.hpp — the exit codes of every shardlab program: the one table (docs/long-runs-and-faults.md,
// "Exit codes").
//
// Under mpirun (or --nproc) the job's code is the failing rank's (save 137: mpirun's own, ended by
// a rank's guard), so each code means one thing whichever rank reports it. Scripts branch on them
// (tests/faults, scripts/gpu-check.sh): a code's meaning never changes; a new failure kind gets a
// new number.
#pragma once

namespace shardlab {

enum class ExitCode : int {
  ok = 0,
  bad_input = 1,           // an option, a file, a size: one line naming the value (InputError)
  internal = 2,            // a failed check: file:line and the rank; every rank of the job ends
  wrong_results = 3,       // compare's losses disagree, bench-collectives found wrong elements
  out_of_memory = 4,       // past a rank's --device-memory or --host-memory budget, with what was live
  collective_timeout = 5,  // a collective did not complete within --collective-timeout (ranks named)
  interrupted = 130,       // Ctrl-C (SIGINT; 128 + 2, the shell's code): train saved first when it had a --save-dir
  mpirun_ended = 137,      // 128 + SIGKILL: a plain mpirun still waiting 5 s after a rank's report (on a host it
                           // cannot reach), ended by that rank's guard (src/comm/mpirun_guard.hpp)
  terminated = 143,        // 128 + SIGTERM: a stop not reached at a step boundary within --term-grace
                           // (term_grace.hpp), or one at the --nproc launcher before the run started
};

constexpr int exit_status(ExitCode c) { return static_cast<int>(c); }

// The --nproc launcher (tools/launch.cpp) names a file in this variable for its ranks' statuses,
// and its host (gethostname) in the next.
inline constexpr const char* kLauncherStatusVar = "SHARDLAB_LAUNCHER_STATUS";
inline constexpr const char* kLauncherHostVar = "SHARDLAB_LAUNCHER_HOST";
// The launcher's readiness file: each rank on the launcher's host appends its pid once its early
// stop handlers are in place (tools/main.cpp); the launcher holds a SIGTERM or Ctrl-C until every
// rank mpirun started there has (tools/launch.cpp).
inline constexpr const char* kLauncherReadyVar = "SHARDLAB_LAUNCHER_READY";

// What a rank that ends normally (every rank together, after MPI_Finalize) exits with. Under the
// --nproc launcher a non-zero status is written to the launcher's file and the rank exits 0, so
// mpirun adds no note about a process that "returned a non-zero exit code": the launcher exits with
// the status. Elsewhere (no launcher, or a plain mpirun) it is `status` itself.
int status_for_launcher(int status);

// A rank that ends the job abnormally (the watchdog's exit 5) tells the launcher too, keeping its
// status: mpirun, which may hang on an unreachable host, is then ended by the launcher. Only a rank
// on the launcher's host tells it: its report reached mpirun through a local pipe, while another
// host's may be cut off with its link (hosts sharing /tmp, as namespace hosts do, would otherwise
// have the launcher end mpirun before the reachable ranks' report).
void tell_launcher(int status);

}  // namespace shardlab
