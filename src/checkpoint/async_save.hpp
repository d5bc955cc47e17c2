// async_save.hpp — --save-async: a checkpoint written while training goes on (as torchtitan's
// async DCP and Megatron's async save do).
//
// The step waits only for one copy: every rank copies the state it owns into host buffers (the
// bytes its file will hold, so at most one checkpoint's worth per rank), rank 0 describes the run.
// A thread per rank then writes its file and its description; rank 0's, once every rank's
// description is there, merges the manifest and commits with the same rename as a synchronous save
// (save_phases.hpp), so the previous checkpoint stays the newest complete one until then, and a
// crash at any moment leaves it loadable. No thread calls MPI: the ranks agree on the outcome when
// the main threads next meet, in finish() (before the next save, at a stop, at the end).
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/checkpoint/checkpoint.hpp"

namespace shardlab {

class AsyncCheckpoint {
 public:
  // Collective over state.comm. Errors of the blocking part (the temporary directory) are
  // InputErrors on every rank, as save_checkpoint's. `after_commit` runs on rank 0's thread once
  // the checkpoint is complete (--save-best's link). `buffer`: the host buffer of an earlier save
  // (take_buffer), reused: allocating a fresh one faults in every page again.
  AsyncCheckpoint(const std::string& dir, const CheckpointState& state, const RunPosition& at, int64_t keep,
                  std::function<void()> after_commit = {}, std::vector<float> buffer = {});
  // A save not finished is abandoned: its temporary directory is never renamed into place.
  ~AsyncCheckpoint();
  AsyncCheckpoint(const AsyncCheckpoint&) = delete;
  AsyncCheckpoint& operator=(const AsyncCheckpoint&) = delete;

  // Collective: waits for this rank's writing, agrees with the others on its outcome, then (rank 0)
  // for the commit. A failure anywhere is an InputError on every rank, as save_checkpoint's.
  // Returns the checkpoint's directory.
  std::string finish();

  // A host buffer the size of this rank's checkpoint, every page touched: made before the first
  // step, so that no save pays for faulting it in.
  static std::vector<float> make_buffer(const CheckpointState& state);
  // The host buffer, for the next save (after finish, or to end it: waits for the thread).
  std::vector<float> take_buffer();

  int64_t step() const { return step_; }
  double blocking_ms() const { return blocking_ms_; }   // the step's wait: the copy, the descriptions
  uint64_t buffer_bytes() const { return buffer_bytes_; }  // this rank's host buffers
  double background_s() const { return background_s_; }    // the thread's time (after finish)

 private:
  void write();  // the thread

  struct Impl;
  Communicator& comm_;
  int64_t step_;
  double blocking_ms_ = 0, background_s_ = 0;
  uint64_t buffer_bytes_ = 0;
  std::unique_ptr<Impl> impl_;
  std::mutex mutex_;
  std::condition_variable written_cv_;
  bool written_ = false;  // this rank's file and description (or its error)
  std::string write_error_, commit_error_;
  std::atomic<bool> abandon_{false};
  std::thread thread_;
};

}  // namespace shardlab
