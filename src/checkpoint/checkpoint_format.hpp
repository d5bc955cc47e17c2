// checkpoint_format.hpp — the on-disk checkpoint format (see checkpoint.hpp): the typed manifest and
// its parser, checked reads of the per-rank files, and the helpers save and load share.
//
// ---- Pieces: which part of which tensor a file holds (format 2) ----------------------------------
// A piece of one state ("param", "adam_m", ...) of a tensor of shape (d0, ..., dk) is
//
//   {"rank": r, "offset": bytes, "slice": [[o0, n0], ..., [ok, nk]], "begin": b, "end": e}
//
// "slice" is a box of the tensor: per dimension, elements [o, o + n) (a tensor-parallel column
// slice of a (R, C) weight is [[0, R], [c0, c1 - c0]]: strided in the tensor's flat order). Within
// the box, in its own row-major order, the piece holds elements [b, e): a flat-parameter shard of
// a slice cuts it anywhere. Those e - b values are f32, contiguous, at byte `offset` of rank r's
// file. Without "slice" the box is the whole tensor, so [b, e) is a range of its flat elements:
// that is every piece of format 1 (shardlab.checkpoint/1, still read) and every piece a data-
// parallel run writes. A piece with a slice needs the tensor's "shape" in the manifest.
//
// A reader asks for a region of the same kind (a box and a flat range within it) and gets it from
// any pieces that cover it, whatever their boxes: resharding across world sizes, strategies and
// tensor-parallel layouts is one function (read_region).
//
// ---- Tensor-parallel parts ----------------------------------------------------------------------
// Under tensor parallelism a rank holds its part of each tensor (TensorDecl::tp, tp_runs). Its file
// holds whole-tensor elements, so the manifest never depends on the layout that wrote it: a split
// tensor's part is one box per block of its split (GPT-2's c_attn: the rank's columns of q, of k,
// of v), its padding (the vocabulary's) left out, and a flat-parameter shard of the part is one
// range of each box (local_regions). Replicated tensors are written by tensor-parallel rank 0
// alone: the group's copies are equal. The shape in the manifest is the whole tensor's.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "src/core/check.hpp"
#include "src/core/dtype.hpp"
#include "src/data/source.hpp"
#include "src/model/hf_dir.hpp"
#include "src/model/spec.hpp"

