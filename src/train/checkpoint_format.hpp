// checkpoint_format.hpp — the on-disk checkpoint format (see checkpoint.hpp): the typed manifest and
// its parser, checked reads of the per-rank files, and the helpers save and load share.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "src/core/check.hpp"
#include "src/core/dtype.hpp"
#include "src/model/spec.hpp"

namespace shardlab {

inline constexpr const char* kCheckpointFormat = "shardlab.checkpoint/1";

// ---- The manifest (manifest.json), as parse_manifest returns it ----------------------------------
// Field names are the JSON keys. Every checkpoint writer so far has written every field; the parser
// still accepts manifests without the informational ones and gives them the defaults below.

// One rank's file.
struct ManifestFile {
  int64_t rank = 0;
  std::string file;      // a plain name inside the checkpoint directory: "rank_00003.bin"
  uint64_t bytes = 0;    // its size
  std::string checksum;  // "fnv1a64:<16 hex digits>" of its bytes
};

// Elements [begin, end) of one state of a tensor, stored as f32 at byte `offset` of rank's file.
struct ManifestPiece {
  int64_t rank = 0;
  uint64_t offset = 0;
  int64_t begin = 0, end = 0;  // begin < end; not yet checked against the tensor's size
};

struct ManifestTensor {
  std::vector<int64_t> shape;  // empty when the manifest gives none
  std::map<std::string, std::vector<ManifestPiece>> states;  // "param", "adam_m", ... -> pieces
};

struct ManifestOptimizer {
  std::string kind;  // adamw | sgd (not checked against the known kinds: load compares it with the run's)
  // The hyperparameters of the run that wrote it (f32 values widened to double); 0 when absent.
  double beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, momentum = 0;
  std::vector<std::string> states;  // state names, "param" first; empty when absent
};

struct Manifest {
  ModelSpec model;       // validated (ModelSpec::validate)
  std::string strategy;  // as written: "zero3", ...
  int64_t world = 1;     // ranks of the run that wrote it
  DType param_dtype = DType::f32, reduce_dtype = DType::f32;  // f32 when absent
  ManifestOptimizer optimizer;
  int64_t step = 0;           // steps done
  int64_t data_position = 0;  // the step whose batch comes next; = step when absent
  uint64_t seed = 0;          // 0 when absent
  bool shuffle = false;       // batches drawn from per-epoch permutations of (seed, epoch); false when absent
  std::optional<double> val_loss;  // the validation loss computed at this step, when there was one
  std::vector<ManifestFile> files;
  std::map<std::string, ManifestTensor> tensors;  // by HF name; every piece's rank is in `files`

  // The pieces of `state` of `tensor`, or nullptr when the manifest has none.
  const std::vector<ManifestPiece>* find_pieces(const std::string& tensor, const std::string& state) const;
};

// Parses and validates a manifest's structure (types, ranges, file names, a sane model spec);
// throws InputError naming `origin`. Nothing is allocated from the sizes it claims.
Manifest parse_manifest(const std::string& text, const std::string& origin);
Manifest read_manifest(const std::filesystem::path& dir);  // dir/manifest.json, parsed and validated

// Reads elements [lo, hi) of one state of a tensor from its pieces into dst[0, hi - lo) (nothing is
// read when dst is null). Pieces may overlap (replicas of a range, as older DDP checkpoints hold):
// each element is read once, from the first piece that covers it, in order of the pieces' starts.
// Returns how many elements from lo on are covered without a gap (hi - lo when all are).
class CheckpointFiles;
int64_t read_pieces(CheckpointFiles& files, const std::vector<ManifestPiece>& pieces, int64_t lo, int64_t hi, float* dst,
                    const std::string& tensor);

// The newest complete checkpoint (a step_* directory with a manifest) under dir, or "".
std::string latest_checkpoint(const std::string& dir);
// Writes a consolidated HF-named safetensors file, one tensor in memory at a time.
void export_checkpoint(const std::string& path, const std::string& out, DType dtype = DType::f32);

namespace fs = std::filesystem;

// The files of a checkpoint, checked once each against the manifest's size and checksum.
class CheckpointFiles {
 public:
  CheckpointFiles(fs::path dir, const std::vector<ManifestFile>& files);
  // Checks that n floats at byte offset `off` lie inside rank r's (verified) file.
  void check_range(int64_t r, uint64_t off, uint64_t n, const std::string& tensor);
  // Reads n floats at byte offset `off` of rank r's file.
  void read(int64_t r, uint64_t off, float* out, size_t n, const std::string& tensor);

 private:
  const ManifestFile& entry(int64_t r, const std::string& tensor) const;
  void verify(const ManifestFile& e, const fs::path& p);

  fs::path dir_;
  std::map<int64_t, ManifestFile> by_rank_;  // a rank listed twice: the last entry counts
  std::map<int64_t, bool> verified_;
};

}  // namespace shardlab
