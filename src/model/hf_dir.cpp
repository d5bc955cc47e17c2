#include "src/model/hf_dir.hpp"

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <optional>
#include <set>

#include <fmt/ranges.h>

#include "src/core/check.hpp"
#include "src/core/suggest.hpp"
#include "src/model/family.hpp"

namespace shardlab {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_json_file(const fs::path& p, const char* what) {
  std::ifstream f(p);
  SHARD_REQUIRE(f.good(), "'{}' is missing: {}", p.string(), what);
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw InputError(fmt::format("'{}' is not valid JSON ({})", p.string(), e.what()));
  }
}

// Through a temporary and a rename, as the safetensors writer does: never half a file.
void write_text_file(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp";
  {
    errno = 0;
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    f.flush();
    if (!f.good()) {
      const int err = errno;
      f.close();
      std::error_code ec;
      fs::remove(tmp, ec);  // no temporary left behind
      throw InputError(fmt::format("writing '{}' failed: {}", tmp.string(), err ? std::strerror(err) : "an I/O error"));
    }
  }
  std::error_code ec;
  fs::rename(tmp, p, ec);
  SHARD_REQUIRE(!ec, "cannot rename '{}' to '{}': {}", tmp.string(), p.string(), ec.message());
}

void write_json_file(const fs::path& p, const json& j) { write_text_file(p, j.dump(2) + "\n"); }

// The directory's own name ("gpt2" for ~/models/gpt2/), which names the spec.
std::string dir_name(const std::string& dir) {
  fs::path p = fs::absolute(fs::path(dir)).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().empty() ? "hf-model" : p.filename().string();
}

const char* hf_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
  }
  return "?";
}

std::string shard_file(size_t i, size_t n) { return fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n); }

// Files an export writes (and so may replace), and their temporaries.
bool export_file(const std::string& name) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  std::string n = name;
  if (n.ends_with(".tmp")) n.resize(n.size() - 4);
  return n == kHfConfigFile || n == kHfWeightsFile || n == kHfIndexFile || std::regex_match(n, shard);
}

// Files of an HF model directory that an export does not write, and leaves alone.
bool companion_file(const std::string& name) {
  static const std::set<std::string> names = {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                              "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model",
                                              "chat_template.jinja", "README.md", ".gitattributes"};
  return names.count(name) != 0;
}

// An export's directory, checked before anything is written (docs/checkpoints-and-models.md,
// "Models from Hugging Face directories"): created if absent; refused when it holds what an export
// neither writes nor keeps. Returns the earlier export's files.
// Whether the weights in `dir` (model.safetensors, or the index's first shard) carry an export's
// mark (metadata "exported_by": "shardlab"); false for weights written by anything else.
bool marked_export(const fs::path& weights) {
  try {
    const SafetensorsReader reader(weights.string());  // alive while its metadata is read
    const auto& meta = reader.metadata();
    auto it = meta.find(kExportedBy);
    return it != meta.end() && it->second == "shardlab";
  } catch (const InputError&) {
    return false;  // unreadable weights: not an export's (a failed one removes its own)
  }
}

bool exported_here(const fs::path& dir) {
  fs::path weights = dir / kHfWeightsFile;
  std::error_code ec;
  if (!fs::exists(weights, ec)) {
    try {
      const json index = read_json_file(dir / kHfIndexFile, "");
      const auto& map = index.at("weight_map");
      if (map.empty()) return false;
      weights = dir / map.begin().value().get<std::string>();
    } catch (const std::exception&) {
      return false;
    }
  }
  return marked_export(weights);
}

