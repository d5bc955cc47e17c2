// term_grace.hpp — --term-grace: how long a stop signal may wait for the step boundary.
//
// A stop (SIGTERM, SIGUSR1, a saving Ctrl-C) is honoured between steps: the run saves a checkpoint
// and ends (run.cpp). A step that takes hours would hold it past what a scheduler grants before its
// SIGKILL (Kubernetes' 30 s, Slurm's KillWait). So a stop the run has not reached a step boundary
// for within the grace ends the process at once: exit 143 (128 + SIGTERM), saying so and that the
// newest complete checkpoint is intact (saves are atomic: a directory is complete or absent). At the
// boundary the stop is honoured and the grace no longer applies (the save that follows may take what
// it takes). 0: no grace, the stop waits for the step however long.
#pragma once
#include <string>

namespace shardlab {

// Starts the grace's thread (once per process) and sets the grace and what the message names: the
// run's --save-dir ("" none) and its total steps.
void arm_term_grace(double seconds, const std::string& save_dir, long long steps);
// A stop was asked (the first one counts). Async-signal-safe: a signal handler may call it.
void term_grace_signalled(int sig);
// A step ended with a stop pending (the boundary that honours it), or the run is ending: no grace.
void term_grace_honoured();
// The step the run is in (1-based), for the message.
void term_grace_step(long long step);

}  // namespace shardlab
