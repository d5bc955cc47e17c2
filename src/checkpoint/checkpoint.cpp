#include "src/checkpoint/checkpoint.hpp"
#include "src/checkpoint/checkpoint_format.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <string_view>

#include "src/comm/watchdog.hpp"
#include "src/core/hash.hpp"
#include "src/model/family.hpp"
#include "src/model/safetensors.hpp"

namespace shardlab {
namespace fs = std::filesystem;
namespace {

std::string step_name(int64_t step) { return fmt::format("step_{:08d}", step); }
std::string rank_file(int rank) { return fmt::format("rank_{:05d}.bin", rank); }

void fsync_path(const fs::path& p, bool directory) {
  int fd = ::open(p.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  SHARD_REQUIRE(fd >= 0, "cannot open '{}' to sync it: {}", p.string(), std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  SHARD_REQUIRE(rc == 0 || directory, "cannot sync '{}': {}", p.string(), std::strerror(err));
}

// Writes bytes with a running checksum, through write(2) so that a failure (disk full, the
// file-size limit, an I/O error) names the file and the system's reason.
class CheckedWriter {
 public:
  explicit CheckedWriter(fs::path p) : path_(std::move(p)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    SHARD_REQUIRE(fd_ >= 0, "cannot write checkpoint file '{}': {}", path_.string(), std::strerror(errno));
  }
  ~CheckedWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  CheckedWriter(const CheckedWriter&) = delete;
  CheckedWriter& operator=(const CheckedWriter&) = delete;
  uint64_t offset() const { return offset_; }
  void write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    hash_ = fnv1a64(std::string_view(p, n), hash_);
    for (size_t done = 0; done < n;) {
      ssize_t k = ::write(fd_, p + done, n - done);
      if (k < 0 && errno == EINTR) continue;
      SHARD_REQUIRE(k > 0, "writing checkpoint file '{}' failed at byte {}: {}", path_.string(), offset_ + done,
                    k < 0 ? std::strerror(errno) : "no progress");
      done += static_cast<size_t>(k);
    }
    offset_ += n;
  }
  uint64_t close() {
    int rc = ::fsync(fd_);
    int err = errno;
    rc |= ::close(fd_);
    fd_ = -1;
    SHARD_REQUIRE(rc == 0, "writing checkpoint file '{}' failed: {}", path_.string(), std::strerror(err));
    return hash_;
  }

 private:
  fs::path path_;
  int fd_ = -1;
  uint64_t offset_ = 0, hash_ = kFnv1a64Basis;
};

// A small file written whole and synced, or an error naming it and the system's reason.
void write_small_file(const fs::path& p, const std::string& text) {
  CheckedWriter w(p);
  w.write(text.data(), text.size());
  w.close();
}

// Test hook (fault injection): SHARDLAB_FAULT_KILL_IN_SAVE=r makes rank r kill itself with SIGKILL
// half-way through writing its checkpoint file.
bool kill_in_save(int rank) {
  const char* v = std::getenv("SHARDLAB_FAULT_KILL_IN_SAVE");
  return v && std::atoi(v) == rank;
}

// ---- Saving: three phases between barriers ------------------------------------------------------
// 1. every rank that owns state writes its file and a side file (rank_XXXXX.bin.json) describing it;
// 2. rank 0 merges the side files into manifest.json;
// 3. rank 0 commits: fsync, then rename .tmp.step_XXXXXXXX to step_XXXXXXXX.
// Until the rename, the previous checkpoint is the newest complete one.

struct SavePaths {
  fs::path root, tmp, final_dir;  // --save-dir, .tmp.step_XXXXXXXX and step_XXXXXXXX in it
};

// Rank 0: a fresh, empty temporary directory; temporary directories a failed or killed save left
// behind are removed (resume never reads them: only step_* directories with a manifest count).
void make_tmp_dir(const SavePaths& paths) {
  std::error_code ec;
  fs::create_directories(paths.root, ec);
  SHARD_REQUIRE(!ec, "--save-dir '{}': cannot create it: {}", paths.root.string(), ec.message());
  for (const auto& e : fs::directory_iterator(paths.root, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp.step_", 0) == 0) fs::remove_all(e.path(), ec);
    // A replaced checkpoint moved aside by a commit that was killed before it finished: the step
    // is complete under its own name, unless the rename to it never happened.
    if (n.rfind(".old.step_", 0) == 0) {
      if (fs::exists(paths.root / n.substr(5) / "manifest.json")) fs::remove_all(e.path(), ec);
      else fs::rename(e.path(), paths.root / n.substr(5), ec);
    }
  }
  fs::create_directory(paths.tmp, ec);
  SHARD_REQUIRE(!ec, "cannot create '{}': {}", paths.tmp.string(), ec.message());
}

// Phase 1 (every rank): per unit, per state, the owned range as f32 into tmp/rank_XXXXX.bin, fsynced
// (under tensor parallelism as its whole-tensor pieces: append_unit_state); then rank_XXXXX.bin.json
// with its size, checksum, tensor-parallel rank and pieces (tensor -> state -> [piece]).
// A rank that owns nothing writes neither.
bool write_rank_file(const fs::path& tmp, const CheckpointState& state) {
  Strategy& st = state.strategy;
  const auto& units = state.units;
  const int rank = state.comm.rank();
  bool owns = false;
  for (size_t u = 0; u < units.size(); ++u) owns |= st.saved_range(u).second > st.saved_range(u).first;
  if (!owns) return false;
  const auto names = st.owned_state_names();
  nlohmann::json pieces = nlohmann::json::object();
  CheckedWriter w(tmp / rank_file(rank));
  std::vector<float> staged;
  for (size_t u = 0; u < units.size(); ++u) {
    auto [a, b] = st.saved_range(u);
    if (b <= a) continue;
    auto tensors = st.owned_state(u);
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::vector<float> host(static_cast<size_t>(b - a));
      state.backend.copy(Tensor::of(std::span<float>(host)), tensors[i].slice(0, b - a));
      staged.clear();
      append_unit_state(units[u]->layout(), a, b, host, rank, names[i], w.offset(), staged, pieces);
      if (kill_in_save(rank) && u == units.size() / 2) {
        w.write(staged.data(), staged.size() * sizeof(float) / 2);
        std::raise(SIGKILL);
      }
      w.write(staged.data(), staged.size() * sizeof(float));
    }
  }
  const uint64_t bytes = w.offset(), hash = w.close();
  nlohmann::json side = {{"file", rank_file(rank)}, {"bytes", bytes},
                         {"checksum", fnv1a64_text(hash)}, {"pieces", pieces}};
  if (units[0]->layout().tp_degree > 1) side["tp_rank"] = units[0]->layout().tp_rank;
  write_small_file(tmp / (rank_file(rank) + ".json"), side.dump());
  return true;
}

// The manifest's description of the run (format, model, strategy, ..., seed); files and tensors empty.
nlohmann::json manifest_head(const CheckpointState& state, int world, const RunPosition& at,
                             const std::vector<std::string>& states) {
  const StepConfig& c = state.step;
  nlohmann::json m;
  m["format"] = kCheckpointFormat;
  m["model"] = spec_to_json(c.spec);
  m["strategy"] = strategy_name(c.strategy.kind);
  m["world"] = world;
  const ParallelDims& d = c.layout.dims;  // the layout that wrote it (informational: any layout loads it)
  m["mesh"] = {{"pp", d.pp}, {"dp_replicate", d.dp_replicate}, {"dp_shard", d.dp_shard}, {"tp", d.tp}};
  if (d.cp > 1) m["mesh"]["cp"] = d.cp;
  if (d.ep > 1) m["mesh"]["ep"] = d.ep;
  m["param_dtype"] = dtype_name(c.strategy.precision.param_dtype);
  m["reduce_dtype"] = dtype_name(c.strategy.precision.reduce_dtype);
  m["optimizer"] = {{"kind", optimizer_name(c.optim.kind)}, {"beta1", c.optim.beta1}, {"beta2", c.optim.beta2}, {"eps", c.optim.eps},
                    {"weight_decay", c.optim.weight_decay}, {"momentum", c.optim.momentum}, {"states", states}};
  m["step"] = at.step;
  m["data_position"] = at.data_position;
  m["seed"] = c.seed;
  if (!state.run_id.empty()) m["run_id"] = state.run_id;
  m["shuffle"] = state.shuffle;  // with the seed and the step, the batch order
  const LrSchedule& sc = c.schedule;
  m["schedule"] = {{"kind", schedule_name(sc.kind)},     {"lr", sc.lr},
                   {"warmup_steps", sc.warmup_steps},   {"decay_steps", sc.total_steps},
                   {"min_lr_frac", sc.min_lr_frac},     {"grad_clip", c.grad_clip}};
  if (state.data) m["data"] = data_record_to_json(*state.data);
  m["files"] = nlohmann::json::array();
  m["tensors"] = nlohmann::json::object();
  return m;
}

// Phase 2 (rank 0): the side files (consumed) and every tensor's shape into tmp/manifest.json.
// `wrote[r]` says whether rank r wrote a file: each of those must have left its side file.
void merge_manifest(const fs::path& tmp, const CheckpointState& state, const RunPosition& at,
                    const std::vector<uint64_t>& wrote) {
  const int world = state.comm.world_size();
  for (int r = 0; r < world; ++r)
    SHARD_REQUIRE(!wrote[static_cast<size_t>(r)] || fs::exists(tmp / (rank_file(r) + ".json")),
                  "rank {} wrote '{}' but its description '{}' is not there", r, (tmp / rank_file(r)).string(),
                  (tmp / (rank_file(r) + ".json")).string());
  nlohmann::json m = manifest_head(state, world, at, state.strategy.owned_state_names());
  if (at.val_loss) m["val_loss"] = *at.val_loss;
  for (int r = 0; r < world; ++r) {
    fs::path side = tmp / (rank_file(r) + ".json");
    if (!fs::exists(side)) continue;
    nlohmann::json j = nlohmann::json::parse(std::ifstream(side));
    m["files"].push_back({{"rank", r}, {"file", j["file"]}, {"bytes", j["bytes"]}, {"checksum", j["checksum"]}});
    if (j.contains("tp_rank")) m["files"].back()["tp_rank"] = j["tp_rank"];
    for (auto& [tensor, states] : j["pieces"].items())
      for (auto& [state_name, list] : states.items())
        for (auto& p : list) m["tensors"][tensor][state_name].push_back(p);
    fs::remove(side);
  }
  // The whole model's tensors (under --pp this rank holds one stage's), at their whole shapes:
  // pieces are whole-tensor regions.
  for (const UnitLayout& unit : family_of(state.step.spec).layout(state.step.spec))
    for (const TensorDecl& t : unit.tensors) m["tensors"][t.name]["shape"] = t.full_shape;
  if (const CarriedTokenizer* t = state.tokenizer) {
    write_small_file(tmp / "tokenizer.json", t->json);
    m["tokenizer"] = {{"file", "tokenizer.json"}, {"source", t->source}, {"bytes", t->json.size()},
                      {"checksum", fnv1a64_text(fnv1a64(t->json))}};
  }
  write_small_file(tmp / "manifest.json", m.dump(1) + "\n");
}

// Phase 3 (rank 0): make the manifest and directory durable, then publish it with one rename
// (replacing an older checkpoint of the same step), and make the rename durable.
// A checkpoint of the same step already there is first renamed aside (.old.step_...), so a kill at
// any moment leaves one complete copy of the step.
void commit_checkpoint(const SavePaths& paths) {
  fsync_path(paths.tmp, true);
  std::error_code ec;
  const fs::path aside = paths.root / (".old." + paths.final_dir.filename().string());
  if (fs::exists(paths.final_dir)) {
    fs::remove_all(aside, ec);
    fs::rename(paths.final_dir, aside, ec);
    SHARD_REQUIRE(!ec, "cannot move '{}' aside: {}", paths.final_dir.string(), ec.message());
  }
  fs::rename(paths.tmp, paths.final_dir, ec);
  SHARD_REQUIRE(!ec, "cannot rename '{}' to '{}': {}", paths.tmp.string(), paths.final_dir.string(), ec.message());
  fsync_path(paths.root, true);
  fs::remove_all(aside, ec);
}

// --save-keep: of the complete checkpoints up to `step` (the one just committed), the newest `keep`
// stay and older ones go (rank 0, after a commit). Checkpoints of later steps (left by a run that was
// resumed from an earlier one) are not this run's to delete.
void prune_checkpoints(const fs::path& root, int64_t keep, int64_t step) {
  if (keep <= 0) return;
  std::vector<fs::path> complete;
  std::error_code ec;
  const std::string best = fs::path(best_checkpoint(root.string())).filename().string();
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string n = e.path().filename().string();
    if (n == best) continue;  // --save-best's checkpoint stays, beside the newest `keep`
    if (n.rfind("step_", 0) != 0 || n > step_name(step) || !fs::exists(e.path() / "manifest.json")) continue;
    complete.push_back(e.path());
  }
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < complete.size(); ++i) fs::remove_all(complete[i], ec);
}

// Runs one phase of a save on the ranks `who` selects, and makes every rank agree on its outcome
// (in place of a barrier): a rank that failed names the file and the reason, the others stop too.
// The message names the newest complete checkpoint, or says there is none (a first save that
// fails must not promise one).
template <class Phase>
void agree(Communicator& comm, bool who, Phase phase, int64_t step, const fs::path& root) {
  std::string error;
  try {
    if (who) phase();
  } catch (const std::exception& e) {
    error = e.what();
  }
  for (const std::string& e : comm.all_gather_strings(error)) {
    if (e.empty()) continue;
    std::string newest;
    try {
      newest = latest_checkpoint(root.string());
    } catch (const std::exception&) {  // an unreadable directory holds none we could resume
    }
    throw InputError(fmt::format("saving the checkpoint of step {} failed: {}. {}", step, e,
                                 newest.empty() ? fmt::format("There is no complete checkpoint under '{}': nothing of "
                                                              "this run is saved", root.string())
                                                : fmt::format("The newest complete checkpoint, '{}', is intact "
                                                              "(--resume auto finds it)", newest)));
  }
}

}  // namespace