std::vector<fs::path> prepare_export_dir(const fs::path& dir, bool overwrite) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    SHARD_REQUIRE(fs::is_directory(dir, ec),
                  "'{}' is a file: an export goes to an HF model directory, or to a path ending in .safetensors for "
                  "one file", dir.string());
  } else {
    fs::create_directories(dir, ec);
    SHARD_REQUIRE(!ec, "cannot create the directory '{}': {}", dir.string(), ec.message());
  }
  std::vector<fs::path> earlier;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (companion_file(name)) continue;
    SHARD_REQUIRE(export_file(name) && !e.is_directory(),
                  "'{}' holds '{}', which an export does not write: give a new or empty directory, or one holding "
                  "an earlier export (its files are replaced; tokenizer files, generation_config.json and README.md "
                  "are kept)",
                  dir.string(), name);
    earlier.push_back(e.path());
  }
  SHARD_REQUIRE(!ec, "cannot list the directory '{}': {}", dir.string(), ec.message());
  // A model that no export wrote there (a Hugging Face download, the directory a run was initialised
  // from) is not replaced unless asked.
  const bool weights = std::any_of(earlier.begin(), earlier.end(), [](const fs::path& p) {
    return p.extension() == ".safetensors" || p.filename() == kHfIndexFile;
  });
  SHARD_REQUIRE(overwrite || !weights || exported_here(dir),
                "'{}' holds a model that shardlab did not export (its weights carry no exported_by: shardlab mark: a "
                "Hugging Face download, the directory a run was initialised from, or an export before 2026-11-28): "
                "give a new directory, or replace its weights and config.json with export's --overwrite (train: "
                "--save-overwrite)", dir.string());
  return earlier;
}

}  // namespace

bool is_safetensors_path(std::string_view path) { return path.ends_with(".safetensors"); }

void check_safetensors_out(const std::string& file, bool overwrite) {
  std::error_code ec;
  if (overwrite || !fs::exists(file, ec) || fs::file_size(file, ec) == 0) return;  // an empty file: a probe's
  SHARD_REQUIRE(marked_export(file), "'{}' holds weights that shardlab did not write (no exported_by: shardlab mark: "
                "a Hugging Face download's, another tool's, or an export before 2026-11-28): give another path, or "
                "replace it with export's --overwrite (train: --save-overwrite)", file);
}

void check_hf_export_dir(const std::string& dir, bool overwrite) {
  prepare_export_dir(dir, overwrite);
  const fs::path probe = fs::path(dir) / kHfConfigFile;
  const bool existed = fs::exists(probe);
  std::ofstream f(probe, std::ios::app);
  SHARD_REQUIRE(f.good(), "cannot write in the directory '{}'", dir);
  f.close();
  if (!existed) fs::remove(probe);
}

bool is_hf_model_dir(const std::string& path) {
  std::error_code ec;
  return !path.empty() && fs::is_directory(path, ec);
}

ModelSpec read_hf_config(const std::string& dir) {
  const fs::path p = fs::path(dir) / kHfConfigFile;
  std::error_code ec;
  const bool checkpoint = fs::exists(fs::path(dir) / "manifest.json", ec);
  const json j = read_json_file(p, checkpoint ? "this is a shardlab checkpoint (it has a manifest.json): give it to "
                                                "--resume, or export it to an HF model directory"
                                              : "an HF model directory has a config.json, which gives the model's "
                                                "family and shape");
  SHARD_REQUIRE(j.is_object(), "'{}': expected a JSON object, got {}", p.string(), j.type_name());
  SHARD_REQUIRE(j.contains("model_type") && j["model_type"].is_string(),
                "'{}' has no \"model_type\" string: it names the model's family (shardlab knows {})", p.string(),
                join_names(model_family_names()));
  const std::string type = j["model_type"].get<std::string>();
  const std::vector<std::string> known = model_family_names();
  SHARD_REQUIRE(std::find(known.begin(), known.end(), type) != known.end(),
                "'{}': model_type '{}' is not a family shardlab implements (it knows {})", p.string(), type,
                join_names(known));
  ModelSpec s;
  try {
    s = model_family(type).spec_from_hf_config(j);
  } catch (const InputError& e) {
    // The family's messages name "config.json:"; this names the file.
    std::string m = e.what();
    if (m.starts_with("config.json: ")) m.erase(0, 13);
    throw InputError(fmt::format("'{}': {}", p.string(), m));
  }
  s.name = dir_name(dir);
  return s;
}

std::string hf_config_unapplied(const std::string& dir) {
  if (!is_hf_model_dir(dir)) return "";
  const json j = read_json_file(fs::path(dir) / kHfConfigFile, "");
  std::string set;
  for (const char* key : {"attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_first_dropout", "attention_dropout",
                          "hidden_dropout", "mlp_dropout"})
    if (j.contains(key) && j[key].is_number() && j[key].get<double>() != 0)
      set += fmt::format("{}{} {}", set.empty() ? "" : ", ", key, j[key].dump());
  return set.empty() ? "" : fmt::format("'{}' sets {}: shardlab trains without dropout, so these are not applied",
                                        (fs::path(dir) / kHfConfigFile).string(), set);
}

