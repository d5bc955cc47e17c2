// pieces.cpp — pieces of tensors in the per-rank files: checked reads of regions, and a unit's
// state written to and read from rank files under any tensor-parallel layout (checkpoint_format.hpp).
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

// ---- Checked reads of the per-rank files ----------------------------------------------------------

json data_record_to_json(const DataRecord& d) {
  auto source = [](const DataSource& s) {
    json j = {{"path", s.path}, {"bytes", s.bytes}, {"hash", s.hash}};
    for (const DataFile& f : s.files) j["files"].push_back({{"path", f.path}, {"bytes", f.bytes}, {"hash", f.hash}});
    return j;
  };
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
    // A tensor the tensor-parallel (or expert-parallel) group holds whole: its rank 0 writes it.
    if (lo >= hi || t.tied_copy || (unit.tp_degree > 1 && !t.tp.split() && unit.tp_rank != 0) ||
        (unit.ep.degree > 1 && !t.expert && unit.ep.rank != 0))
      continue;
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
  std::string got = fnv1a64_text(h);
  SHARD_REQUIRE(got == e.checksum, "'{}' is corrupt: checksum {} but the manifest says {}", p.string(), got, e.checksum);
  verified_.insert({e.rank, true});
}

}  // namespace shardlab
