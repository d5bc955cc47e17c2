// dir_lock.hpp — one run per --save-dir: rank 0 holds an exclusive lock on DIR/.lock (flock) for
// the run's lifetime, released by the kernel when the process ends however it ends, so a crashed
// run leaves nothing to clean. The file names the holder (pid, host, start, command) for the
// message a second run gets.
#pragma once
#include <string>

namespace shardlab {

// A new run's id: UTC time and 24 random bits, "20261126-193012-4f2a9c".
std::string new_run_id();
// InputError unless `run_id` is a usable --run-id: 1-64 of [A-Za-z0-9._-].
void validate_run_id(const std::string& run_id);

// Checked by rank 0 under the lock, before the first step: the checkpoints in `dir` are this run's.
// A fresh run (resumed_from "") needs a directory without complete checkpoints (its step_00000010
// would sit beside another run's step_00000500, which --resume auto would take); a resumed run needs
// the newest to be the one it resumed or one with its run id. InputError naming both runs otherwise.
void require_own_save_dir(const std::string& dir, const std::string& run_id, const std::string& resumed_from);

class SaveDirLock {
 public:
  // Takes the lock on dir/.lock (created if absent). InputError when another process holds it,
  // naming the holder and what to do; `flag` names the option in messages ("--save-dir").
  SaveDirLock(const std::string& dir, const char* flag);
  ~SaveDirLock();
  SaveDirLock(const SaveDirLock&) = delete;
  SaveDirLock& operator=(const SaveDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace shardlab
