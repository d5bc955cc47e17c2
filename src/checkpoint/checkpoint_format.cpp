// checkpoint_format.cpp — the parts of the checkpoint format that need no training runtime: the
// manifest parser, the checked file reader, finding the newest checkpoint, and export. Kept apart so
// the fuzz targets (tests/fuzz) build with clang from a handful of sources.
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
    return {string(o, "path"), static_cast<uint64_t>(integer(o, "bytes", 0)), string(o, "hash")};
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
  if (m.contains("shuffle")) {
    if (!m["shuffle"].is_boolean()) throw p.bad("\"shuffle\" must be true or false");
    out.shuffle = m["shuffle"].get<bool>();
  }
  if (m.contains("val_loss")) {
    if (!m["val_loss"].is_number()) throw p.bad("\"val_loss\" must be a number");
    out.val_loss = m["val_loss"].get<double>();
  }
  if (m.contains("data")) out.data = p.data(m);
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

// ---- Checked reads of the per-rank files ----------------------------------------------------------

json data_record_to_json(const DataRecord& d) {
  auto source = [](const DataSource& s) { return json{{"path", s.path}, {"bytes", s.bytes}, {"hash", s.hash}}; };
  json j = {{"train", source(d.train)}, {"batch", d.batch}, {"seq", d.seq}};
  if (d.val_data) j["val_data"] = source(*d.val_data);
  if (d.val_fraction != 0) j["val_fraction"] = d.val_fraction;
  return j;
}

json piece_to_json(const ManifestPiece& p) {
  json j = {{"rank", p.rank}, {"offset", p.offset}, {"begin", p.begin}, {"end", p.end}};
  if (!p.slice.empty()) {
    j["slice"] = json::array();
    for (const SliceDim& d : p.slice) j["slice"].push_back({d.offset, d.length});
  }
  return j;
}

namespace {

// A stretch of a region that is contiguous in the tensor's flat order: `length` elements from flat
// element `start`, which are the region's elements from `index` on (0 = the region's `begin`).
struct Run {
  int64_t start, length, index;
};

// Calls f(Run) for the runs of region r of a tensor of shape `shape`, in order (increasing starts).
// Trailing dimensions the box covers whole merge into its rows, so a box that is the whole tensor
// is one run, and a column slice of a (R, C) matrix one run per row.
template <class F>
void for_each_run(const std::vector<int64_t>& shape, const TensorRegion& r, F f) {
  if (r.box.empty()) return f(Run{r.begin, r.end - r.begin, 0});
  SHARD_CHECK(r.box.size() == shape.size(), "a region of {} dimensions of a tensor of {}", r.box.size(), shape.size());
  size_t k = shape.size() - 1;  // the box's rows: dimensions k.. of it, contiguous in the tensor
  int64_t inner = 1;            // elements of the tensor per step of dimension k
  while (k > 0 && r.box[k].offset == 0 && r.box[k].length == shape[k]) inner *= shape[k--];
  const int64_t row = r.box[k].length * inner;
  std::vector<int64_t> stride(k, 0);  // of the outer dimensions 0..k-1, in tensor elements
  int64_t s = inner * shape[k];
  for (size_t d = k; d-- > 0; s *= shape[d]) stride[d] = s;
  for (int64_t q = r.begin / row; q * row < r.end; ++q) {
    int64_t start = r.box[k].offset * inner, rest = q;  // q's position over the outer dimensions
    for (size_t d = k; d-- > 0;) {
      start += (r.box[d].offset + rest % r.box[d].length) * stride[d];
      rest /= r.box[d].length;
    }
    const int64_t lo = std::max(r.begin, q * row), hi = std::min(r.end, (q + 1) * row);
    f(Run{start + (lo - q * row), hi - lo, lo - r.begin});
  }
}

// A run of a piece: where its values lie in the file.
struct PieceRun {
  int64_t start, end;  // flat elements of the tensor
  int64_t rank;
  uint64_t offset;  // byte offset of element `start`
};

// Reads wanted runs, given in increasing order of their starts, from the runs of a tensor's pieces.
// One sweep: `next` only grows, so runs of pieces that end at or before it can serve nothing later.
class PieceSweep {
 public:
  PieceSweep(CheckpointFiles& files, const std::vector<ManifestPiece>& pieces, const std::vector<int64_t>& shape,
             const std::string& tensor)
      : files_(files), tensor_(tensor) {
    for (const ManifestPiece& p : pieces)
      for_each_run(shape, p.region(), [&](Run r) {
        runs_.push_back({r.start, r.start + r.length, p.rank, p.offset + static_cast<uint64_t>(r.index) * sizeof(float)});
      });
    std::stable_sort(runs_.begin(), runs_.end(), [](const PieceRun& x, const PieceRun& y) { return x.start < y.start; });
  }
  // Reads run w into dst[w.index, w.index + w.length) (nothing when dst is null), what the pieces cover of it.
  void take(Run w, float* dst) {
    SHARD_CHECK(w.start >= last_, "'{}': wanted runs out of order ({} after {})", tensor_, w.start, last_);
    const int64_t end = last_ = w.start + w.length;
    for (int64_t next = w.start; next < end;) {
      while (i_ < runs_.size() && runs_[i_].end <= next) ++i_;
      if (i_ == runs_.size() || runs_[i_].start > next) {  // a gap: nothing covers `next`
        next = i_ == runs_.size() ? end : std::min(end, runs_[i_].start);
        continue;
      }
      const PieceRun& p = runs_[i_];
      const int64_t x1 = std::min(end, p.end);
      if (dst)
        files_.read(p.rank, p.offset + static_cast<uint64_t>(next - p.start) * sizeof(float),
                    dst + w.index + (next - w.start), static_cast<size_t>(x1 - next), tensor_);
      covered_ += x1 - next;
      next = x1;
    }
  }
  int64_t covered() const { return covered_; }