std::string save_checkpoint(const std::string& dir, const CheckpointState& state, const RunPosition& at, int64_t keep) {
  Communicator& comm = state.comm;
  const int64_t step = at.step;
  const fs::path root(dir);
  const SavePaths paths{root, root / (".tmp." + step_name(step)), root / step_name(step)};
  std::signal(SIGXFSZ, SIG_IGN);  // past the file-size limit, write(2) fails with EFBIG instead of killing us
  WatchdogPause pause;  // rank 0 alone may keep the others waiting for long: that is not a hang
  const bool root_rank = comm.rank() == 0;
  agree(comm, root_rank, [&] { make_tmp_dir(paths); }, step, root);
  try {
    uint64_t wrote = 0;
    agree(comm, true, [&] { wrote = write_rank_file(paths.tmp, state); }, step, root);
    const std::vector<uint64_t> writers = comm.gather_u64(std::span<const uint64_t>(&wrote, 1));
    agree(comm, root_rank, [&] {
      merge_manifest(paths.tmp, state, at, writers);
      commit_checkpoint(paths);
      prune_checkpoints(root, keep, step);
    }, step, root);
  } catch (const InputError&) {
    std::error_code ec;
    if (root_rank) fs::remove_all(paths.tmp, ec);  // the next save would clean it up anyway
    throw;
  }
  return paths.final_dir.string();
}