namespace shardlab {

inline constexpr const char* kCheckpointFormat = "shardlab.checkpoint/2";    // what save writes
inline constexpr const char* kCheckpointFormatV1 = "shardlab.checkpoint/1";  // still read: flat pieces only

// ---- The manifest (manifest.json), as parse_manifest returns it ----------------------------------
// Field names are the JSON keys. Every checkpoint writer so far has written every field; the parser
// still accepts manifests without the informational ones and gives them the defaults below.

// One rank's file.
struct ManifestFile {
  int64_t rank = 0;
  int64_t tp_rank = 0;   // the writer's tensor-parallel rank (informational; 0 when absent)
  std::string file;      // a plain name inside the checkpoint directory: "rank_00003.bin"
  uint64_t bytes = 0;    // its size
  std::string checksum;  // "fnv1a64:<16 hex digits>" of its bytes
};

// One dimension of a box: elements [offset, offset + length).
struct SliceDim {
  int64_t offset = 0, length = 0;
  bool operator==(const SliceDim&) const = default;
};

// A part of a tensor: a box (one SliceDim per dimension; empty = the whole tensor, taken flat) and,
// in the box's row-major order, its elements [begin, end).
struct TensorRegion {
  std::vector<SliceDim> box;
  int64_t begin = 0, end = 0;
};

// Elements [begin, end) of the box `slice` of one state of a tensor (see the top of this file),
// stored as f32 at byte `offset` of rank's file.
struct ManifestPiece {
  int64_t rank = 0;
  uint64_t offset = 0;
  int64_t begin = 0, end = 0;    // begin < end; inside the slice (checked when it has one)
  std::vector<SliceDim> slice;  // empty: the whole tensor (all of format 1's pieces)
  TensorRegion region() const { return {slice, begin, end}; }
};

struct ManifestTensor {
  std::vector<int64_t> shape;  // empty when the manifest gives none
  std::map<std::string, std::vector<ManifestPiece>> states;  // "param", "adam_m", ... -> pieces
};

struct ManifestOptimizer {
  std::string kind;  // adamw | sgd | muon (not checked against the known kinds: load compares it with the run's)
  // The hyperparameters of the run that wrote it (f32 values widened to double); 0 when absent.
  double beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, momentum = 0;
  std::vector<std::string> states;  // state names, "param" first; empty when absent
  // Muon's iteration ("muon": {"ns_steps", "ns_dtype", "adjust_lr"}); 0 and "" when absent.
  int64_t muon_ns_steps = 0;
  std::string muon_ns_dtype, muon_adjust_lr;
};

// The learning-rate schedule and gradient clip of the run that wrote it (manifest key "schedule"):
// a resume under other values would change the learning rate from the next step on, so load
// compares them with the optimizer's hyper-parameters.
struct ManifestSchedule {
  std::string kind;  // constant | cosine
  double lr = 0, min_lr_frac = 0, grad_clip = 0;  // f32 values widened to double
  int64_t warmup_steps = 0, decay_steps = 0;      // decay_steps: the cosine's horizon (total_steps)
};

// What a run's batches are made of: with the step, the sequences each step takes. Resuming with
// another source, batch, sequence length or validation split would continue at the right step on
// other sequences, so load compares them (manifest key "data").
struct DataRecord {
  DataSource train;
  int64_t batch = 0, seq = 0;         // global batch in sequences, sequence length
  std::optional<DataSource> val_data;  // --val-data
  double val_fraction = 0;             // --val-fraction (0 = none): the training stream is cut before it
};

// The tokenizer the run read its text with, as the checkpoint carries it: a Hugging Face
// tokenizer.json beside the rank files (manifest key "tokenizer"), which export and sample use.
struct ManifestTokenizer {
  std::string file;      // "tokenizer.json"
  std::string source;    // what the run read: its --tokenizer file, or "bytes" (a text file's bytes as tokens)
  uint64_t bytes = 0;
  std::string checksum;  // "fnv1a64:<16 hex digits>"
};

struct Manifest {
  int version = 2;       // of the format it was written in: 1 (flat pieces only) or 2
  ModelSpec model;       // validated (ModelSpec::validate)
  std::string strategy;  // as written: "zero3", ...
  int64_t world = 1;     // ranks of the run that wrote it
  int64_t tp = 1;        // its tensor-parallel degree ("mesh": informational, any layout loads it); 1 when absent
  DType param_dtype = DType::f32, reduce_dtype = DType::f32;  // f32 when absent
  ManifestOptimizer optimizer;
  int64_t step = 0;           // steps done
  int64_t data_position = 0;  // the step whose batch comes next; = step when absent
  uint64_t seed = 0;          // 0 when absent
  std::string run_id;         // the run that wrote it (its checkpoints share it); "" when absent
  bool shuffle = false;       // batches drawn from per-epoch permutations of (seed, epoch); false when absent
  std::optional<double> val_loss;  // the validation loss computed at this step, when there was one
  std::optional<DataRecord> data;  // absent in manifests written before it was recorded
  std::optional<ManifestSchedule> schedule;  // absent in manifests written before it was recorded
  std::optional<ManifestTokenizer> tokenizer;  // absent: the run read no text (or predates it)
  // The model's original config.json (manifest key "hf_config", the same record: file
  // kCarriedConfigFile); absent: not from an HF directory (or predates it).
  std::optional<ManifestTokenizer> hf_config;
  std::vector<ManifestFile> files;
  std::map<std::string, ManifestTensor> tensors;  // by HF name; every piece's rank is in `files`

