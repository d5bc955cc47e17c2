// watchdog.hpp — --collective-timeout: a rank that stops making progress ends the job, named.
//
// Each rank publishes, in a small file of its own in its host's folder of a job directory (tmpfs,
// /dev/shm by default; the diagnosis is node-local: ranks on other hosts are named as having no
// record here, even where the directory is shared), the number and description of the last
// collective it entered and, while it is blocked in one, which and since when. The writer is the rank's own
// main thread, with plain stores to a shared mapping, so the record stays readable when that rank
// is frozen (SIGSTOP, a swapped-out host, a debugger): diagnosing a frozen rank never needs its
// cooperation. A thread per rank wakes every 100 ms (its heartbeat); when its rank has waited on
// collective #k for longer than the timeout (counted in ticks that ran, so a suspended job does not
// time out on resuming), it reads every rank's record and names the ranks that never entered #k
// (or, if all did, says the transport did not complete it). The lowest such waiting rank prints the
// one message; every detecting rank then ends its process with exit code 5, and mpirun ends the
// rest, frozen ones included (a plain mpirun stuck on a host it cannot reach: mpirun_guard.hpp).
// Inside a checkpoint save the limit is --save-timeout instead: there one rank (the writer, rank 0
// committing) may legitimately keep the others waiting for long, but a host lost mid-save must
// still end the job rather than hang it.
//
// Collectives are numbered per process across every watched communicator, so the numbers agree
// between ranks exactly when the ranks issue the same collectives, which they must anyway.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "src/core/exit_code.hpp"

namespace shardlab {

inline constexpr int kExitTimeout = exit_status(ExitCode::collective_timeout);

class Watchdog {
 public:
  // Starts this process's watchdog (rank `rank` of `world`) publishing under `dir`, which the
  // caller has created for the job on every node; timeout_s <= 0 starts nothing. `hosts`: every
  // rank's host name, to name the hosts whose ranks cannot be seen from here (empty: unknown).
  // save_timeout_s: the limit of waits inside a checkpoint save (WatchdogInSave); 0 = not watched.
  static void start(const std::string& dir, int rank, int world, double timeout_s,
                    std::vector<std::string> hosts = {}, double save_timeout_s = 0);
  static void stop();      // on a normal exit: stop the thread, remove this rank's record
  static bool active();
  // A collective entered (its description: "all_reduce of 64 f32 at shard/ddp.cpp:72"): its number.
  static uint64_t enter(const std::string& what);
  // This rank blocks on collective `seq` until end_wait().
  static void begin_wait(uint64_t seq);
  static void end_wait();
  // While in a save (nestable), waits count against the save limit, not the collective timeout:
  // one rank writing a checkpoint may keep the others waiting for long without being hung.
  static void in_save(bool on);
};

class WatchdogInSave {
 public:
  WatchdogInSave() { Watchdog::in_save(true); }
  ~WatchdogInSave() { Watchdog::in_save(false); }
  WatchdogInSave(const WatchdogInSave&) = delete;
  WatchdogInSave& operator=(const WatchdogInSave&) = delete;
};

// Blocks on collective `seq` for its lifetime (no-op when the watchdog is off).
class WatchdogWait {
 public:
  explicit WatchdogWait(uint64_t seq) : on_(Watchdog::active() && seq > 0) {
    if (on_) Watchdog::begin_wait(seq);
  }
  ~WatchdogWait() {
    if (on_) Watchdog::end_wait();
  }
  WatchdogWait(const WatchdogWait&) = delete;
  WatchdogWait& operator=(const WatchdogWait&) = delete;

 private:
  bool on_;
};

}  // namespace shardlab