void mark_best_checkpoint(const std::string& dir, int64_t step, int64_t keep) {
  const fs::path root(dir), tmp = root / ".best.tmp", link = root / "best";
  std::error_code ec;
  fs::remove(tmp, ec);
  fs::create_symlink(step_name(step), tmp, ec);
  SHARD_REQUIRE(!ec, "--save-best: cannot create the link '{}': {}", tmp.string(), ec.message());
  fs::rename(tmp, link, ec);
  SHARD_REQUIRE(!ec, "--save-best: cannot rename '{}' to '{}': {}", tmp.string(), link.string(), ec.message());
  fsync_path(root, true);
  prune_checkpoints(root, keep, step);  // the previous best, now unprotected, may be past --save-keep
}

std::string best_checkpoint(const std::string& dir) {
  std::error_code ec;
  const fs::path link = fs::path(dir) / "best";
  if (!fs::is_symlink(link, ec)) return "";
  fs::path target = fs::read_symlink(link, ec);
  if (ec) return "";
  return (fs::path(dir) / target).string();
}

float best_checkpoint_val_loss(const std::string& dir) {
  const std::string best = best_checkpoint(dir);
  std::error_code ec;
  if (best.empty() || !fs::exists(fs::path(best) / "manifest.json", ec)) return INFINITY;
  const Manifest m = read_manifest(best);
  return m.val_loss ? static_cast<float>(*m.val_loss) : INFINITY;
}