  // The pieces of `state` of `tensor`, or nullptr when the manifest has none.
  const std::vector<ManifestPiece>* find_pieces(const std::string& tensor, const std::string& state) const;
};

// Parses and validates a manifest's structure (types, ranges, file names, a sane model spec);
// throws InputError naming `origin`. Nothing is allocated from the sizes it claims.
Manifest parse_manifest(const std::string& text, const std::string& origin);
Manifest read_manifest(const std::filesystem::path& dir);  // dir/manifest.json, parsed and validated

// The data record's JSON object, as the manifest holds it under "data".
nlohmann::json data_record_to_json(const DataRecord& d);

// The piece's JSON object, as the manifest holds it ("slice" only when it has one).
nlohmann::json piece_to_json(const ManifestPiece& p);

// Reads region `want` of one state of a tensor of shape `shape` from its pieces into
// dst[0, want.end - want.begin), in the order of want's box (nothing is read when dst is null).
// `shape` may be empty when neither `want` nor any piece has a box. Pieces may overlap (replicas
// of a range, as older DDP checkpoints hold): each element is read once, from the first piece
// that covers it in order of where the pieces start in the tensor. Returns how many of the wanted
// elements the pieces cover (want.end - want.begin when all are).
class CheckpointFiles;
int64_t read_region(CheckpointFiles& files, const std::vector<ManifestPiece>& pieces, const std::vector<int64_t>& shape,
                    const TensorRegion& want, float* dst, const std::string& tensor);

// ---- A unit's state in rank files (save and load; see "Tensor-parallel parts" above) ------------

// The regions of the whole tensor that local elements [lo, hi) of t hold (t as tensor-parallel rank
// tp_rank of tp_degree holds it), each with the local runs [from, to) its elements come from, in
// the region's order. One flat region when t is not split here; none for padding alone.
struct LocalRegion {
  TensorRegion region;
  std::vector<std::pair<int64_t, int64_t>> local;
};
std::vector<LocalRegion> local_regions(const TensorDecl& t, int tp_degree, int tp_rank, int64_t lo, int64_t hi);

// One state of local elements [a, b) of a unit (`values`: those b - a values) as a rank's file
// holds it: the values appended to `out` in the pieces' order, each piece (rank `file_rank`, byte
// offsets from `base`: the file's size before `out`) added to pieces[tensor][state] as JSON.
void append_unit_state(const UnitLayout& unit, int64_t a, int64_t b, std::span<const float> values, int64_t file_rank,
                       const std::string& state, uint64_t base, std::vector<float>& out, nlohmann::json& pieces);

// The inverse, under any layout: dst[0, b - a) <- one state of local elements [a, b) of a unit,
// each element read as its whole-tensor element from whichever pieces hold it (tp_runs of the
// unit's layout, run by run); padding reads as 0 and elements past the tensors are left alone.
// InputError naming the tensor when its pieces are missing, of another shape, or leave a gap.
void read_unit_state(const Manifest& m, CheckpointFiles& files, const UnitLayout& unit, int64_t a, int64_t b,
                     const std::string& state, std::span<float> dst, const std::string& path);

// The checkpoint's tokenizer.json, checked against the manifest's size and checksum; "" when the
// manifest records none. InputError naming the file when it is missing or differs.
std::string read_checkpoint_tokenizer(const std::filesystem::path& dir, const Manifest& m);
// The same for the carried config.json (hf_config.json); "" when the manifest records none.
inline constexpr const char* kCarriedConfigFile = "hf_config.json";
std::string read_checkpoint_hf_config(const std::filesystem::path& dir, const Manifest& m);

// The newest complete checkpoint (a step_* directory with a manifest) under dir, or "".
std::string latest_checkpoint(const std::string& dir);
// Writes the consolidated parameters, one tensor in memory at a time: to OUT.safetensors, or as an
// HF model directory OUT (config.json, shards past max_shard_size bytes; hf_dir.hpp). A directory
// holding a model no export wrote is refused unless `overwrite`. Returns what config.json kept of
// the model's original one and what changed (HfModelWriter::config_note), "" when none is carried.
std::string export_checkpoint(const std::string& path, const std::string& out, DType dtype = DType::f32,
                              uint64_t max_shard_size = kHfMaxShardSize, bool overwrite = false);

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