// ---- reading ------------------------------------------------------------------------------------

HfWeights::HfWeights(const std::string& path) {
  if (!is_hf_model_dir(path)) {  // one file (its errors name it)
    where_ = single_ = path;
    reader(path);
    return;
  }
  dir_ = path;
  const fs::path single = fs::path(path) / kHfWeightsFile, index = fs::path(path) / kHfIndexFile;
  std::error_code ec;
  if (fs::exists(single, ec)) {  // as transformers: the single file first
    where_ = single_ = single.string();
    reader(single_);
    return;
  }
  if (!fs::exists(index, ec)) {
    const bool bin = fs::exists(fs::path(path) / "pytorch_model.bin", ec) ||
                     fs::exists(fs::path(path) / "pytorch_model.bin.index.json", ec);
    throw InputError(fmt::format("'{}' has neither {} nor {}: no safetensors weights{}", path, kHfWeightsFile,
                                 kHfIndexFile,
                                 bin ? " (pytorch_model.bin is PyTorch's pickle format, which shardlab does not read: "
                                       "convert it to safetensors)"
                                     : ""));
  }
  where_ = index.string();
  const json j = read_json_file(index, "");
  SHARD_REQUIRE(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                "'{}' has no \"weight_map\" object (tensor name -> shard file)", where_);
  std::map<std::string, std::string> first_tensor;  // shard -> a tensor in it, for messages
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    SHARD_REQUIRE(it.value().is_string(), "'{}': tensor '{}' maps to {}, expected a file name", where_, it.key(),
                  it.value().dump());
    const std::string file = it.value().get<std::string>();
    SHARD_REQUIRE(!file.empty() && file.find('/') == std::string::npos && file.find('\\') == std::string::npos &&
                      file != "." && file != "..",
                  "'{}': tensor '{}' is in '{}', expected a file name in the same directory", where_, it.key(), file);
    weight_map_[it.key()] = file;
    first_tensor.emplace(file, it.key());
  }
  for (const auto& [file, tensor] : first_tensor)
    SHARD_REQUIRE(fs::is_regular_file(fs::path(path) / file, ec),
                  "'{}' names the shard '{}' (tensor '{}' among others), which is missing from '{}'", where_, file,
                  tensor, path);
}

SafetensorsReader& HfWeights::reader(const std::string& file) {
  auto it = readers_.find(file);
  if (it == readers_.end()) {
    const std::string path = dir_.empty() || file == single_ ? file : (fs::path(dir_) / file).string();
    it = readers_.emplace(file, std::make_unique<SafetensorsReader>(path)).first;
  }
  return *it->second;
}

bool HfWeights::has(const std::string& name) const {
  if (!single_.empty()) return readers_.at(single_)->has(name);
  return weight_map_.count(name) != 0;
}

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> n;
  if (!single_.empty())
    for (const auto& [name, e] : readers_.at(single_)->entries()) n.push_back(name);
  else
    for (const auto& [name, file] : weight_map_) n.push_back(name);
  return n;
}

const SafetensorsEntry& HfWeights::entry(const std::string& name) {
  if (!single_.empty()) return reader(single_).entry(name);
  auto it = weight_map_.find(name);
  SHARD_REQUIRE(it != weight_map_.end(), "'{}' has no tensor '{}'", where_, name);
  SafetensorsReader& r = reader(it->second);
  SHARD_REQUIRE(r.has(name), "'{}' puts tensor '{}' in '{}', which has no such tensor", where_, name, r.path());
  return r.entry(name);
}

void HfWeights::read_f32(const std::string& name, std::span<float> out, const std::vector<int64_t>* expect_shape) {
  entry(name);  // the index's claim checked
  reader(single_.empty() ? weight_map_.at(name) : single_).read_f32(name, out, expect_shape);
}

// ---- writing ------------------------------------------------------------------------------------

json HfModelWriter::with_dtype(json config) const {
  config[config.contains("dtype") ? "dtype" : "torch_dtype"] = hf_dtype_name(opts_.dtype);
  return config;
}