// ---- Loading ------------------------------------------------------------------------------------

namespace {

void check_compatible(const Manifest& m, const CheckpointState& state, const std::string& path) {
  const StepConfig& c = state.step;
  // Every field of the spec but its name: family, sizes, and what the family's units compute.
  nlohmann::json there = spec_to_json(m.model), here = spec_to_json(c.spec);
  there.erase("name");
  here.erase("name");
  for (const auto* j : {&there, &here})
    for (auto it = j->begin(); it != j->end(); ++it) {
      const char* k = it.key().c_str();
      const std::string a = there.contains(k) ? there[k].dump() : "(unset)", b = here.contains(k) ? here[k].dump() : "(unset)";
      SHARD_REQUIRE(a == b, "checkpoint '{}' is of another model: {} {} there, {} here (model {} vs {}); without "
                    "--model and size flags a resume takes the checkpoint's", path, k, a, b, m.model.name,
                    c.spec.describe());
    }
  SHARD_REQUIRE(m.shuffle == state.shuffle, "checkpoint '{}' was trained {} --shuffle, this run is {} it: the batch order "
                "would change (pass the same setting)", path, m.shuffle ? "with" : "without", state.shuffle ? "with" : "without");
  SHARD_REQUIRE(!state.shuffle || m.seed == c.seed, "checkpoint '{}' shuffled its batches with --seed {}, this run has --seed "
                "{}: the order would change (pass --seed {})", path, m.seed, c.seed, m.seed);
  SHARD_REQUIRE(state.run_id.empty() || m.run_id.empty() || m.run_id == state.run_id, "checkpoint '{}' belongs to run "
                "'{}'; this run is --run-id '{}': another run's checkpoint (pass --run-id {} to continue that run, or "
                "another --save-dir)", path, m.run_id, state.run_id, m.run_id);
  SHARD_REQUIRE(m.optimizer.kind == optimizer_name(c.optim.kind),
                "checkpoint '{}' holds {} state; this run uses --optimizer {}", path, m.optimizer.kind,
                optimizer_name(c.optim.kind));
}

std::string describe(const DataSource& s) {
  return s.path == "synthetic" ? "synthetic" : fmt::format("'{}' ({} bytes, {})", s.path, s.bytes, s.hash);
}
std::string describe_val(const DataRecord& d) {
  if (d.val_data) return fmt::format("--val-data {}", describe(*d.val_data));
  if (d.val_fraction != 0) return fmt::format("--val-fraction {}", d.val_fraction);
  return "no validation split";
}

// The tokens, batch and validation split: with the step, they say which sequences come next.
// Returns a note when the manifest predates the record (nothing to compare).
std::string check_data(const Manifest& m, const CheckpointState& state, const std::string& path) {
  if (!state.data) return "";
  if (!m.data)
    return fmt::format("checkpoint '{}' records no data source, batch or validation split (written before shardlab "
                       "recorded them): resuming without checking --data, --batch and the validation split", path);
  const DataRecord &was = *m.data, &now = *state.data;
  SHARD_REQUIRE(!(was.train.path != "synthetic" && now.train.path == "synthetic"),
                "checkpoint '{}' was trained on --data {}; this run has --data synthetic (the default when --data is "
                "not given): pass --data '{}'", path, describe(was.train), was.train.path);
  SHARD_REQUIRE(was.train.same_tokens(now.train),
                "checkpoint '{}' was trained on --data {}; this run's --data is {}: it would continue at step {} on "
                "other tokens (pass the same data)", path, describe(was.train), describe(now.train), m.step);
  SHARD_REQUIRE(was.batch == now.batch, "checkpoint '{}' was trained with --batch {}; this run has --batch {}: step "
                "{}'s batch would be other sequences (pass --batch {})", path, was.batch, now.batch, m.step, was.batch);
  SHARD_REQUIRE(was.seq == now.seq, "checkpoint '{}' was trained with sequences of {} tokens; this run has --seq {}",
                path, was.seq, now.seq);
  const bool same_val = was.val_fraction == now.val_fraction && was.val_data.has_value() == now.val_data.has_value() &&
                        (!was.val_data || was.val_data->same_tokens(*now.val_data));
  SHARD_REQUIRE(same_val, "checkpoint '{}' was trained with {}; this run has {} (pass the same validation split)", path,
                describe_val(was), describe_val(now));
  return "";
}

// The schedule, gradient clip and optimizer hyper-parameters: another value changes the learning
// rate or the update from the next step on. Schedule fields that differ but give the same learning
// rate at every step left to run (a horizon moved while still in the warmup) pass; anything else is
// refused unless state.allow_schedule_change, and then noted. A manifest without the record: a note.
std::string check_schedule(const Manifest& m, const CheckpointState& state, const std::string& path) {
  if (state.steps <= m.step) return "";  // no step left to run (sample loads a checkpoint this way)
  if (!m.schedule)
    return fmt::format("checkpoint '{}' records no learning-rate schedule (written before shardlab recorded it): "
                       "resuming without checking --lr and the schedule", path);
  const ManifestSchedule& was = *m.schedule;
  const StepConfig& c = state.step;
  const LrSchedule& now = c.schedule;
  std::vector<std::string> changed;
  auto compare = [&changed](const char* flag, double a, float b) {
    if (static_cast<float>(a) != b) changed.push_back(fmt::format("{} {} -> {}", flag, static_cast<float>(a), b));
  };
  if (was.kind != schedule_name(now.kind)) changed.push_back(fmt::format("--schedule {} -> {}", was.kind, schedule_name(now.kind)));
  compare("--lr", was.lr, now.lr);
  if (was.warmup_steps != now.warmup_steps)
    changed.push_back(fmt::format("--warmup-steps {} -> {}", was.warmup_steps, now.warmup_steps));
  if (was.decay_steps != now.total_steps)
    changed.push_back(fmt::format("the cosine's last step (--lr-decay-steps, else --steps) {} -> {}", was.decay_steps,
                                  now.total_steps));
  compare("--min-lr-frac", was.min_lr_frac, now.min_lr_frac);
  const size_t schedule_changes = changed.size();  // the rest change the update itself
  const ManifestOptimizer& o = m.optimizer;
  compare("--grad-clip", was.grad_clip, c.grad_clip);
  compare("--beta1", o.beta1, c.optim.beta1);
  compare("--beta2", o.beta2, c.optim.beta2);
  compare("--eps", o.eps, c.optim.eps);
  compare("--weight-decay", o.weight_decay, c.optim.weight_decay);
  compare("--momentum", o.momentum, c.optim.momentum);
  if (changed.empty()) return "";
  const bool update_changed = changed.size() > schedule_changes;
  LrSchedule old;
  old.kind = parse_schedule(was.kind);
  old.lr = static_cast<float>(was.lr), old.min_lr_frac = static_cast<float>(was.min_lr_frac);
  old.warmup_steps = was.warmup_steps, old.total_steps = was.decay_steps;
  int64_t first = m.step;  // the first step left whose learning rate differs
  while (first < state.steps && now.at(first) == old.at(first)) ++first;
  if (first == state.steps && !update_changed) return "";
  const std::string what =
      first == state.steps ? fmt::format("{}", fmt::join(changed, ", "))
                           : fmt::format("{}; at step {} the learning rate is {:.4g} where the checkpoint's schedule "
                                         "gives {:.4g}", fmt::join(changed, ", "), first + 1, now.at(first), old.at(first));
  SHARD_REQUIRE(state.allow_schedule_change, "checkpoint '{}' was trained with other optimizer settings: {}. Pass the "
                "checkpoint's values (a run extended to more steps keeps its cosine with --lr-decay-steps {}), or "
                "--allow-schedule-change to go on with the new ones", path, what, was.decay_steps);
  return fmt::format("resuming '{}' with changed optimizer settings (--allow-schedule-change): {}", path, what);
}

}  // namespace

RunPosition load_checkpoint(const std::string& path, const CheckpointState& state) {
  const fs::path dir(path);
  const Manifest m = read_manifest(dir);
  Strategy& st = state.strategy;
  const auto names = st.owned_state_names();
  check_compatible(m, state, path);
  std::string note = check_data(m, state, path);
  if (const std::string n = check_schedule(m, state, path); !n.empty()) note += (note.empty() ? "" : "\n") + n;
  CheckpointFiles files(dir, m.files);
  const auto& units = state.units;
  for (size_t u = 0; u < units.size(); ++u) {
    auto [a, b] = st.owned_range(u);
    if (b <= a) continue;
    auto tensors = st.owned_state(u);
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::vector<float> host(static_cast<size_t>(b - a));
      read_unit_state(m, files, units[u]->layout(), a, b, names[i], host, path);
      state.backend.copy(tensors[i].slice(0, b - a), Tensor::of(std::span<float>(host)));
    }
  }
  st.sync_after_load();
  RunPosition at{m.step, m.data_position, std::nullopt, note, m.run_id};
  if (m.val_loss) at.val_loss = static_cast<float>(*m.val_loss);
  return at;
}

}  // namespace shardlab