 private:
  CheckpointFiles& files_;
  const std::string& tensor_;
  std::vector<PieceRun> runs_;
  size_t i_ = 0;
  int64_t last_ = 0, covered_ = 0;
};

}  // namespace

int64_t read_region(CheckpointFiles& files, const std::vector<ManifestPiece>& pieces, const std::vector<int64_t>& shape,
                    const TensorRegion& want, float* dst, const std::string& tensor) {
  PieceSweep sweep(files, pieces, shape, tensor);
  for_each_run(shape, want, [&](Run w) { sweep.take(w, dst); });
  return sweep.covered();
}

// ---- A unit's state in rank files ---------------------------------------------------------------

std::vector<LocalRegion> local_regions(const TensorDecl& t, int tp_degree, int tp_rank, int64_t lo, int64_t hi) {
  SHARD_CHECK(0 <= lo && lo <= hi && hi <= t.numel, "'{}': local elements [{}, {}) of {}", t.name, lo, hi, t.numel);
  if (lo == hi) return {};
  if (!t.tp.split() || tp_degree == 1) {  // the whole tensor here: one flat range of it
    std::vector<LocalRegion> flat(1);
    flat[0].region.begin = lo;
    flat[0].region.end = hi;
    flat[0].local.push_back({lo, hi});
    return flat;
  }
  // The local tensor is (outer, parts * chunk, inner) with rank tp_rank's chunk of every block of
  // dimension d; the first `valid` of a chunk's rows are real (the rest pad a block that the degree
  // does not divide). Block b's real elements are a box of the whole tensor in the same order.
  const size_t d = static_cast<size_t>(t.tp.dim);
  int64_t inner = 1;
  for (size_t i = d + 1; i < t.full_shape.size(); ++i) inner *= t.full_shape[i];
  const int64_t block = t.full_shape[d] / t.tp.parts, chunk = t.shape[d] / t.tp.parts;
  const int64_t valid = std::clamp<int64_t>(block - tp_rank * chunk, 0, chunk);
  const int64_t row = t.shape[d] * inner, span = valid * inner;  // a local row of dimension d and below; its real part per block
  std::vector<LocalRegion> out;
  for (int64_t b = 0; b < t.tp.parts && span > 0; ++b) {
    const int64_t first = b * chunk * inner;  // block b's offset in a local row
    // Box elements of block b before local element x (x's row o, then within it).
    auto before = [&](int64_t x) { return x / row * span + std::clamp<int64_t>(x % row - first, 0, span); };
    LocalRegion r;
    r.region.begin = before(lo);
    r.region.end = before(hi);
    if (r.region.begin == r.region.end) continue;
    for (size_t i = 0; i < t.full_shape.size(); ++i) r.region.box.push_back({0, t.full_shape[i]});
    r.region.box[d] = {b * block + tp_rank * chunk, valid};
    for (int64_t o = lo / row; o * row < hi; ++o) {
      const int64_t from = std::max(lo, o * row + first), to = std::min(hi, o * row + first + span);
      if (from < to) r.local.push_back({from, to});
    }
    out.push_back(std::move(r));
  }
  return out;
}

