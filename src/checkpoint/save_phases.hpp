// save_phases.hpp — the phases of writing a checkpoint, shared by the synchronous save
// (save_checkpoint, save.cpp) and the background one (AsyncCheckpoint, async_save.cpp). Internal to
// src/checkpoint.
//
// 1. rank 0 makes a fresh temporary directory (.tmp.step_XXXXXXXX);
// 2. every rank that owns state writes its file and a side file (rank_XXXXX.bin.json, renamed
//    into place whole) describing it;
// 3. rank 0 merges the side files into manifest.json and commits: fsync, then one rename to
//    step_XXXXXXXX. Until the rename, the previous checkpoint is the newest complete one.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/checkpoint/checkpoint.hpp"

namespace shardlab::save_detail {

namespace fs = std::filesystem;

struct SavePaths {
  fs::path root, tmp, final_dir;  // --save-dir, .tmp.step_XXXXXXXX and step_XXXXXXXX in it
  static SavePaths of(const std::string& dir, int64_t step);
};

std::string rank_file(int rank);
void fsync_path(const fs::path& p, bool directory);

// Where a rank's bytes go while its state is collected: a file (written as it goes) or host
// buffers (written later, in the background).
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual uint64_t offset() const = 0;
  virtual void write(const void* data, size_t n) = 0;
};

class BufferSink final : public ByteSink {
 public:
  explicit BufferSink(std::vector<float> storage = {}) : floats(std::move(storage)) { floats.clear(); }
  uint64_t offset() const override { return floats.size() * sizeof(float); }
  void write(const void* data, size_t n) override {
    const float* p = static_cast<const float*>(data);
    floats.insert(floats.end(), p, p + n / sizeof(float));
  }
  std::vector<float> floats;  // collect_rank_state appends to it directly
};

// Phase 1 (rank 0).
void make_tmp_dir(const SavePaths& paths);
// Whether this rank owns state to save (a file of its own), and at most how many bytes its file
// holds (tensor-parallel replicas and tied copies are written once, so it may hold fewer).
bool owns_state(const CheckpointState& state);
uint64_t owned_state_bytes(const CheckpointState& state);
// Phase 2, collecting: per unit, per state, the owned range as f32 (under tensor parallelism as its
// whole-tensor pieces) into `sink`, and the pieces describing it. False when this rank owns nothing.
bool collect_rank_state(const CheckpointState& state, ByteSink& sink, nlohmann::json& pieces);
// Phase 2, writing: `values` as tmp/rank_XXXXX.bin, fsynced; returns its checksum.
uint64_t write_rank_bytes(const fs::path& tmp, int rank, const std::vector<float>& values);
// Phase 2, describing: the side file, written beside and renamed into place, so that a reader that
// sees it sees it whole. tp_rank: the tensor-parallel rank that wrote it (-1 without tp).
int description_tp_rank(const CheckpointState& state);
void write_rank_description(const fs::path& tmp, int rank, uint64_t bytes, uint64_t hash, const nlohmann::json& pieces,
                            int tp_rank);

// Phase 3 (rank 0): the manifest's head, every tensor's shape and the carried tokenizer, made from
// the run's state when the save starts; then the side files merged in (consumed), written with
// the tokenizer. `wrote[r]`: whether rank r wrote a file (each must have left its side file).
struct ManifestBase {
  nlohmann::json json;
  const CarriedTokenizer* tokenizer = nullptr;  // lives as long as the run
  const CarriedConfig* hf_config = nullptr;     // the same
};
ManifestBase manifest_base(const CheckpointState& state, const RunPosition& at);
void finish_manifest(const fs::path& tmp, ManifestBase base, const std::vector<uint64_t>& wrote);
void commit_checkpoint(const SavePaths& paths);
void prune_checkpoints(const fs::path& root, int64_t keep, int64_t step);

// Runs a phase on the ranks `who` selects and makes every rank agree on its outcome (in place of a
// barrier): a rank that failed names the file and the reason, every rank throws the InputError,
// which names the newest complete checkpoint (or says there is none).
void agree(Communicator& comm, bool who, const std::function<void()>& phase, int64_t step, const fs::path& root);
// The same message for an error found without running a phase (the background save's).
[[noreturn]] void throw_save_failed(const std::string& error, int64_t step, const fs::path& root);

// Test hooks (fault injection): SHARDLAB_FAULT_KILL_IN_SAVE=r makes rank r kill itself with SIGKILL
// half-way through writing its checkpoint file, SHARDLAB_FAULT_STOP_IN_SAVE=r freeze itself there
// with SIGSTOP. The signal rank `rank` raises there, 0 for none.
int fault_in_save(int rank);

}  // namespace shardlab::save_detail
