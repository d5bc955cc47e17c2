// export.cpp — finding the newest checkpoint of a directory, and `export`: a checkpoint's parameters
// as HF-named safetensors, one tensor in memory at a time (checkpoint_format.hpp).
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