void append_unit_state(const UnitLayout& unit, int64_t a, int64_t b, std::span<const float> values, int64_t file_rank,
                       const std::string& state, uint64_t base, std::vector<float>& out, json& pieces) {
  SHARD_CHECK(static_cast<int64_t>(values.size()) == b - a, "unit {}: {} values for elements [{}, {})", unit.name,
              values.size(), a, b);
  for (const TensorDecl& t : unit.tensors) {
    const int64_t lo = std::max(a, t.offset), hi = std::min(b, t.offset + t.numel);
    // A tied copy (pipeline parallelism) is its owner's tensor: the owner's stage writes it.
    if (lo >= hi || t.tied_copy || (unit.tp_degree > 1 && !t.tp.split() && unit.tp_rank != 0)) continue;
    for (const LocalRegion& r : local_regions(t, unit.tp_degree, unit.tp_rank, lo - t.offset, hi - t.offset)) {
      const ManifestPiece piece{file_rank, base + out.size() * sizeof(float), r.region.begin, r.region.end, r.region.box};
      for (auto [from, to] : r.local)
        out.insert(out.end(), values.begin() + (t.offset + from - a), values.begin() + (t.offset + to - a));
      pieces[t.name][state].push_back(piece_to_json(piece));
    }
  }
}

void read_unit_state(const Manifest& m, CheckpointFiles& files, const UnitLayout& unit, int64_t a, int64_t b,
                     const std::string& state, std::span<float> dst, const std::string& path) {
  SHARD_CHECK(static_cast<int64_t>(dst.size()) == b - a, "unit {}: {} values for elements [{}, {})", unit.name, dst.size(),
              a, b);
  for (const TensorDecl& t : unit.tensors) {
    const int64_t lo = std::max(a, t.offset) - t.offset, hi = std::min(b, t.offset + t.numel) - t.offset;
    if (lo >= hi) continue;
    const std::vector<ManifestPiece>* pieces = m.find_pieces(t.name, state);
    SHARD_REQUIRE(pieces, "checkpoint '{}' has no {} for tensor '{}'", path, state, t.name);
    const std::vector<int64_t>& shape = m.tensors.at(t.name).shape;
    SHARD_REQUIRE(shape == t.full_shape, "checkpoint '{}': tensor '{}' has shape {}, the model expects {}", path, t.name,
                  json(shape).dump(), json(t.full_shape).dump());
    // Local runs -> whole-tensor runs (tp_runs: increasing in both), clipped to [lo, hi).
    float* out = dst.data() + (t.offset + lo - a);
    PieceSweep sweep(files, *pieces, shape, t.name);
    int64_t needed = 0;
    for (const TpRun& r : tp_runs(t, unit.tp_degree, unit.tp_rank)) {
      const int64_t from = std::max(lo, r.local), to = std::min(hi, r.local + r.len);
      if (from >= to) continue;
      if (r.full < 0) {
        std::fill(out + (from - lo), out + (to - lo), 0.f);
        continue;
      }
      sweep.take(Run{r.full + (from - r.local), to - from, from - lo}, out);
      needed += to - from;
    }
    SHARD_REQUIRE(sweep.covered() == needed,
                  "checkpoint '{}' covers {} of the {} elements of {} '{}' this rank needs (its elements [{}, {}) as "
                  "tensor-parallel rank {} of {} holds it)", path, sweep.covered(), needed, state, t.name, lo, hi,
                  unit.tp_rank, unit.tp_degree);
  }
}

CheckpointFiles::CheckpointFiles(fs::path dir, const std::vector<ManifestFile>& files) : dir_(std::move(dir)) {
  for (const ManifestFile& f : files) by_rank_[f.rank] = f;
}

void CheckpointFiles::check_range(int64_t r, uint64_t off, uint64_t n, const std::string& tensor) {
  const ManifestFile& e = entry(r, tensor);
  fs::path p = dir_ / e.file;
  verify(e, p);
  SHARD_REQUIRE(off <= e.bytes && n <= (e.bytes - off) / sizeof(float),
                "'{}': tensor '{}' needs bytes [{}, {}) of a {}-byte file", p.string(), tensor, off,
                off + n * sizeof(float), e.bytes);
}

