// hf_dir.hpp — Hugging Face model directories: how models come in (--init) and go out (export,
// train --save), for every family.
//
// A directory holds config.json, whose "model_type" picks the family and whose fields give the
// spec (ModelFamily::spec_from_hf_config), beside the weights: one model.safetensors, or shards
// named by model.safetensors.index.json ({"metadata": {...}, "weight_map": {tensor: file}}), as
// transformers' save_pretrained writes them. A path ending in ".safetensors" is one weights file
// instead (no config: the shape comes from the command line), as before directories existed.
//
// Both directions stream, so a model larger than memory passes through holding one tensor: the
// reader opens a shard when a tensor in it is first asked for and reads one tensor at a time; the
// writer has one shard file open and takes the tensors one at a time.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/model/safetensors.hpp"
#include "src/model/spec.hpp"

namespace shardlab {

inline constexpr const char* kHfConfigFile = "config.json";
inline constexpr const char* kHfWeightsFile = "model.safetensors";
inline constexpr const char* kHfIndexFile = "model.safetensors.index.json";
inline constexpr uint64_t kHfMaxShardSize = 5'000'000'000;  // save_pretrained's default, "5GB"

// A path names one weights file when it ends in ".safetensors"; otherwise an HF model directory.
bool is_safetensors_path(std::string_view path);
// What HfModelWriter checks of a directory before it writes, for a caller that checks before a
// long run (train --save DIR): InputError naming the directory or what it should not hold, or
// (unless `overwrite`) a model that no shardlab export wrote there (its weights lack the
// kExportedBy mark).
void check_hf_export_dir(const std::string& dir, bool overwrite = false);
// InputError (unless `overwrite`) when `file` exists and holds weights no shardlab export wrote (no
// kExportedBy mark): a .safetensors output never replaces a model from elsewhere unasked.
void check_safetensors_out(const std::string& file, bool overwrite = false);
inline constexpr const char* kExportedBy = "exported_by";  // safetensors metadata: "shardlab" on an export's
// An existing directory: --init reads it as an HF model directory.
bool is_hf_model_dir(const std::string& path);

// DIR/config.json read into a spec: "model_type" picks the family (InputError naming the known
// ones), whose spec_from_hf_config reads the rest. The spec is named after the directory.
// InputError naming the file for one that is missing or not JSON, and for every bad field.
ModelSpec read_hf_config(const std::string& dir);
// What DIR/config.json sets that changes what a model computes in training but that shardlab does not
// apply (dropout: GPT-2's attn_pdrop 0.1, as transformers writes it), for the run's header; "" when
// nothing, or when DIR is not a directory.
std::string hf_config_unapplied(const std::string& dir);

// The weights of an --init source, a .safetensors file or an HF model directory, read by name.
class HfWeights {
 public:
  explicit HfWeights(const std::string& path);  // InputError naming what is missing or malformed
  // Where names are looked up, for messages: the .safetensors file, or the index.
  const std::string& where() const { return where_; }
  bool has(const std::string& name) const;
  std::vector<std::string> names() const;  // every tensor's, sorted (a file's of any dtype)
  const SafetensorsEntry& entry(const std::string& name);  // dtype and shape; InputError if absent
  // A tensor converted to f32 (from f32, bf16 or f16); its shape checked against `expect_shape`
  // when given. InputError naming the file and the tensor otherwise.
  void read_f32(const std::string& name, std::span<float> out, const std::vector<int64_t>* expect_shape = nullptr);

 private:
  SafetensorsReader& reader(const std::string& file);

  std::string dir_, where_;
  std::string single_;                              // the one weights file, when not sharded
  std::map<std::string, std::string> weight_map_;   // tensor -> shard file, when sharded
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers_;  // by file, opened on first use
};

struct HfWriteOptions {
  DType dtype = DType::f32;                   // every tensor's stored dtype
  uint64_t max_shard_size = kHfMaxShardSize;  // a directory: bytes of tensors per shard file
  std::map<std::string, std::string> metadata;  // each file's __metadata__ ("format": "pt" added)
  // A directory only: companion files written whole before config.json (tokenizer.json,
  // tokenizer_config.json, generation_config.json), and integer fields added to config.json
  // (bos_token_id, eos_token_id).
  std::map<std::string, std::string> companions;
  std::map<std::string, int64_t> config_ids;
  bool overwrite = false;  // replace a model no export wrote there (check_hf_export_dir)
  // A directory only: the config.json the model came with (its --init directory's, carried by
  // checkpoints), written back with every field this model sets that differs from it replaced
  // (each change listed by config_note) and every other field kept; "" writes the family's alone.
  // A field the weights do not fix keeps the original's: the position limit of a model without
  // learned positions (max_position_embeddings stays 131072 after a run at --seq 1024).
  std::string base_config, base_config_source;
};

struct HfTensorDecl {
  std::string name;  // the HF name (ModelFamily::hf_name)
  std::vector<int64_t> shape;
};

// Writes a model's tensors, in the order declared, one at a time: to a .safetensors file, or into
// an HF model directory (created if needed) with config.json from the family's hf_config. A
// directory's tensors are split into shards in order, a new shard starting where the next tensor
// would take the current one past max_shard_size (a tensor larger than that alone in its shard);
// one shard is model.safetensors, more are model-0000i-of-0000N.safetensors with the index.
//
// An existing directory may hold only an earlier export's files, which are replaced (stale shards
// removed, config.json written last, so a directory with a config.json is complete), and the
// companions of an HF model directory that export does not write (tokenizer files,
// generation_config.json, README.md), which are kept; anything else is refused, naming it, before
// a file is touched: a mistyped --out never overwrites a project's config.json.
class HfModelWriter {
 public:
  HfModelWriter(const std::string& out, const ModelSpec& spec, std::vector<HfTensorDecl> tensors, HfWriteOptions opts);
  void write_next(std::span<const float> values);  // the next tensor's values
  void finish();
  // The files written (or to be written), relative to the directory (the file itself otherwise).
  std::vector<std::string> files() const;
  // After finish, with a base_config: "config.json: SOURCE's, changed: key a -> b, ..." (or "as it
  // was"); "" without one.
  const std::string& config_note() const { return config_note_; }

 private:
  struct Shard {
    std::string file;
    size_t first = 0, end = 0;  // tensors [first, end)
  };
  void open_shard(size_t s);
  nlohmann::json with_dtype(nlohmann::json config) const;  // the stored dtype's field set
  nlohmann::json over_base_config();                       // the family's config laid over base_config

  std::string out_;
  bool dir_ = false;
  ModelSpec spec_;
  std::vector<HfTensorDecl> tensors_;
  HfWriteOptions opts_;
  std::vector<Shard> shards_;
  size_t next_ = 0, shard_ = 0;
  std::unique_ptr<SafetensorsStreamWriter> writer_;
  std::string config_note_;
};

}  // namespace shardlab