// The family's config for this model laid over the original: a field the original has with another
// value is replaced (and said), the rest kept; a field it lacks is added (and said) only where the
// original does not already read back to this model (transformers 5's "rope_parameters" and
// "dtype" stand for "rope_theta", "rope_scaling" and "torch_dtype"). The spec's position limit is
// the original's where the weights do not depend on it (the same tensor shapes at that length).
json HfModelWriter::over_base_config() {
  json base;
  try {
    base = json::parse(opts_.base_config);
  } catch (const json::exception& e) {
    throw InputError(fmt::format("the carried config.json ({}) is not JSON: {}", opts_.base_config_source, e.what()));
  }
  SHARD_REQUIRE(base.is_object(), "the carried config.json ({}) is not a JSON object", opts_.base_config_source);
  const ModelFamily& family = family_of(spec_);
  auto read_back = [&family](const json& c) -> std::optional<ModelSpec> {
    try {
      return family.spec_from_hf_config(c);
    } catch (const InputError&) {
      return std::nullopt;  // another family's or an unreadable config
    }
  };
  auto shapes = [&family](const ModelSpec& s) {
    std::vector<std::vector<int64_t>> out;
    for (const UnitLayout& u : family.layout(s))
      for (const TensorDecl& t : u.tensors) out.push_back(t.full_shape);
    return out;
  };
  ModelSpec target = spec_;
  if (const std::optional<ModelSpec> b = read_back(base); b && b->seq != spec_.seq) {
    ModelSpec at_base = spec_;
    at_base.seq = b->seq;
    if (shapes(at_base) == shapes(spec_)) target = at_base;
  }
  auto same_model = [&](const json& c) {
    std::optional<ModelSpec> s = read_back(c);
    if (!s) return false;
    s->name = target.name;
    return spec_to_json(*s) == spec_to_json(target);
  };
  json mine = family.hf_config(target);
  mine.erase("dtype");  // the stored dtype: set below, under the original's own key
  mine.erase("torch_dtype");
  json out = base;
  std::vector<std::string> changed, added;
  for (const auto& [key, value] : mine.items()) {
    if (!base.contains(key)) {
      added.push_back(key);
    } else if (base[key] != value) {
      changed.push_back(fmt::format("{} {} -> {}", key, base[key].dump(), value.dump()));
      out[key] = value;
    }
  }
  if (!same_model(out))
    for (const std::string& key : added) {
      changed.push_back(fmt::format("{} {} (added)", key, mine[key].dump()));
      out[key] = mine[key];
    }
  const char* dtype_key = base.contains("dtype") || (!base.contains("torch_dtype") && mine.contains("dtype"))
                              ? "dtype"
                              : "torch_dtype";
  const json dtype = hf_dtype_name(opts_.dtype);
  if (!base.contains(dtype_key) || base[dtype_key] != dtype)
    changed.push_back(base.contains(dtype_key) ? fmt::format("{} {} -> {}", dtype_key, base[dtype_key].dump(), dtype.dump())
                                               : fmt::format("{} {} (added)", dtype_key, dtype.dump()));
  out[dtype_key] = dtype;
  config_note_ = fmt::format("config.json: {}'s{}", opts_.base_config_source,
                             changed.empty() ? " as it was" : ", changed: " + fmt::format("{}", fmt::join(changed, "; ")));
  return out;
}