void CheckpointFiles::read(int64_t r, uint64_t off, float* out, size_t n, const std::string& tensor) {
  check_range(r, off, n, tensor);
  fs::path p = dir_ / entry(r, tensor).file;
  std::ifstream f(p, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(off));
  f.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(n * sizeof(float)));
  SHARD_REQUIRE(f.good(), "'{}' is truncated: tensor '{}' needs bytes [{}, {})", p.string(), tensor, off,
                off + n * sizeof(float));
}

const ManifestFile& CheckpointFiles::entry(int64_t r, const std::string& tensor) const {
  auto it = by_rank_.find(r);
  SHARD_REQUIRE(it != by_rank_.end(), "manifest names rank {}'s file for tensor '{}' but does not list it", r, tensor);
  return it->second;
}

void CheckpointFiles::verify(const ManifestFile& e, const fs::path& p) {
  if (verified_.count(e.rank)) return;
  std::error_code ec;
  uint64_t size = fs::file_size(p, ec);
  SHARD_REQUIRE(!ec, "checkpoint file '{}' is missing: {}", p.string(), ec.message());
  SHARD_REQUIRE(size == e.bytes, "'{}' is truncated or corrupt: {} bytes, the manifest says {}", p.string(), size, e.bytes);
  std::ifstream f(p, std::ios::binary);
  std::vector<char> buf(1 << 20);
  uint64_t h = kFnv1a64Basis;
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h = fnv1a64(std::string_view(buf.data(), static_cast<size_t>(f.gcount())), h);
  }
  std::string got = fmt::format("fnv1a64:{:016x}", h);
  SHARD_REQUIRE(got == e.checksum, "'{}' is corrupt: checksum {} but the manifest says {}", p.string(), got, e.checksum);
  verified_.insert({e.rank, true});
}

// ---- Finding and exporting checkpoints ------------------------------------------------------------

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

namespace {

// The parameters of tensor t, whole, from the manifest's "param" pieces. Every piece is checked
// (range inside the tensor, bytes inside a verified file, full coverage) before anything is allocated.
std::vector<float> read_param(const Manifest& m, CheckpointFiles& files, const TensorDecl& t, const std::string& path) {
  const std::vector<ManifestPiece>* pieces = m.find_pieces(t.name, "param");
  SHARD_REQUIRE(pieces, "checkpoint '{}' has no parameters for tensor '{}'", path, t.name);
  const std::vector<int64_t>& shape = m.tensors.at(t.name).shape;
  for (const ManifestPiece& p : *pieces) {
    if (p.slice.empty())
      SHARD_REQUIRE(p.begin >= 0 && p.end <= t.numel && p.begin < p.end, "checkpoint '{}': bad range [{}, {}) for '{}'",
                    path, p.begin, p.end, t.name);
    else  // the parser checked the slice against this shape
      SHARD_REQUIRE(shape == t.shape, "checkpoint '{}': tensor '{}' has shape {}, the model expects {}", path, t.name,
                    json(shape).dump(), json(t.shape).dump());
    files.check_range(p.rank, p.offset, static_cast<uint64_t>(p.end - p.begin), t.name);
  }
  const TensorRegion whole{{}, 0, t.numel};
  const int64_t covered = read_region(files, *pieces, shape, whole, nullptr, t.name);
  SHARD_REQUIRE(covered == t.numel, "checkpoint '{}' covers {} of the {} elements of '{}'", path, covered, t.numel, t.name);
  std::vector<float> v(static_cast<size_t>(t.numel));
  read_region(files, *pieces, shape, whole, v.data(), t.name);
  return v;
}

}  // namespace

void export_checkpoint(const std::string& path, const std::string& out, DType dtype, uint64_t max_shard_size) {
  const fs::path dir(path);
  const Manifest m = read_manifest(dir);
  CheckpointFiles files(dir, m.files);
  std::vector<HfTensorDecl> tensors;
  std::vector<const TensorDecl*> decls;
  const ModelFamily& family = family_of(m.model);
  const auto layout = family.layout(m.model);
  for (const auto& u : layout)
    for (const TensorDecl& t : u.tensors) {
      tensors.push_back({family.hf_name(t), t.shape});
      decls.push_back(&t);
    }
  HfWriteOptions opts;
  opts.dtype = dtype;
  opts.max_shard_size = max_shard_size;
  opts.metadata = {{"model", m.model.describe()}, {"step", std::to_string(m.step)}};
  HfModelWriter w(out, m.model, std::move(tensors), std::move(opts));
  for (const TensorDecl* t : decls) w.write_next(read_param(m, files, *t, path));  // one tensor in memory at a time
  w.finish();
}

}  // namespace shardlab
