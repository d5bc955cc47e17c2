// dir_lock.hpp — one run per --save-dir: rank 0 holds an exclusive lock on DIR/.lock (flock) for
// the run's lifetime, released by the kernel when the process ends however it ends, so a crashed
// run leaves nothing to clean. The file names the holder (pid, host, start, command) for the
// message a second run gets.
#pragma once
#include <string>

namespace shardlab {

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