HfModelWriter::HfModelWriter(const std::string& out, const ModelSpec& spec, std::vector<HfTensorDecl> tensors,
                             HfWriteOptions opts)
    : out_(out), dir_(!is_safetensors_path(out)), spec_(spec), tensors_(std::move(tensors)), opts_(std::move(opts)) {
  SHARD_CHECK(!tensors_.empty(), "HfModelWriter '{}': no tensors", out);
  SHARD_REQUIRE(opts_.max_shard_size > 0, "--max-shard-size 0: expected a positive size");
  opts_.metadata.emplace("format", "pt");  // transformers refuses a safetensors file without it
  opts_.metadata.emplace(kExportedBy, "shardlab");  // what a later export into the directory may replace
  if (!dir_) {
    check_safetensors_out(out_, opts_.overwrite);
    shards_.push_back({out_, 0, tensors_.size()});
    return;
  }
  // The earlier export's files stay until this one is complete, all but its config.json: without
  // it the directory is not a model, so a failed export is never read as the earlier one.
  for (const fs::path& p : prepare_export_dir(out_, opts_.overwrite))
    if (p.filename() == kHfConfigFile) fs::remove(p);
  uint64_t size = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    uint64_t bytes = dtype_size(opts_.dtype);
    for (int64_t d : tensors_[i].shape) bytes *= static_cast<uint64_t>(d);
    if (shards_.empty() || size + bytes > opts_.max_shard_size) {
      if (!shards_.empty()) shards_.back().end = i;
      shards_.push_back({"", i, tensors_.size()});
      size = 0;
    }
    size += bytes;
  }
  for (size_t s = 0; s < shards_.size(); ++s)
    shards_[s].file = shards_.size() == 1 ? kHfWeightsFile : shard_file(s, shards_.size());
}

std::vector<std::string> HfModelWriter::files() const {
  std::vector<std::string> f;
  for (const Shard& s : shards_) f.push_back(s.file);
  if (dir_ && shards_.size() > 1) f.push_back(kHfIndexFile);
  if (dir_) f.push_back(kHfConfigFile);
  return f;
}

void HfModelWriter::open_shard(size_t s) {
  std::vector<SafetensorsStreamWriter::Entry> entries;
  for (size_t i = shards_[s].first; i < shards_[s].end; ++i)
    entries.push_back({tensors_[i].name, opts_.dtype, tensors_[i].shape});
  const std::string path = dir_ ? (fs::path(out_) / shards_[s].file).string() : out_;
  writer_ = std::make_unique<SafetensorsStreamWriter>(path, std::move(entries), opts_.metadata);
}

void HfModelWriter::write_next(std::span<const float> values) {
  SHARD_CHECK(next_ < tensors_.size(), "HfModelWriter '{}': {} tensors declared, writing one more", out_,
              tensors_.size());
  if (next_ == shards_[shard_].first) open_shard(shard_);
  writer_->write_next(values);
  if (++next_ == shards_[shard_].end) {
    writer_->finish();
    writer_.reset();
    ++shard_;
  }
}

void HfModelWriter::finish() {
  SHARD_CHECK(next_ == tensors_.size(), "HfModelWriter '{}': {} of {} tensors written", out_, next_, tensors_.size());
  if (!dir_) return;
  const fs::path dir(out_);
  const std::vector<std::string> mine = files();
  std::error_code ec;
  std::vector<fs::path> stale;  // the earlier export's other files (a single file shadows an index)
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (export_file(name) && std::find(mine.begin(), mine.end(), name) == mine.end()) stale.push_back(e.path());
  }
  for (const fs::path& p : stale) fs::remove(p, ec);
  if (shards_.size() > 1) {
    json index = {{"metadata", {{"total_size", 0}, {"total_parameters", 0}}}, {"weight_map", json::object()}};
    uint64_t bytes = 0, params = 0;
    for (const Shard& s : shards_)
      for (size_t i = s.first; i < s.end; ++i) {
        uint64_t n = 1;
        for (int64_t d : tensors_[i].shape) n *= static_cast<uint64_t>(d);
        params += n;
        bytes += n * dtype_size(opts_.dtype);
        index["weight_map"][tensors_[i].name] = s.file;
      }
    index["metadata"] = {{"total_size", bytes}, {"total_parameters", params}};
    write_json_file(dir / kHfIndexFile, index);
  }
  for (const auto& [name, text] : opts_.companions) {
    SHARD_CHECK(companion_file(name), "HfModelWriter: '{}' is not a companion file", name);
    write_text_file(dir / name, text);
  }
  json config = opts_.base_config.empty() ? with_dtype(family_of(spec_).hf_config(spec_)) : over_base_config();
  // The tokenizer's special ids; an original config's own (a list of end ids, say) are kept.
  for (const auto& [key, id] : opts_.config_ids)
    if (opts_.base_config.empty() || !config.contains(key) || config[key].is_null()) config[key] = id;
  write_json_file(dir / kHfConfigFile, config);  // last: the directory is complete
}

}  // namespace shardlab
