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

// An exclusive lock on `lock_file` (created if absent) for the holder's lifetime, the file naming
// the holder. InputError when another process holds it: "FLAG 'PATH' is in use by another run
// (<holder>): <why>; give this run another FLAG, or wait for that one to end".
class RunLock {
 public:
  RunLock(const std::string& lock_file, const char* flag, const std::string& path, const char* why);
  virtual ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

// --save-dir's: dir/.lock.
class SaveDirLock : public RunLock {
 public:
  SaveDirLock(const std::string& dir, const char* flag);
};

// An output file's (--log, --json, --html, --trace): the hidden DIR/.NAME.lock beside it, so two live
// runs never write one file (a log truncated under another writer fills with NUL bytes).
class OutputLock : public RunLock {
 public:
  OutputLock(const std::string& path, const char* flag);
};

}  // namespace shardlab
