// checkpoint_format.cpp — the parts of the checkpoint format that need no training runtime: the
// manifest parser, the checked file reader, finding the newest checkpoint, and export. Kept apart so
// the fuzz targets (tests/fuzz) build with clang from a handful of sources.
#include "src/train/checkpoint_format.hpp"

#include <filesystem>
#include <fstream>
#include <map>

#include "src/model/safetensors.hpp"
#include "src/model/spec.hpp"

namespace shardlab {
namespace fs = std::filesystem;

nlohmann::json parse_manifest(const std::string& text, const std::string& origin) {
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("'{}' is corrupt: {}", origin, e.what()));
  }
  auto bad = [&](const std::string& what) { return InputError(fmt::format("'{}' is not a valid manifest: {}", origin, what)); };
  auto integer = [&](const nlohmann::json& o, const char* key, int64_t lo) {
    if (!o.is_object() || !o.contains(key) || !o[key].is_number_integer()) throw bad(fmt::format("\"{}\" must be an integer", key));
    int64_t v = o[key].get<int64_t>();
    if (v < lo) throw bad(fmt::format("\"{}\" is {}, below {}", key, v, lo));
    return v;
  };
  if (!m.is_object() || !m.contains("format") || !m["format"].is_string() || m["format"].get<std::string>() != kCheckpointFormat)
    throw bad(fmt::format("its format is not {}", kCheckpointFormat));
  ModelSpec spec;
  const auto& model = m.contains("model") ? m["model"] : nlohmann::json();
  spec.layers = integer(model, "layers", 1);
  spec.dim = integer(model, "dim", 1);
  spec.heads = integer(model, "heads", 1);
  spec.seq = integer(model, "seq", 1);
  spec.vocab = integer(model, "vocab", 2);
  try {
    spec.validate();
  } catch (const InputError& e) {
    throw bad(e.what());
  }
  integer(m, "step", 0);
  integer(m, "world", 1);
  if (!m.contains("strategy") || !m["strategy"].is_string()) throw bad("\"strategy\" must be a string");
  if (!m.contains("optimizer") || !m["optimizer"].is_object() || !m["optimizer"].contains("kind") ||
      !m["optimizer"]["kind"].is_string())
    throw bad("\"optimizer\" must name its kind");
  if (!m.contains("files") || !m["files"].is_array()) throw bad("\"files\" must be an array");
  std::map<int64_t, bool> ranks;
  for (const auto& f : m["files"]) {
    int64_t r = integer(f, "rank", 0);
    integer(f, "bytes", 0);
    if (!f.contains("file") || !f["file"].is_string() || !f.contains("checksum") || !f["checksum"].is_string())
      throw bad("every file needs a name and a checksum");
    std::string name = f["file"].get<std::string>();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      throw bad(fmt::format("file name '{}' must be a plain name inside the checkpoint", name));
    ranks[r] = true;
  }
  if (!m.contains("tensors") || !m["tensors"].is_object()) throw bad("\"tensors\" must be an object");
  for (const auto& [name, states] : m["tensors"].items()) {
    if (!states.is_object()) throw bad(fmt::format("tensor '{}' must be an object", name));
    for (const auto& [state, list] : states.items()) {
      if (state == "shape") {
        if (!list.is_array()) throw bad(fmt::format("the shape of '{}' must be an array", name));
        for (const auto& d : list)
          if (!d.is_number_integer() || d.get<int64_t>() < 0) throw bad(fmt::format("the shape of '{}' is not valid", name));
        continue;
      }
      if (!list.is_array()) throw bad(fmt::format("{} of '{}' must be a list of pieces", state, name));
      for (const auto& p : list) {
        int64_t r = integer(p, "rank", 0), b = integer(p, "begin", 0), e = integer(p, "end", 0);
        integer(p, "offset", 0);
        if (e <= b) throw bad(fmt::format("a piece of {} of '{}' spans [{}, {})", state, name, b, e));
        if (!ranks.count(r)) throw bad(fmt::format("a piece of {} of '{}' lies in rank {}'s file, which is not listed", state, name, r));
      }
    }
  }
  return m;
}

nlohmann::json read_manifest(const fs::path& dir) {
  fs::path p = dir / "manifest.json";
  std::ifstream f(p);
  SHARD_REQUIRE(f.good(), "'{}' is not a checkpoint: it has no manifest.json", dir.string());
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return parse_manifest(text, p.string());
}

std::string latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  std::string best;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind("step_", 0) != 0 || !fs::exists(e.path() / "manifest.json")) continue;
    if (best.empty() || n > fs::path(best).filename().string()) best = e.path().string();
  }
  return best;
}

void export_checkpoint(const std::string& path, const std::string& out, DType dtype) {
  const fs::path dir(path);
  nlohmann::json m = read_manifest(dir);
  CheckpointFiles files(dir, m["files"]);
  ModelSpec spec;
  spec.name = m["model"].value("name", "custom");
  for (auto [field, key] : {std::pair{&spec.layers, "layers"}, std::pair{&spec.dim, "dim"},
                            std::pair{&spec.heads, "heads"}, std::pair{&spec.seq, "seq"}, std::pair{&spec.vocab, "vocab"}})
    *field = m["model"].at(key).get<int64_t>();
  spec.validate();
  std::vector<SafetensorsStreamWriter::Entry> entries;
  std::vector<const TensorDecl*> decls;
  auto layout = gpt2_layout(spec);
  for (const auto& u : layout)
    for (const TensorDecl& t : u.tensors) {
      entries.push_back({t.name, dtype, t.shape});
      decls.push_back(&t);
    }
  SafetensorsStreamWriter w(out, entries, {{"format", "pt"}, {"model", spec.describe()}, {"step", m["step"].dump()}});
  for (const TensorDecl* t : decls) {  // one tensor in memory at a time
    SHARD_REQUIRE(m["tensors"].contains(t->name) && m["tensors"][t->name].contains("param"),
                  "checkpoint '{}' has no parameters for tensor '{}'", path, t->name);
    // Check the pieces before allocating anything their sizes suggest.
    int64_t covered = 0;
    for (const auto& p : m["tensors"][t->name]["param"]) {
      int64_t pb = p.at("begin").get<int64_t>(), pe = p.at("end").get<int64_t>();
      SHARD_REQUIRE(pb >= 0 && pe <= t->numel && pb < pe, "checkpoint '{}': bad range [{}, {}) for '{}'", path, pb, pe,
                    t->name);
      files.check_range(p.at("rank").get<int>(), p.at("offset").get<uint64_t>(), static_cast<uint64_t>(pe - pb), t->name);
      covered += pe - pb;
    }
    SHARD_REQUIRE(covered == t->numel, "checkpoint '{}' covers {} of the {} elements of '{}'", path, covered, t->numel,
                  t->name);
    std::vector<float> v(static_cast<size_t>(t->numel));
    for (const auto& p : m["tensors"][t->name]["param"]) {
      int64_t pb = p.at("begin").get<int64_t>(), pe = p.at("end").get<int64_t>();
      files.read(p.at("rank").get<int>(), p.at("offset").get<uint64_t>(), v.data() + pb, static_cast<size_t>(pe - pb),
                 t->name);
    }
    w.write_next(v);
  }
  w.finish();
}

}  // namespace shardlab
