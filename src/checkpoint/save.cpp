// save.cpp — writing checkpoints (the phases: save_phases.hpp), --save-best's link.
#include "src/checkpoint/checkpoint.hpp"
#include "src/checkpoint/checkpoint_format.hpp"
#include "src/checkpoint/save_phases.hpp"

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
namespace save_detail {
namespace {
std::string step_name(int64_t step) { return fmt::format("step_{:08d}", step); }
}  // namespace

SavePaths SavePaths::of(const std::string& dir, int64_t step) {
  const fs::path root(dir);
  return {root, root / (".tmp." + step_name(step)), root / step_name(step)};
}

std::string rank_file(int rank) { return fmt::format("rank_{:05d}.bin", rank); }

void fsync_path(const fs::path& p, bool directory) {
  int fd = ::open(p.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  SHARD_REQUIRE(fd >= 0, "cannot open '{}' to sync it: {}", p.string(), std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  SHARD_REQUIRE(rc == 0 || directory, "cannot sync '{}': {}", p.string(), std::strerror(err));
}

namespace {

// Writes bytes with a running checksum, through write(2) so that a failure (disk full, the
// file-size limit, an I/O error) names the file and the system's reason.
class CheckedWriter final : public ByteSink {
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
  uint64_t offset() const override { return offset_; }
  void write(const void* data, size_t n) override {
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

}  // namespace

int fault_in_save(int rank) {
  const char* kill = std::getenv("SHARDLAB_FAULT_KILL_IN_SAVE");
  const char* stop = std::getenv("SHARDLAB_FAULT_STOP_IN_SAVE");
  return kill && std::atoi(kill) == rank ? SIGKILL : stop && std::atoi(stop) == rank ? SIGSTOP : 0;
}

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

uint64_t owned_state_bytes(const CheckpointState& state) {
  uint64_t n = 0;
  for (size_t u = 0; u < state.units.size(); ++u) {
    const auto [a, b] = state.strategy.saved_range(u);
    if (b > a) n += static_cast<uint64_t>(b - a) * state.strategy.owned_state_names().size() * sizeof(float);
  }
  return n;
}

bool owns_state(const CheckpointState& state) {
  bool owns = false;
  for (size_t u = 0; u < state.units.size(); ++u)
    owns |= state.strategy.saved_range(u).second > state.strategy.saved_range(u).first;
  return owns;
}

bool collect_rank_state(const CheckpointState& state, ByteSink& sink, nlohmann::json& pieces) {
  Strategy& st = state.strategy;
  const auto& units = state.units;
  const int rank = state.comm.rank();
  if (!owns_state(state)) return false;
  const auto names = st.owned_state_names();
  pieces = nlohmann::json::object();
  const int fault = fault_in_save(rank);  // a file being written (a buffer's faults in write_rank_bytes)
  // Buffers reused across units: a fresh one per tensor cost a page fault per 4 KiB each time.
  std::vector<float> staged, host;
  for (size_t u = 0; u < units.size(); ++u) {
    auto [a, b] = st.saved_range(u);
    if (b <= a) continue;
    auto tensors = st.owned_state(u);
    for (size_t i = 0; i < tensors.size(); ++i) {
      // f32 in host memory is read where it is; anything else is copied to the host first.
      const Tensor t = tensors[i].slice(0, b - a);
      std::span<const float> values(static_cast<const float*>(t.data()), static_cast<size_t>(b - a));
      if (t.device() != Device::cpu || t.dtype() != DType::f32) {
        host.resize(static_cast<size_t>(b - a));
        state.backend.copy(Tensor::of(std::span<float>(host)), t);
        values = host;
      }
      if (auto* buffer = dynamic_cast<BufferSink*>(&sink)) {  // straight into it: its offsets are the file's
        append_unit_state(units[u]->layout(), a, b, values, rank, names[i], 0, buffer->floats, pieces);
        continue;
      }
      staged.clear();
      append_unit_state(units[u]->layout(), a, b, values, rank, names[i], sink.offset(), staged, pieces);
      if (fault && u == units.size() / 2) {
        sink.write(staged.data(), staged.size() * sizeof(float) / 2);
        std::raise(fault);
      }
      sink.write(staged.data(), staged.size() * sizeof(float));
    }
    st.release_state_views();  // what was staged for this unit (Muon's v at full size)
  }
  return true;
}

uint64_t write_rank_bytes(const fs::path& tmp, int rank, const std::vector<float>& values) {
  CheckedWriter w(tmp / rank_file(rank));
  if (const int fault = fault_in_save(rank)) {
    w.write(values.data(), values.size() / 2 * sizeof(float));
    std::raise(fault);
  }
  w.write(values.data(), values.size() * sizeof(float));
  return w.close();
}

int description_tp_rank(const CheckpointState& state) {
  return state.units[0]->layout().tp_degree > 1 ? state.units[0]->layout().tp_rank : -1;
}

void write_rank_description(const fs::path& tmp, int rank, uint64_t bytes, uint64_t hash, const nlohmann::json& pieces,
                            int tp_rank) {
  nlohmann::json side = {{"file", rank_file(rank)}, {"bytes", bytes},
                         {"checksum", fnv1a64_text(hash)}, {"pieces", pieces}};
  if (tp_rank >= 0) side["tp_rank"] = tp_rank;
  const fs::path path = tmp / (rank_file(rank) + ".json"), part = tmp / (rank_file(rank) + ".json.part");
  write_small_file(part, side.dump());
  std::error_code ec;
  fs::rename(part, path, ec);
  SHARD_REQUIRE(!ec, "cannot rename '{}' to '{}': {}", part.string(), path.string(), ec.message());
}

namespace {

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
  if (c.optim.kind == OptimizerKind::muon)
    m["optimizer"]["muon"] = {{"ns_steps", c.optim.muon.ns_steps}, {"ns_dtype", dtype_name(c.optim.muon.ns_dtype)},
                              {"adjust_lr", muon_adjust_lr_name(c.optim.muon.adjust_lr)}};
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

}  // namespace

ManifestBase manifest_base(const CheckpointState& state, const RunPosition& at) {
  ManifestBase base{manifest_head(state, state.comm.world_size(), at, state.strategy.owned_state_names()),
                    state.tokenizer, state.hf_config};
  nlohmann::json& m = base.json;
  if (at.val_loss) m["val_loss"] = *at.val_loss;
  // The whole model's tensors (under --pp this rank holds one stage's), at their whole shapes:
  // pieces are whole-tensor regions.
  for (const UnitLayout& unit : family_of(state.step.spec).layout(state.step.spec))
    for (const TensorDecl& t : unit.tensors) m["tensors"][t.name]["shape"] = t.full_shape;
  if (const CarriedTokenizer* t = state.tokenizer)
    m["tokenizer"] = {{"file", "tokenizer.json"}, {"source", t->source}, {"bytes", t->json.size()},
                      {"checksum", fnv1a64_text(fnv1a64(t->json))}};
  if (const CarriedConfig* c = state.hf_config)
    m["hf_config"] = {{"file", kCarriedConfigFile}, {"source", c->source}, {"bytes", c->json.size()},
                      {"checksum", fnv1a64_text(fnv1a64(c->json))}};
  return base;
}

void finish_manifest(const fs::path& tmp, ManifestBase base, const std::vector<uint64_t>& wrote) {
  const int world = static_cast<int>(wrote.size());
  for (int r = 0; r < world; ++r)
    SHARD_REQUIRE(!wrote[static_cast<size_t>(r)] || fs::exists(tmp / (rank_file(r) + ".json")),
                  "rank {} wrote '{}' but its description '{}' is not there", r, (tmp / rank_file(r)).string(),
                  (tmp / (rank_file(r) + ".json")).string());
  nlohmann::json& m = base.json;
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
  if (base.tokenizer) write_small_file(tmp / "tokenizer.json", base.tokenizer->json);
  if (base.hf_config) write_small_file(tmp / kCarriedConfigFile, base.hf_config->json);
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

void throw_save_failed(const std::string& error, int64_t step, const fs::path& root) {
  std::string newest;
  try {
    newest = latest_checkpoint(root.string());
  } catch (const std::exception&) {  // an unreadable directory holds none we could resume
  }
  throw InputError(fmt::format("saving the checkpoint of step {} failed: {}. {}", step, error,
                               newest.empty() ? fmt::format("There is no complete checkpoint under '{}': nothing of "
                                                            "this run is saved", root.string())
                                              : fmt::format("The newest complete checkpoint, '{}', is intact "
                                                            "(--resume auto finds it)", newest)));
}

void agree(Communicator& comm, bool who, const std::function<void()>& phase, int64_t step, const fs::path& root) {
  std::string error;
  try {
    if (who) phase();
  } catch (const std::exception& e) {
    error = e.what();
  }
  for (const std::string& e : comm.all_gather_strings(error))
    if (!e.empty()) throw_save_failed(e, step, root);
}

}  // namespace save_detail

using namespace save_detail;

std::string checkpoint_path(const std::string& dir, int64_t step) {
  return SavePaths::of(dir, step).final_dir.string();
}

std::string save_checkpoint(const std::string& dir, const CheckpointState& state, const RunPosition& at, int64_t keep) {
  Communicator& comm = state.comm;
  const int64_t step = at.step;
  const SavePaths paths = SavePaths::of(dir, step);
  const fs::path& root = paths.root;
  std::signal(SIGXFSZ, SIG_IGN);  // past the file-size limit, write(2) fails with EFBIG instead of killing us
  WatchdogInSave in_save;  // rank 0 alone may keep the others waiting for long: --save-timeout bounds it
  const bool root_rank = comm.rank() == 0;
  agree(comm, root_rank, [&] { make_tmp_dir(paths); }, step, root);
  try {
    uint64_t wrote = 0;
    agree(comm, true, [&] {
      if (!owns_state(state)) return;
      nlohmann::json pieces;
      CheckedWriter w(paths.tmp / rank_file(comm.rank()));
      collect_rank_state(state, w, pieces);
      const uint64_t bytes = w.offset(), hash = w.close();
      write_rank_description(paths.tmp, comm.rank(), bytes, hash, pieces, description_tp_rank(state));
      wrote = 1;
    }, step, root);
    const std::vector<uint64_t> writers = comm.gather_u64(std::span<const uint64_t>(&wrote, 1));
    agree(comm, root_rank, [&] {
      finish_manifest(paths.tmp, manifest_base(state, at), writers);
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
  fs::create_symlink(SavePaths::of(dir, step).final_dir.filename(), tmp, ec);
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

}  // namespace shardlab
