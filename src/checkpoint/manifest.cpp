// manifest.cpp — the checkpoint manifest (manifest.json): parsed and validated before anything is
// read, every message naming the file and the field (checkpoint_format.hpp).
#include "src/checkpoint/checkpoint_format.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "src/core/hash.hpp"
#include "src/model/family.hpp"
#include "src/model/hf_dir.hpp"
#include "src/model/safetensors.hpp"

namespace shardlab {
namespace fs = std::filesystem;
using nlohmann::json;

// ---- Manifest parser ----------------------------------------------------------------------------
// Every check throws InputError "'<origin>' is not a valid manifest: <what>". The checks run in the
// order of the fields below, so a manifest with several faults always names the same one.

namespace {

struct ManifestParser {
  const std::string& origin;

  InputError bad(const std::string& what) const {
    return InputError(fmt::format("'{}' is not a valid manifest: {}", origin, what));
  }
  int64_t integer(const json& o, const char* key, int64_t lo) const {
    if (!o.is_object() || !o.contains(key) || !o[key].is_number_integer())
      throw bad(fmt::format("\"{}\" must be an integer", key));
    int64_t v = o[key].get<int64_t>();
    if (v < lo) throw bad(fmt::format("\"{}\" is {}, below {}", key, v, lo));
    return v;
  }
  // An optional number (a hyperparameter): `fallback` when absent.
  double number(const json& o, const char* key, double fallback) const {
    if (!o.contains(key)) return fallback;
    if (!o[key].is_number()) throw bad(fmt::format("\"{}\" must be a number", key));
    return o[key].get<double>();
  }
  // An optional dtype name: f32 when absent.
  DType dtype(const json& m, const char* key) const {
    if (!m.contains(key)) return DType::f32;
    if (!m[key].is_string()) throw bad(fmt::format("\"{}\" must be a dtype name", key));
    try {
      return parse_dtype(m[key].get<std::string>());
    } catch (const InputError& e) {
      throw bad(fmt::format("\"{}\": {}", key, e.what()));
    }
  }
  // Any uint64 (0 when absent): above 2^63 the JSON number is unsigned, which integer() would wrap.
  uint64_t seed(const json& m) const {
    if (!m.contains("seed")) return 0;
    return m["seed"].is_number_unsigned() ? m["seed"].get<uint64_t>() : static_cast<uint64_t>(integer(m, "seed", 0));
  }
  ModelSpec model(const json& m) const {
    try {
      return spec_from_json(m.contains("model") ? m["model"] : json());
    } catch (const InputError& e) {
      throw bad(e.what());
    }
  }
  ManifestOptimizer optimizer(const json& m) const;
  std::vector<ManifestFile> files(const json& m) const;
  std::string string(const json& o, const char* key) const {
    if (!o.is_object() || !o.contains(key) || !o[key].is_string()) throw bad(fmt::format("\"{}\" must be a string", key));
    return o[key].get<std::string>();
  }
  DataSource source(const json& o) const {
    if (!o.is_object()) throw bad("a data source must be an object");
    DataSource s{string(o, "path"), static_cast<uint64_t>(integer(o, "bytes", 0)), string(o, "hash"), {}};
    if (o.contains("files")) {
      if (!o["files"].is_array()) throw bad("a data source's \"files\" must be an array");
      for (const json& f : o["files"])
        s.files.push_back({string(f, "path"), static_cast<uint64_t>(integer(f, "bytes", 0)), string(f, "hash")});
    }
    return s;
  }
  DataRecord data(const json& m) const {
    const json& d = m["data"];
    if (!d.is_object() || !d.contains("train")) throw bad("\"data\" must be an object with \"train\"");
    DataRecord r;
    r.train = source(d["train"]);
    r.batch = integer(d, "batch", 1);
    r.seq = integer(d, "seq", 1);
    if (d.contains("val_data")) r.val_data = source(d["val_data"]);
    if (d.contains("val_fraction")) {
      if (!d["val_fraction"].is_number()) throw bad("\"val_fraction\" must be a number");
      r.val_fraction = d["val_fraction"].get<double>();
    }
    return r;
  }
  std::vector<SliceDim> slice(const json& p, const std::string& where) const;
  void check_slices(const std::string& name, const ManifestTensor& t) const;
  std::map<std::string, ManifestTensor> tensors(const json& m, const std::vector<ManifestFile>& files, int version) const;
};

ManifestOptimizer ManifestParser::optimizer(const json& m) const {
  if (!m.contains("optimizer") || !m["optimizer"].is_object() || !m["optimizer"].contains("kind") ||
      !m["optimizer"]["kind"].is_string())
    throw bad("\"optimizer\" must name its kind");
  const json& o = m["optimizer"];
  ManifestOptimizer opt;
  opt.kind = o["kind"].get<std::string>();
  opt.beta1 = number(o, "beta1", 0);
  opt.beta2 = number(o, "beta2", 0);
  opt.eps = number(o, "eps", 0);
  opt.weight_decay = number(o, "weight_decay", 0);
  opt.momentum = number(o, "momentum", 0);
  if (o.contains("muon")) {
    const json& mu = o["muon"];
    if (!mu.is_object() || !mu.contains("ns_dtype") || !mu["ns_dtype"].is_string() || !mu.contains("adjust_lr") ||
        !mu["adjust_lr"].is_string())
      throw bad("the optimizer's \"muon\" must give ns_steps, ns_dtype and adjust_lr");
    opt.muon_ns_steps = static_cast<int64_t>(number(mu, "ns_steps", 0));
    if (opt.muon_ns_steps < 1) throw bad("the optimizer's \"muon\" must give ns_steps, a number of at least 1");
    opt.muon_ns_dtype = mu["ns_dtype"].get<std::string>();
    opt.muon_adjust_lr = mu["adjust_lr"].get<std::string>();
  }
  if (o.contains("states")) {
    if (!o["states"].is_array()) throw bad("the optimizer's \"states\" must be a list of names");
    for (const auto& s : o["states"]) {
      if (!s.is_string()) throw bad("the optimizer's \"states\" must be a list of names");
      opt.states.push_back(s.get<std::string>());
    }
  }
  return opt;
}

std::vector<ManifestFile> ManifestParser::files(const json& m) const {
  if (!m.contains("files") || !m["files"].is_array()) throw bad("\"files\" must be an array");
  std::vector<ManifestFile> out;
  for (const auto& f : m["files"]) {
    ManifestFile e;
    e.rank = integer(f, "rank", 0);
    if (f.contains("tp_rank")) e.tp_rank = integer(f, "tp_rank", 0);
    e.bytes = static_cast<uint64_t>(integer(f, "bytes", 0));
    if (!f.contains("file") || !f["file"].is_string() || !f.contains("checksum") || !f["checksum"].is_string())
      throw bad("every file needs a name and a checksum");
    e.file = f["file"].get<std::string>();
    if (e.file.empty() || e.file.find('/') != std::string::npos || e.file == "." || e.file == "..")
      throw bad(fmt::format("file name '{}' must be a plain name inside the checkpoint", e.file));
    e.checksum = f["checksum"].get<std::string>();
    out.push_back(std::move(e));
  }
  return out;
}

// A piece's "slice": [[offset, length], ...], offsets from 0, lengths from 1 (checked against the
// tensor's shape once the whole tensor is read: check_slices).
std::vector<SliceDim> ManifestParser::slice(const json& p, const std::string& where) const {
  std::vector<SliceDim> out;
  if (!p["slice"].is_array() || p["slice"].empty()) throw bad(fmt::format("{}: \"slice\" must be a list of [offset, length]", where));
  for (const auto& d : p["slice"]) {
    if (!d.is_array() || d.size() != 2 || !d[0].is_number_integer() || !d[1].is_number_integer())
      throw bad(fmt::format("{}: \"slice\" must be a list of [offset, length]", where));
    const int64_t o = d[0].get<int64_t>(), n = d[1].get<int64_t>();
    if (o < 0 || n < 1) throw bad(fmt::format("{}: slice dimension [{}, {}) is empty or negative", where, o, o + (n < 0 ? 0 : n)));
    out.push_back({o, n});
  }
  return out;
}

// Every sliced piece of tensor `name` against its shape: one dimension per axis, inside it, and
// [begin, end) inside the box. The products are checked for overflow (nothing is allocated here).
void ManifestParser::check_slices(const std::string& name, const ManifestTensor& t) const {
  int64_t numel = 1;
  bool sliced = false;
  for (const auto& [state, pieces] : t.states)
    for (const ManifestPiece& p : pieces) sliced |= !p.slice.empty();
  if (!sliced) return;
  for (int64_t d : t.shape)
    if (__builtin_mul_overflow(numel, d, &numel)) throw bad(fmt::format("the shape of '{}' is too large", name));
  for (const auto& [state, pieces] : t.states)
    for (const ManifestPiece& p : pieces) {
      if (p.slice.empty()) continue;
      if (p.slice.size() != t.shape.size())
        throw bad(fmt::format("a piece of {} of '{}' slices {} dimensions of a tensor of {}", state, name, p.slice.size(),
                              t.shape.size()));
      int64_t box = 1;
      for (size_t d = 0; d < p.slice.size(); ++d) {
        const SliceDim& s = p.slice[d];
        if (s.offset > t.shape[d] || s.length > t.shape[d] - s.offset)
          throw bad(fmt::format("a piece of {} of '{}' slices [{}, {}) of dimension {}, which has {}", state, name,
                                s.offset, s.offset + s.length, d, t.shape[d]));
        box *= s.length;  // at most numel: no overflow
      }
      if (p.end > box)
        throw bad(fmt::format("a piece of {} of '{}' spans [{}, {}) of a slice of {} elements", state, name, p.begin,
                              p.end, box));
    }
}

std::map<std::string, ManifestTensor> ManifestParser::tensors(const json& m, const std::vector<ManifestFile>& files,
                                                              int version) const {
  std::map<int64_t, bool> ranks;
  for (const ManifestFile& f : files) ranks[f.rank] = true;
  if (!m.contains("tensors") || !m["tensors"].is_object()) throw bad("\"tensors\" must be an object");
  std::map<std::string, ManifestTensor> out;
  for (const auto& [name, states] : m["tensors"].items()) {
    if (!states.is_object()) throw bad(fmt::format("tensor '{}' must be an object", name));
    ManifestTensor& t = out[name];
    for (const auto& [state, list] : states.items()) {
      if (state == "shape") {
        if (!list.is_array()) throw bad(fmt::format("the shape of '{}' must be an array", name));
        for (const auto& d : list) {
          if (!d.is_number_integer() || d.get<int64_t>() < 0) throw bad(fmt::format("the shape of '{}' is not valid", name));
          t.shape.push_back(d.get<int64_t>());
        }
        continue;
      }
      if (!list.is_array()) throw bad(fmt::format("{} of '{}' must be a list of pieces", state, name));
      std::vector<ManifestPiece>& pieces = t.states[state];
      for (const auto& p : list) {
        int64_t r = integer(p, "rank", 0), b = integer(p, "begin", 0), e = integer(p, "end", 0);
        uint64_t offset = static_cast<uint64_t>(integer(p, "offset", 0));
        if (e <= b) throw bad(fmt::format("a piece of {} of '{}' spans [{}, {})", state, name, b, e));
        if (!ranks.count(r)) throw bad(fmt::format("a piece of {} of '{}' lies in rank {}'s file, which is not listed", state, name, r));
        ManifestPiece piece{r, offset, b, e, {}};
        if (p.contains("slice")) {
          const std::string where = fmt::format("a piece of {} of '{}'", state, name);
          if (version < 2) throw bad(fmt::format("{} has a \"slice\", which format {} does not have", where, kCheckpointFormatV1));
          piece.slice = slice(p, where);
        }
        pieces.push_back(std::move(piece));
      }
    }
    check_slices(name, t);
  }
  return out;
}

}  // namespace

Manifest parse_manifest(const std::string& text, const std::string& origin) {
  json m;
  try {
    m = json::parse(text);
  } catch (const json::exception& e) {
    throw InputError(fmt::format("'{}' is corrupt: {}", origin, e.what()));
  }
  const ManifestParser p{origin};
  const std::string format = m.is_object() && m.contains("format") && m["format"].is_string() ? m["format"].get<std::string>() : "";
  if (format != kCheckpointFormat && format != kCheckpointFormatV1)
    throw p.bad(fmt::format("its format is not {} (or the older {})", kCheckpointFormat, kCheckpointFormatV1));
  Manifest out;
  out.version = format == kCheckpointFormat ? 2 : 1;
  out.model = p.model(m);
  out.step = p.integer(m, "step", 0);
  out.world = p.integer(m, "world", 1);
  if (m.contains("mesh")) {
    if (!m["mesh"].is_object()) throw p.bad("\"mesh\" must be an object");
    if (m["mesh"].contains("tp")) out.tp = p.integer(m["mesh"], "tp", 1);
  }
  if (!m.contains("strategy") || !m["strategy"].is_string()) throw p.bad("\"strategy\" must be a string");
  out.strategy = m["strategy"].get<std::string>();
  out.optimizer = p.optimizer(m);
  out.param_dtype = p.dtype(m, "param_dtype");
  out.reduce_dtype = p.dtype(m, "reduce_dtype");
  out.data_position = m.contains("data_position") ? p.integer(m, "data_position", 0) : out.step;
  out.seed = p.seed(m);
  if (m.contains("run_id")) out.run_id = p.string(m, "run_id");
  if (m.contains("shuffle")) {
    if (!m["shuffle"].is_boolean()) throw p.bad("\"shuffle\" must be true or false");
    out.shuffle = m["shuffle"].get<bool>();
  }
  if (m.contains("val_loss")) {
    if (!m["val_loss"].is_number()) throw p.bad("\"val_loss\" must be a number");
    out.val_loss = m["val_loss"].get<double>();
  }
  if (m.contains("data")) out.data = p.data(m);
  if (m.contains("schedule")) {
    const json& sc = m["schedule"];
    if (!sc.is_object() || !sc.contains("kind") || !sc["kind"].is_string())
      throw p.bad("\"schedule\" must be an object naming its kind");
    out.schedule = ManifestSchedule{sc["kind"].get<std::string>(), p.number(sc, "lr", 0), p.number(sc, "min_lr_frac", 0),
                                    p.number(sc, "grad_clip", 0), p.integer(sc, "warmup_steps", 0),
                                    p.integer(sc, "decay_steps", 1)};
  }
  if (m.contains("tokenizer")) {
    const json& t = m["tokenizer"];
    const bool ok = t.is_object() && t.contains("file") && t["file"] == "tokenizer.json" && t.contains("source") &&
                    t["source"].is_string() && t.contains("checksum") && t["checksum"].is_string();
    if (!ok) throw p.bad("\"tokenizer\" must be {\"file\": \"tokenizer.json\", \"source\", \"bytes\", \"checksum\"}");
    out.tokenizer = ManifestTokenizer{"tokenizer.json", t["source"].get<std::string>(),
                                      static_cast<uint64_t>(p.integer(t, "bytes", 0)), t["checksum"].get<std::string>()};
  }
  if (m.contains("hf_config")) {
    const json& t = m["hf_config"];
    const bool ok = t.is_object() && t.contains("file") && t["file"] == kCarriedConfigFile && t.contains("source") &&
                    t["source"].is_string() && t.contains("checksum") && t["checksum"].is_string();
    if (!ok) throw p.bad("\"hf_config\" must be {\"file\": \"hf_config.json\", \"source\", \"bytes\", \"checksum\"}");
    out.hf_config = ManifestTokenizer{kCarriedConfigFile, t["source"].get<std::string>(),
                                      static_cast<uint64_t>(p.integer(t, "bytes", 0)), t["checksum"].get<std::string>()};
  }
  out.files = p.files(m);
  out.tensors = p.tensors(m, out.files, out.version);
  return out;
}

const std::vector<ManifestPiece>* Manifest::find_pieces(const std::string& tensor, const std::string& state) const {
  auto t = tensors.find(tensor);
  if (t == tensors.end()) return nullptr;
  auto s = t->second.states.find(state);
  return s == t->second.states.end() ? nullptr : &s->second;
}

Manifest read_manifest(const fs::path& dir) {
  fs::path p = dir / "manifest.json";
  std::ifstream f(p);
  SHARD_REQUIRE(f.good(), "'{}' is not a checkpoint: it has no manifest.json", dir.string());
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return parse_manifest(text, p.string());
}

}  // namespace shardlab
