// saves.cpp — the Trainer's checkpoints: periodic ones, synchronous or in the background
// (--save-async), and --save at the end with its fallback when it fails.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "src/checkpoint/checkpoint.hpp"
#include "src/core/units.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {

// After step t: a checkpoint when due (periodic, the last step, a new best); returns whether saved.
bool Trainer::maybe_checkpoint(int64_t t, bool new_best, std::FILE* out) {
  const bool root = comm_.rank() == 0;
  const bool due = !cfg_.save_dir.empty() &&
                   ((cfg_.save_every > 0 && (t + 1) % cfg_.save_every == 0) || t + 1 == cfg_.steps || new_best);
  if (!due) return false;
  const RunPosition at{t + 1, t + 1, checkpoint_val_loss_, {}, {}};
  std::string where;
  if (cfg_.save_async) {
    finish_pending_save(out);  // one in flight at a time: host buffers for one checkpoint at most
    std::function<void()> mark_best;  // run by the save's thread once the checkpoint is complete
    if (new_best)
      mark_best = [dir = cfg_.save_dir, step = t + 1, keep = cfg_.save_keep] { mark_best_checkpoint(dir, step, keep); };
    pending_save_ = std::make_unique<AsyncCheckpoint>(cfg_.save_dir, checkpoint_state(), at, cfg_.save_keep, mark_best,
                                                      std::move(save_buffer_));
    where = checkpoint_path(cfg_.save_dir, t + 1);
    if (root)
      std::fprintf(out, "checkpoint %s in the background (the step waited %.1f ms to copy %s)\n", where.c_str(),
                   pending_save_->blocking_ms(), format_bytes(static_cast<double>(pending_save_->buffer_bytes())).c_str());
  } else {
    where = save_checkpoint(cfg_.save_dir, checkpoint_state(), at, cfg_.save_keep);
    if (root) std::fprintf(out, "checkpoint %s\n", where.c_str());
  }
  if (new_best && root) {
    if (!cfg_.save_async) mark_best_checkpoint(cfg_.save_dir, t + 1, cfg_.save_keep);
    std::fprintf(out, "best %s (val loss %.4f)\n", where.c_str(), best_val_loss_);
  }
  return true;
}

void Trainer::finish_pending_save(std::FILE* out) {
  if (!pending_save_) return;
  std::unique_ptr<AsyncCheckpoint> save = std::move(pending_save_);
  const std::string where = save->finish();
  save_buffer_ = save->take_buffer();
  if (comm_.rank() == 0) {
    std::fprintf(out, "checkpoint %s complete (written in %.2f s beside the steps)\n", where.c_str(), save->background_s());
    std::fflush(out);
  }
}

// --save PATH at the end. A failure (no space, a file-size limit, a directory gone) keeps the
// trained weights: the end's checkpoint in --save-dir, or a checkpoint written for the purpose
// under the temporary directory; the message names it, with the export that writes PATH again.
void Trainer::save_final(std::FILE* out) {
  std::signal(SIGXFSZ, SIG_IGN);  // past the file-size limit, write(2) fails with EFBIG instead of killing us
  std::string error, config_note;
  try {
    config_note = save(cfg_.save_path);
  } catch (const InputError& e) {
    error = e.what();
  }
  for (const std::string& e : comm_.all_gather_strings(error))
    if (!e.empty()) error = e;
  if (error.empty()) {
    if (comm_.rank() == 0)
      std::fprintf(out, "saved %s%s%s\n", cfg_.save_path.c_str(), config_note.empty() ? "" : "; ", config_note.c_str());
    return;
  }
  const int64_t step = cfg_.steps;
  std::string kept;
  if (!cfg_.save_dir.empty()) {
    kept = checkpoint_path(cfg_.save_dir, step);  // the end's
  } else {
    // Rank 0's temporary directory, the same path on every rank.
    std::string mine = comm_.rank() == 0 ? (std::filesystem::temp_directory_path() /
                                            fmt::format("shardlab-rescue-{}", ::getpid())).string()
                                         : std::string();
    for (const std::string& d : comm_.all_gather_strings(mine))
      if (!d.empty()) mine = d;
    try {
      kept = save_checkpoint(mine, checkpoint_state(), {step, step, checkpoint_val_loss_, {}, {}}, 0);
    } catch (const InputError& e) {
      throw InputError(fmt::format("--save '{}' failed: {}; and the checkpoint that was to keep the trained weights "
                                   "failed too: {}: nothing of this run is saved", cfg_.save_path, error, e.what()));
    }
  }
  throw InputError(fmt::format("--save '{}' failed: {}; the trained weights are in the checkpoint '{}' (shardlab "
                               "export {} --out {} writes them again)", cfg_.save_path, error, kept, kept,
                               cfg_.save_path));
}

}  // namespace shardlab
