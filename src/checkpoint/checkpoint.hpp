// checkpoint.hpp — checkpoints that any world size and strategy can resume, and export.
//
// A checkpoint is a directory `step_XXXXXXXX` with one file per rank that owns parameters
// (`rank_XXXXX.bin`: for each unit, the f32 values of the parameters this rank updates — the
// master copy under mixed precision — then each optimizer state, for the element range it owns) and
// `manifest.json` (schema shardlab.checkpoint/1): model spec, strategy, world, dtypes, optimizer,
// step, data position, seed, every file with its size and FNV-1a-64 checksum, and for every tensor
// and state which element ranges lie in which file at which byte offset. A run that read text also
// leaves `tokenizer.json` (CarriedTokenizer), which export and sample take.
//
// Writing is atomic: everything goes to `.tmp.step_XXXXXXXX`, every file is fsynced, and rank 0
// renames the directory once all ranks have finished, so a run killed at any moment leaves the
// previous checkpoint intact. Loading reads, for the ranges this rank owns under the current
// strategy and world size, only the pieces that overlap them (after checking the checksums of
// the files it reads): resharding is the normal case, not a conversion step.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shard/strategy.hpp"
#include "src/checkpoint/checkpoint_format.hpp"
#include "shard/step_config.hpp"

namespace shardlab {

// What a run's text was tokenized with, as its checkpoints carry it (tokenizer.json): the run's
// --tokenizer in Hugging Face form (Tokenizer::to_hf_json), or a text file's bytes as tokens
// (byte_tokenizer_json; source "bytes"). The Trainer makes it once.
struct CarriedTokenizer {
  std::string json;    // the tokenizer.json text
  std::string source;  // the --tokenizer file it came from, or "bytes"
};

// The config.json the model came with (its --init directory's), as checkpoints carry it
// (hf_config.json): export and train --save write it back, changed only where the trained model
// differs (HfWriteOptions::base_config). The Trainer reads it once, or takes a resumed checkpoint's.
struct CarriedConfig {
  std::string json;    // the config.json text
  std::string source;  // the file it came from
};

// What save and load work on: the ranks' strategy (whose owned state is written and read), the
// model's units (the tensors' names and offsets), and the run's configuration for the manifest's
// description and load's compatibility checks. The Trainer makes one (Trainer::checkpoint_state).
struct CheckpointState {
  Backend& backend;
  Communicator& comm;
  Strategy& strategy;
  const std::vector<std::unique_ptr<Unit>>& units;
  const StepConfig& step;  // model, strategy, dtypes, optimizer, seed
  bool shuffle = false;    // batches from per-epoch permutations of (seed, epoch): with the step, the data order
  const DataRecord* data = nullptr;  // the run's data, batch and validation split (null: not recorded or checked)
  const CarriedTokenizer* tokenizer = nullptr;  // null: no text (synthetic or llm.c tokens), nothing carried
  int64_t steps = 0;                   // load: the run's steps (the learning rates left to compare)
  bool allow_schedule_change = false;  // load: a changed schedule or optimizer setting is noted, not refused
  bool allow_data_growth = false;      // load: --data's files followed by new ones is noted, not refused
  std::string run_id;  // save: the run's id, recorded; load: the id the checkpoint must carry ("" = any)
  const CarriedConfig* hf_config = nullptr;  // save: the model's original config.json, carried (null: none)
};

// Where a run stands when it saves, and where a loaded checkpoint resumes.
struct RunPosition {
  int64_t step = 0;           // steps done
  int64_t data_position = 0;  // the step whose batch comes next (batches are a function of the step index)
  std::optional<float> val_loss;  // the validation loss computed at this step, when there was one
  std::string note;  // load: what could not be checked, or what changed (one line each), for the log
  std::string run_id;  // load: the run the checkpoint belongs to ("" when it predates run ids)
};

// Collective over state.comm's ranks. Saves at `at` (at.step steps done). Returns the directory.
// A failure on any rank (disk full, file-size limit, I/O error) is an InputError on every rank
// naming the file and the reason; the previous checkpoint stays the newest complete one. With
// keep > 0, only the newest `keep` complete checkpoints remain afterwards.
std::string save_checkpoint(const std::string& dir, const CheckpointState& state, const RunPosition& at, int64_t keep = 0);
// Where the checkpoint of `step` steps lives under dir: DIR/step_XXXXXXXX (what save_checkpoint returns).
std::string checkpoint_path(const std::string& dir, int64_t step);
// --save-best: DIR/best becomes a symlink to step_XXXXXXXX (made beside it, then renamed over the
// old one: atomic), then prunes to the newest `keep` (0 = all) and the best. Rank 0 only.
// --save-keep never deletes the checkpoint `best` points to.
void mark_best_checkpoint(const std::string& dir, int64_t step, int64_t keep = 0);
// The checkpoint DIR/best points to ("" when none), and the validation loss its manifest records
// (infinity when there is none).
std::string best_checkpoint(const std::string& dir);
float best_checkpoint_val_loss(const std::string& dir);
// Loads into state.strategy (any world size and strategy), after checking the checkpoint is of the
// same model, optimizer and batch order, and (state.data) of the same data source, global batch,
// sequence length and validation split: an InputError names both values. Returns where it resumes.
RunPosition load_checkpoint(const std::string& path, const CheckpointState& state);

}  // namespace shardlab
