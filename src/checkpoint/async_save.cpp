#include "src/checkpoint/async_save.hpp"

#include <chrono>
#include <csignal>

#include "src/checkpoint/save_phases.hpp"
#include "src/comm/watchdog.hpp"

namespace shardlab {

using namespace save_detail;

struct AsyncCheckpoint::Impl {
  SavePaths paths;
  int64_t keep = 0;
  int rank = 0;
  bool owns = false;
  BufferSink buffer;
  nlohmann::json pieces;
  int tp_rank = -1;
  std::vector<uint64_t> writers;  // rank 0: which ranks write a file
  ManifestBase manifest;          // rank 0
  std::function<void()> after_commit;
};

AsyncCheckpoint::AsyncCheckpoint(const std::string& dir, const CheckpointState& state, const RunPosition& at,
                                 int64_t keep, std::function<void()> after_commit, std::vector<float> buffer)
    : comm_(state.comm), step_(at.step), impl_(std::make_unique<Impl>()) {
  const auto t0 = std::chrono::steady_clock::now();
  Impl& s = *impl_;
  s.paths = SavePaths::of(dir, at.step);
  s.keep = keep;
  s.rank = comm_.rank();
  s.after_commit = std::move(after_commit);
  std::signal(SIGXFSZ, SIG_IGN);  // past the file-size limit, write(2) fails with EFBIG instead of killing us
  WatchdogInSave in_save;
  agree(comm_, s.rank == 0, [&] { make_tmp_dir(s.paths); }, step_, s.paths.root);
  s.buffer = BufferSink(std::move(buffer));
  s.buffer.floats.reserve(owned_state_bytes(state) / sizeof(float));  // one allocation: growing it copies it all
  s.owns = collect_rank_state(state, s.buffer, s.pieces);
  buffer_bytes_ = s.buffer.offset();
  s.tp_rank = description_tp_rank(state);
  const uint64_t wrote = s.owns ? 1 : 0;
  s.writers = comm_.gather_u64(std::span<const uint64_t>(&wrote, 1));
  if (s.rank == 0) s.manifest = manifest_base(state, at);
  thread_ = std::thread([this] { write(); });
  blocking_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<float> AsyncCheckpoint::make_buffer(const CheckpointState& state) {
  std::vector<float> buffer(owned_state_bytes(state) / sizeof(float));  // value-initialised: every page written
  buffer.clear();
  return buffer;
}

AsyncCheckpoint::~AsyncCheckpoint() {
  abandon_ = true;
  if (thread_.joinable()) thread_.join();
}

void AsyncCheckpoint::write() {
  const auto t0 = std::chrono::steady_clock::now();
  Impl& s = *impl_;
  try {
    if (s.owns) {
      const uint64_t hash = write_rank_bytes(s.paths.tmp, s.rank, s.buffer.floats);
      write_rank_description(s.paths.tmp, s.rank, s.buffer.offset(), hash, s.pieces, s.tp_rank);
    }
  } catch (const std::exception& e) {
    write_error_ = e.what();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    written_ = true;
  }
  written_cv_.notify_all();
  if (s.rank == 0 && write_error_.empty()) {
    // Every writer's description, then the manifest and the commit. A rank that failed never leaves
    // one: finish() learns of it from that rank and abandons this wait.
    try {
      for (size_t r = 0; r < s.writers.size(); ++r)
        while (s.writers[r] && !fs::exists(s.paths.tmp / (rank_file(static_cast<int>(r)) + ".json"))) {
          if (abandon_) return;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      finish_manifest(s.paths.tmp, std::move(s.manifest), s.writers);
      commit_checkpoint(s.paths);
      prune_checkpoints(s.paths.root, s.keep, step_);
      if (s.after_commit) s.after_commit();
    } catch (const std::exception& e) {
      commit_error_ = e.what();
      std::error_code ec;
      fs::remove_all(s.paths.tmp, ec);
    }
  }
  background_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string AsyncCheckpoint::finish() {
  WatchdogInSave in_save;  // rank 0 may keep the others waiting while it commits: --save-timeout bounds it
  {
    std::unique_lock<std::mutex> lock(mutex_);
    written_cv_.wait(lock, [this] { return written_; });
  }
  const fs::path& root = impl_->paths.root;
  for (const std::string& e : comm_.all_gather_strings(write_error_)) {
    if (e.empty()) continue;
    abandon_ = true;
    if (thread_.joinable()) thread_.join();
    std::error_code ec;
    if (impl_->rank == 0) fs::remove_all(impl_->paths.tmp, ec);
    throw_save_failed(e, step_, root);
  }
  if (thread_.joinable()) thread_.join();
  agree(comm_, impl_->rank == 0, [&] { SHARD_REQUIRE(commit_error_.empty(), "{}", commit_error_); }, step_, root);
  return impl_->paths.final_dir.string();
}

std::vector<float> AsyncCheckpoint::take_buffer() {
  if (thread_.joinable()) thread_.join();
  return std::move(impl_->buffer.floats);
}

}  // namespace shardlab
