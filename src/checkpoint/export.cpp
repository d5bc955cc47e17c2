// export.cpp — finding the newest checkpoint of a directory, and `export`: a checkpoint's parameters
// as HF-named safetensors, one tensor in memory at a time (checkpoint_format.hpp).
#include "src/checkpoint/checkpoint_format.hpp"

#include <algorithm>
#include <fmt/format.h>
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

// The first of `names` the tokenizer.json holds (an added token, else a vocabulary entry: these
// names are ASCII, which byte-level BPE writes as is) and its id; id -1 when none.
struct SpecialToken {
  std::string name;
  int64_t id = -1;
};
SpecialToken special_token(const json& tok, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    for (const json& a : tok.value("added_tokens", json::array()))
      if (a.value("content", "") == n) return {n, a.value("id", int64_t(-1))};
    const json& vocab = tok["model"]["vocab"];
    if (vocab.contains(n)) return {n, vocab[n].get<int64_t>()};
  }
  return {};
}

// What an export carries beside the weights when the checkpoint has a tokenizer: tokenizer.json,
// a tokenizer_config.json that transformers' AutoTokenizer reads it with, the special tokens'
// ids in config.json and generation_config.json (GPT-2's <|endoftext|> is both; Llama 3's
// <|begin_of_text|> and <|end_of_text|>; bytes as tokens have none).
void add_tokenizer(const std::string& text, const ModelSpec& spec, HfWriteOptions& opts) {
  const json tok = json::parse(text);
  const SpecialToken bos = special_token(tok, {"<|begin_of_text|>", "<|endoftext|>", "<s>"});
  const SpecialToken eos = special_token(tok, {"<|end_of_text|>", "<|endoftext|>", "</s>"});
  json config = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"model_max_length", spec.seq},
                 {"clean_up_tokenization_spaces", false}};
  json generation = json::object();
  for (const auto& [key, t] : {std::pair{"bos", bos}, std::pair{"eos", eos}}) {
    if (t.id < 0 || t.id >= spec.vocab) continue;
    config[fmt::format("{}_token", key)] = t.name;
    generation[fmt::format("{}_token_id", key)] = t.id;
    opts.config_ids[fmt::format("{}_token_id", key)] = t.id;
  }
  opts.companions["tokenizer.json"] = text;
  opts.companions["tokenizer_config.json"] = config.dump(2) + "\n";
  opts.companions["generation_config.json"] = generation.dump(2) + "\n";
}

}  // namespace

namespace {
// A carried file (tokenizer.json, hf_config.json), checked against its manifest record.
std::string read_carried(const fs::path& dir, const std::optional<ManifestTokenizer>& rec, const char* what) {
  if (!rec) return "";
  const fs::path p = dir / rec->file;
  std::ifstream f(p, std::ios::binary);
  SHARD_REQUIRE(f.good(), "checkpoint '{}' records {}, but '{}' cannot be read", dir.string(), what, p.string());
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::string sum = fnv1a64_text(fnv1a64(text));
  SHARD_REQUIRE(text.size() == rec->bytes && sum == rec->checksum,
                "'{}' is not the file the checkpoint wrote: {} bytes, {}; the manifest says {} bytes, {}", p.string(),
                text.size(), sum, rec->bytes, rec->checksum);
  return text;
}
}  // namespace

std::string read_checkpoint_tokenizer(const fs::path& dir, const Manifest& m) {
  return read_carried(dir, m.tokenizer, "a tokenizer");
}
std::string read_checkpoint_hf_config(const fs::path& dir, const Manifest& m) {
  return read_carried(dir, m.hf_config, "the model's original config.json");
}

std::string export_checkpoint(const std::string& path, const std::string& out, DType dtype, uint64_t max_shard_size,
                              bool overwrite) {
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
  opts.overwrite = overwrite;
  opts.metadata = {{"model", m.model.describe()}, {"step", std::to_string(m.step)}};
  if (const std::string tok = read_checkpoint_tokenizer(dir, m); !tok.empty()) add_tokenizer(tok, m.model, opts);
  opts.base_config = read_checkpoint_hf_config(dir, m);
  if (m.hf_config) opts.base_config_source = m.hf_config->source;
  HfModelWriter w(out, m.model, std::move(tensors), std::move(opts));
  for (const TensorDecl* t : decls) w.write_next(read_param(m, files, *t, path));  // one tensor in memory at a time
  w.finish();
  return w.config_note();
}

}  // namespace shardlab
