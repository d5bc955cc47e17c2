#include "src/train/checkpoint.hpp"
#include "src/train/checkpoint_format.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "src/core/hash.hpp"
#include "src/model/safetensors.hpp"

namespace shardlab {
namespace fs = std::filesystem;
namespace {

std::string step_name(int64_t step) { return fmt::format("step_{:08d}", step); }
std::string rank_file(int rank) { return fmt::format("rank_{:05d}.bin", rank); }

void fsync_path(const fs::path& p, bool directory) {
  int fd = ::open(p.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  SHARD_REQUIRE(fd >= 0, "cannot open '{}' to sync it", p.string());
  ::fsync(fd);
  ::close(fd);
}

// Writes bytes with a running checksum; one rank's file.
class CheckedWriter {
 public:
  explicit CheckedWriter(const fs::path& p) : path_(p), f_(p, std::ios::binary | std::ios::trunc) {
    SHARD_REQUIRE(f_.good(), "cannot write checkpoint file '{}'", p.string());
  }
  uint64_t offset() const { return offset_; }
  void write(const void* data, size_t n) {
    f_.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
    hash_ = fnv1a64(std::string_view(static_cast<const char*>(data), n), hash_);
    offset_ += n;
  }
  uint64_t close() {
    f_.flush();
    SHARD_REQUIRE(f_.good(), "writing '{}' failed (disk full?)", path_.string());
    f_.close();
    fsync_path(path_, false);
    return hash_;
  }

 private:
  fs::path path_;
  std::ofstream f_;
  uint64_t offset_ = 0, hash_ = kFnv1a64Basis;
};

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

// Rank 0: a fresh, empty temporary directory.
void make_tmp_dir(const SavePaths& paths) {
  std::error_code ec;
  fs::create_directories(paths.root, ec);
  SHARD_REQUIRE(!ec, "--save-dir '{}': cannot create it: {}", paths.root.string(), ec.message());
  fs::remove_all(paths.tmp, ec);
  fs::create_directory(paths.tmp, ec);
  SHARD_REQUIRE(!ec, "cannot create '{}': {}", paths.tmp.string(), ec.message());
}

// Records where the tensors of `unit` that overlap flat elements [a, b) lie: `base` is the byte
// offset in this rank's file of element a of state `state`.
void add_pieces(nlohmann::json& pieces, const UnitLayout& unit, int64_t a, int64_t b, uint64_t base, int rank,
                const std::string& state) {
  for (const TensorDecl& t : unit.tensors) {
    int64_t lo = std::max(a, t.offset), hi = std::min(b, t.offset + t.numel);
    if (lo >= hi) continue;
    pieces[t.name][state].push_back({{"rank", rank},
                                     {"offset", base + static_cast<uint64_t>(lo - a) * sizeof(float)},
                                     {"begin", lo - t.offset},
                                     {"end", hi - t.offset}});
  }
}

// Phase 1 (every rank): per unit, per state, the owned range as f32 into tmp/rank_XXXXX.bin, fsynced;
// then rank_XXXXX.bin.json with its size, checksum and pieces (tensor -> state -> [piece]).
// A rank that owns nothing writes neither.
void write_rank_file(const fs::path& tmp, Trainer& trainer) {
  Strategy& st = trainer.strategy();
  const auto& units = trainer.units();
  const int rank = trainer.comm().rank();
  bool owns = false;
  for (size_t u = 0; u < units.size(); ++u) owns |= st.owned_range(u).second > st.owned_range(u).first;
  if (!owns) return;
  const auto names = st.owned_state_names();
  nlohmann::json pieces = nlohmann::json::object();
  CheckedWriter w(tmp / rank_file(rank));
  for (size_t u = 0; u < units.size(); ++u) {
    auto [a, b] = st.owned_range(u);
    if (b <= a) continue;
    auto tensors = st.owned_state(u);
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::vector<float> host(static_cast<size_t>(b - a));
      trainer.backend().copy(Tensor::of(std::span<float>(host)), tensors[i].slice(0, b - a));
      const uint64_t base = w.offset();
      if (kill_in_save(rank) && u == units.size() / 2) {
        w.write(host.data(), host.size() * sizeof(float) / 2);
        std::raise(SIGKILL);
      }
      w.write(host.data(), host.size() * sizeof(float));
      add_pieces(pieces, units[u]->layout(), a, b, base, rank, names[i]);
    }
  }
  uint64_t hash = w.close();
  nlohmann::json side = {{"file", rank_file(rank)}, {"bytes", fs::file_size(tmp / rank_file(rank))},
                         {"checksum", fmt::format("fnv1a64:{:016x}", hash)}, {"pieces", pieces}};
  std::ofstream(tmp / (rank_file(rank) + ".json")) << side.dump();
  fsync_path(tmp / (rank_file(rank) + ".json"), false);
}

// The manifest's description of the run (format, model, strategy, ..., seed); files and tensors empty.
nlohmann::json manifest_head(const TrainConfig& c, int world, int64_t step, const std::vector<std::string>& states) {
  nlohmann::json m;
  m["format"] = kCheckpointFormat;
  m["model"] = spec_to_json(c.spec);
  m["strategy"] = strategy_name(c.strategy.kind);
  m["world"] = world;
  m["param_dtype"] = dtype_name(c.strategy.precision.param_dtype);
  m["reduce_dtype"] = dtype_name(c.strategy.precision.reduce_dtype);
  m["optimizer"] = {{"kind", optimizer_name(c.optim.kind)}, {"beta1", c.optim.beta1}, {"beta2", c.optim.beta2}, {"eps", c.optim.eps},
                    {"weight_decay", c.optim.weight_decay}, {"momentum", c.optim.momentum}, {"states", states}};
  m["step"] = step;
  m["data_position"] = step;  // batches are a function of the step index: resume at step `step`
  m["seed"] = c.seed;
  m["files"] = nlohmann::json::array();
  m["tensors"] = nlohmann::json::object();
  return m;
}

// Phase 2 (rank 0): the side files (consumed) and every tensor's shape into tmp/manifest.json.
void merge_manifest(const fs::path& tmp, int64_t step, Trainer& trainer) {
  const int world = trainer.comm().world_size();
  nlohmann::json m = manifest_head(trainer.config(), world, step, trainer.strategy().owned_state_names());
  for (int r = 0; r < world; ++r) {
    fs::path side = tmp / (rank_file(r) + ".json");
    if (!fs::exists(side)) continue;
    nlohmann::json j = nlohmann::json::parse(std::ifstream(side));
    m["files"].push_back({{"rank", r}, {"file", j["file"]}, {"bytes", j["bytes"]}, {"checksum", j["checksum"]}});
    for (auto& [tensor, states] : j["pieces"].items())
      for (auto& [state, list] : states.items())
        for (auto& p : list) m["tensors"][tensor][state].push_back(p);
    fs::remove(side);
  }
  for (const auto& unit : trainer.units())
    for (const TensorDecl& t : unit->layout().tensors) m["tensors"][t.name]["shape"] = t.shape;
  std::ofstream f(tmp / "manifest.json", std::ios::trunc);
  f << m.dump(1) << '\n';
  SHARD_REQUIRE(f.good(), "writing the manifest in '{}' failed", tmp.string());
}

// Phase 3 (rank 0): make the manifest and directory durable, then publish it with one rename
// (replacing an older checkpoint of the same step), and make the rename durable.
void commit_checkpoint(const SavePaths& paths) {
  fsync_path(paths.tmp / "manifest.json", false);
  fsync_path(paths.tmp, true);
  std::error_code ec;
  if (fs::exists(paths.final_dir)) fs::remove_all(paths.final_dir, ec);
  fs::rename(paths.tmp, paths.final_dir, ec);
  SHARD_REQUIRE(!ec, "cannot rename '{}' to '{}': {}", paths.tmp.string(), paths.final_dir.string(), ec.message());
  fsync_path(paths.root, true);
}

}  // namespace

std::string save_checkpoint(const std::string& dir, int64_t step, Trainer& trainer) {
  Communicator& comm = trainer.comm();
  const fs::path root(dir);
  const SavePaths paths{root, root / (".tmp." + step_name(step)), root / step_name(step)};
  if (comm.rank() == 0) make_tmp_dir(paths);
  comm.barrier().wait();
  write_rank_file(paths.tmp, trainer);
  comm.barrier().wait();
  if (comm.rank() == 0) {
    merge_manifest(paths.tmp, step, trainer);
    commit_checkpoint(paths);
  }
  comm.barrier().wait();
  return paths.final_dir.string();
}

// ---- Loading ------------------------------------------------------------------------------------

namespace {

void check_compatible(const Manifest& m, const TrainConfig& c, const std::string& path) {
  auto same = [&](const char* k, int64_t there, int64_t here) {
    SHARD_REQUIRE(there == here, "checkpoint '{}' is of another model: {} {} there, {} here (model {} vs {})", path, k,
                  there, here, m.model.name, c.spec.describe());
  };
  same("layers", m.model.layers, c.spec.layers);
  same("dim", m.model.dim, c.spec.dim);
  same("heads", m.model.heads, c.spec.heads);
  same("seq", m.model.seq, c.spec.seq);
  same("vocab", m.model.vocab, c.spec.vocab);
  SHARD_REQUIRE(m.optimizer.kind == optimizer_name(c.optim.kind),
                "checkpoint '{}' holds {} state; this run uses --optimizer {}", path, m.optimizer.kind,
                optimizer_name(c.optim.kind));
}

// Reads elements [lo, hi) of `state` of tensor t into dst[0, hi - lo), from whichever pieces overlap.
void read_tensor_range(const Manifest& m, CheckpointFiles& files, const TensorDecl& t, const std::string& state,
                       int64_t lo, int64_t hi, float* dst, const std::string& path) {
  const std::vector<ManifestPiece>* pieces = m.find_pieces(t.name, state);
  SHARD_REQUIRE(pieces, "checkpoint '{}' has no {} for tensor '{}'", path, state, t.name);
  const std::vector<int64_t>& shape = m.tensors.at(t.name).shape;
  SHARD_REQUIRE(shape == t.shape, "checkpoint '{}': tensor '{}' has shape {}, the model expects {}", path, t.name,
                nlohmann::json(shape).dump(), nlohmann::json(t.shape).dump());
  int64_t covered = 0;
  for (const ManifestPiece& p : *pieces) {
    int64_t x0 = std::max(lo, p.begin), x1 = std::min(hi, p.end);
    if (x0 >= x1) continue;
    files.read(p.rank, p.offset + static_cast<uint64_t>(x0 - p.begin) * sizeof(float), dst + (x0 - lo),
               static_cast<size_t>(x1 - x0), t.name);
    covered += x1 - x0;
  }
  SHARD_REQUIRE(covered == hi - lo, "checkpoint '{}' covers {} of the {} elements [{}, {}) of {} '{}' this rank needs",
                path, covered, hi - lo, lo, hi, state, t.name);
}

}  // namespace

int64_t load_checkpoint(const std::string& path, Trainer& trainer) {
  const fs::path dir(path);
  const Manifest m = read_manifest(dir);
  Strategy& st = trainer.strategy();
  const auto names = st.owned_state_names();
  check_compatible(m, trainer.config(), path);
  CheckpointFiles files(dir, m.files);
  const auto& units = trainer.units();
  for (size_t u = 0; u < units.size(); ++u) {
    auto [a, b] = st.owned_range(u);
    if (b <= a) continue;
    auto tensors = st.owned_state(u);
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::vector<float> host(static_cast<size_t>(b - a));
      for (const TensorDecl& t : units[u]->layout().tensors) {
        int64_t lo = std::max(a, t.offset) - t.offset, hi = std::min(b, t.offset + t.numel) - t.offset;
        if (lo >= hi) continue;
        read_tensor_range(m, files, t, names[i], lo, hi, host.data() + (t.offset + lo - a), path);
      }
      trainer.backend().copy(tensors[i].slice(0, b - a), Tensor::of(std::span<float>(host)));
    }
  }
  st.sync_after_load();
  return m.step;
}

}  // namespace shardlab
