#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "src/core/hash.hpp"
#include "src/model/spec.hpp"
#include "src/checkpoint/checkpoint_format.hpp"

using namespace shardlab;
using nlohmann::json;

namespace {

// The seed corpus's manifest: written by `shardlab train --model tiny --nproc 4 --strategy zero3`.
json valid_manifest() {
  std::ifstream f(std::string(SHARDLAB_SOURCE_DIR) + "/tests/fuzz/corpus/manifest/valid.json");
  REQUIRE(f.good());
  return json::parse(f);
}

// The message parse_manifest throws for m, or "" when it accepts it.
std::string rejection(const json& m) {
  try {
    parse_manifest(m.dump(), "m.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("spec_to_json and spec_from_json round-trip and reject bad specs", "[ckpt]") {
  const ModelSpec tiny = model_preset("tiny");
  const json j = spec_to_json(tiny);
  CHECK(j == json::parse(
                 R"({"family": "gpt2", "name": "tiny", "layers": 2, "dim": 32, "heads": 2, "seq": 32, "vocab": 256})"));
  const ModelSpec back = spec_from_json(j);
  CHECK(back.name == "tiny");
  CHECK(back.describe() == tiny.describe());

  json unnamed = j;
  unnamed.erase("name");
  CHECK(spec_from_json(unnamed).name == "custom");
  CHECK_THROWS_WITH(spec_from_json(json()), "\"layers\" must be an integer");
  json k = j;
  k["dim"] = "32";
  CHECK_THROWS_WITH(spec_from_json(k), "\"dim\" must be an integer");
  k = j;
  k["vocab"] = 1;
  CHECK_THROWS_WITH(spec_from_json(k), "\"vocab\" is 1, below 2");
  k = j;
  k["heads"] = 3;
  CHECK_THROWS_WITH(spec_from_json(k), "--dim 32 is not divisible by --heads 3");
  k = j;
  k["name"] = 7;
  CHECK_THROWS_WITH(spec_from_json(k), "\"name\" must be a string");

  // Specs written before families had none: they are GPT-2's.
  json old = j;
  old.erase("family");
  CHECK(spec_from_json(old).family == FamilyId::gpt2);
  CHECK(spec_from_json(old).describe() == tiny.describe());
  k = j;
  k["family"] = "gpt3";
  CHECK_THROWS_WITH(spec_from_json(k), "unknown model family 'gpt3': expected one of gpt2, llama, mixtral, qwen3_moe, qwen3, deepseek_v3");
  // Fields off their defaults are written, read back, and checked by the family.
  ModelSpec wide = tiny;
  wide.ffn_dim = 48;
  wide.norm_eps = 1e-6;
  const json w = spec_to_json(wide);
  CHECK(w["ffn_dim"] == 48);
  CHECK(w.contains("norm_eps"));
  CHECK_FALSE(w.contains("kv_heads"));
  CHECK(spec_from_json(w).ffn_hidden() == 48);
  CHECK(spec_from_json(w).norm_eps == 1e-6);
  k = j;
  k["kv_heads"] = 1;
  CHECK_THROWS_WITH(spec_from_json(k), Catch::Contains("GPT-2 attends with as many K/V heads as heads"));
  k = j;
  k["tied_head"] = false;
  CHECK_THROWS_WITH(spec_from_json(k), Catch::Contains("tied_head must be true"));
  // A mixture of experts: its head size, q/k norms and experts written and read back.
  const ModelSpec q = model_preset("qwen3-30b-a3b");
  const json qj = spec_to_json(q);
  CHECK(qj["family"] == "qwen3_moe");
  CHECK(qj["head_dim"] == 128);
  CHECK(qj["moe"]["experts"] == 128);
  const ModelSpec qback = spec_from_json(qj);
  CHECK(qback.moe == q.moe);
  CHECK((qback.head_dim == q.head_dim && qback.qk_norm && qback.describe() == q.describe()));
  k = qj;
  k["moe"]["top_k"] = 129;
  CHECK_THROWS_WITH(spec_from_json(k), Catch::Contains("need 1 <= top_k <= experts"));
  k = j;
  k["moe"] = qj["moe"];
  CHECK_THROWS_WITH(spec_from_json(k), Catch::Contains("GPT-2 has a dense MLP"));
}

TEST_CASE("parse_manifest returns every field typed", "[ckpt]") {
  const Manifest m = parse_manifest(valid_manifest().dump(), "valid.json");
  CHECK(m.version == 1);  // the corpus keeps a manifest of the older format: it still parses
  CHECK(m.model.describe() == model_preset("tiny").describe());
  CHECK(m.strategy == "zero3");
  CHECK(m.world == 4);
  CHECK(m.param_dtype == DType::f32);
  CHECK(m.reduce_dtype == DType::f32);
  CHECK(m.optimizer.kind == "adamw");
  CHECK(static_cast<float>(m.optimizer.beta1) == 0.9f);
  CHECK(static_cast<float>(m.optimizer.beta2) == 0.95f);
  CHECK(static_cast<float>(m.optimizer.eps) == 1e-8f);
  CHECK(static_cast<float>(m.optimizer.weight_decay) == 0.1f);
  CHECK(m.optimizer.states == std::vector<std::string>{"param", "adam_m", "adam_v"});
  CHECK(m.step == 5);
  CHECK(m.data_position == 5);
  CHECK(m.seed == 1337);
  REQUIRE(m.files.size() == 4);
  CHECK(m.files[1].rank == 1);
  CHECK(m.files[1].file == "rank_00001.bin");
  CHECK(m.files[1].bytes == 104064);
  CHECK(m.files[1].checksum == "fnv1a64:c8be42ab86e3b492");

  const ManifestTensor& t = m.tensors.at("h.0.attn.c_attn.bias");
  CHECK(t.shape == std::vector<int64_t>{96});
  CHECK(t.states.size() == 3);
  const std::vector<ManifestPiece>* param = m.find_pieces("h.0.attn.c_attn.bias", "param");
  REQUIRE(param);
  REQUIRE(param->size() == 2);
  CHECK((*param)[1].rank == 1);
  CHECK((*param)[1].offset == 27648);
  CHECK((*param)[1].begin == 40);
  CHECK((*param)[1].end == 96);
  CHECK((*param)[1].slice.empty());  // a flat range of the whole tensor
  CHECK(m.find_pieces("h.0.attn.c_attn.bias", "momentum") == nullptr);
  CHECK(m.find_pieces("no.such.tensor", "param") == nullptr);
}

TEST_CASE("parse_manifest defaults the informational fields and checks them when present", "[ckpt]") {
  json j = valid_manifest();
  for (const char* key : {"param_dtype", "reduce_dtype", "data_position", "seed"}) j.erase(key);
  j["optimizer"] = {{"kind", "sgd"}};
  j["seed"] = 18446744073709551615ull;  // any uint64
  const Manifest m = parse_manifest(j.dump(), "m.json");
  CHECK(m.param_dtype == DType::f32);
  CHECK(m.reduce_dtype == DType::f32);
  CHECK(m.data_position == m.step);
  CHECK(m.seed == 18446744073709551615ull);
  CHECK(m.optimizer.kind == "sgd");
  CHECK(m.optimizer.states.empty());

  j = valid_manifest();
  j["param_dtype"] = "bf16";
  CHECK(parse_manifest(j.dump(), "m.json").param_dtype == DType::bf16);
  j["reduce_dtype"] = "f8";
  CHECK(rejection(j) == "'m.json' is not a valid manifest: \"reduce_dtype\": unknown dtype 'f8': expected f32, bf16 or f16");
  j = valid_manifest();
  j["optimizer"]["beta1"] = "0.9";
  CHECK(rejection(j) == "'m.json' is not a valid manifest: \"beta1\" must be a number");
  j = valid_manifest();
  j["seed"] = -1;
  CHECK(rejection(j) == "'m.json' is not a valid manifest: \"seed\" is -1, below 0");
}

TEST_CASE("parse_manifest names what is wrong with a manifest", "[ckpt]") {
  CHECK_THAT(rejection(json::parse("{}")), Catch::Contains("is not a valid manifest: its format is not shardlab.checkpoint/2 (or the older shardlab.checkpoint/1)"));
  json j = valid_manifest();
  j["model"].erase("layers");
  CHECK(rejection(j) == "'m.json' is not a valid manifest: \"layers\" must be an integer");
  j = valid_manifest();
  j["model"]["vocab"] = 1 << 30;
  CHECK_THAT(rejection(j), Catch::Contains("is not a valid manifest: model too large to describe"));
  j = valid_manifest();
  j["world"] = 0;
  CHECK(rejection(j) == "'m.json' is not a valid manifest: \"world\" is 0, below 1");
  j = valid_manifest();
  j["files"][0]["file"] = "../escape";
  CHECK(rejection(j) == "'m.json' is not a valid manifest: file name '../escape' must be a plain name inside the checkpoint");
  j = valid_manifest();
  j["tensors"]["wte.weight"]["param"][0]["rank"] = 9;
  CHECK(rejection(j) ==
        "'m.json' is not a valid manifest: a piece of param of 'wte.weight' lies in rank 9's file, which is not listed");
  j = valid_manifest();
  j["tensors"]["wte.weight"]["param"][0]["end"] = 0;
  CHECK_THAT(rejection(j), Catch::Contains("a piece of param of 'wte.weight' spans [0, 0)"));
  j = valid_manifest();
  j["tensors"]["wte.weight"]["shape"] = {256, -32};
  CHECK(rejection(j) == "'m.json' is not a valid manifest: the shape of 'wte.weight' is not valid");
  CHECK_THROWS_WITH(parse_manifest("[1", "m.json"), Catch::Contains("'m.json' is corrupt"));
}

// ---- Slices: pieces that are boxes of a tensor, read back against a reference ---------------------

namespace {

// The value a test tensor holds at flat element i: exact in f32.
float value_at(int64_t i) { return static_cast<float>(i) + 0.5f; }

// The flat elements of region r in its order, by plain index arithmetic (the reference: it shares
// nothing with read_region's runs).
std::vector<int64_t> elements(const std::vector<int64_t>& shape, const TensorRegion& r) {
  std::vector<int64_t> out;
  for (int64_t k = r.begin; k < r.end; ++k) {
    if (r.box.empty()) {
      out.push_back(k);
      continue;
    }
    int64_t rest = k, flat = 0, stride = 1;
    for (size_t d = shape.size(); d-- > 0;) {
      flat += (r.box[d].offset + rest % r.box[d].length) * stride;
      rest /= r.box[d].length;
      stride *= shape[d];
    }
    out.push_back(flat);
  }
  return out;
}

// A checkpoint directory holding one tensor "w" of `shape` (state "param") in `pieces` (their
// rank; offsets and files are made here): each rank's file holds its pieces' values in order.
struct SlicedCheckpoint {
  std::filesystem::path dir;
  Manifest manifest;
  SlicedCheckpoint(const std::vector<int64_t>& shape, std::vector<ManifestPiece> pieces) {
    static int serial = 0;
    dir = std::filesystem::temp_directory_path() / fmt::format("shardlab_test_slices_{}_{}", ::getpid(), serial++);
    std::filesystem::create_directories(dir);
    std::map<int64_t, std::string> bytes;  // per rank
    json m = valid_manifest();
    m["format"] = kCheckpointFormat;
    m["files"] = json::array();
    m["tensors"] = json::object();
    m["tensors"]["w"]["shape"] = shape;
    for (ManifestPiece& p : pieces) {
      std::string& b = bytes[p.rank];
      p.offset = b.size();
      for (int64_t i : elements(shape, p.region())) {
        const float v = value_at(i);
        b.append(reinterpret_cast<const char*>(&v), sizeof v);
      }
      m["tensors"]["w"]["param"].push_back(piece_to_json(p));
    }
    for (const auto& [rank, b] : bytes) {
      const std::string name = fmt::format("rank_{:05d}.bin", rank);
      std::ofstream(dir / name, std::ios::binary) << b;
      m["files"].push_back({{"rank", rank}, {"file", name}, {"bytes", b.size()},
                            {"checksum", fmt::format("fnv1a64:{:016x}", fnv1a64(b))}});
    }
    std::ofstream(dir / "manifest.json") << m.dump(1);
    manifest = read_manifest(dir);
  }
  ~SlicedCheckpoint() { std::filesystem::remove_all(dir); }
  // Reads `want`; checks every element against the reference and returns how many were covered.
  int64_t read_checked(const TensorRegion& want) {
    CheckpointFiles files(dir, manifest.files);
    const auto& t = manifest.tensors.at("w");
    std::vector<float> got(static_cast<size_t>(want.end - want.begin), -1.f);
    const int64_t covered = read_region(files, t.states.at("param"), t.shape, want, got.data(), "w");
    if (covered == want.end - want.begin) {
      const std::vector<int64_t> flat = elements(t.shape, want);
      for (size_t k = 0; k < got.size(); ++k) {
        INFO("element " << k << " of the region, flat " << flat[k]);
        REQUIRE(got[k] == value_at(flat[k]));
      }
    }
    return covered;
  }
};

std::vector<SliceDim> box(std::initializer_list<std::pair<int64_t, int64_t>> dims) {
  std::vector<SliceDim> out;
  for (auto [o, n] : dims) out.push_back({o, n});
  return out;
}

}  // namespace

TEST_CASE("strided 2-D slices (tensor-parallel columns, shards of them) assemble any region", "[ckpt]") {
  // A (5, 7) weight: columns [0, 3) whole in rank 0's file; columns [3, 7) as a flat-parameter
  // shard split between ranks 1 and 2 (9 and 11 of its 20 elements).
  const std::vector<int64_t> shape{5, 7};
  SlicedCheckpoint c(shape, {{0, 0, 0, 15, box({{0, 5}, {0, 3}})},
                             {1, 0, 0, 9, box({{0, 5}, {3, 4}})},
                             {2, 0, 9, 20, box({{0, 5}, {3, 4}})}});
  CHECK(c.manifest.version == 2);
  const auto& pieces = c.manifest.tensors.at("w").states.at("param");
  REQUIRE(pieces.size() == 3);
  CHECK(pieces[2].slice == box({{0, 5}, {3, 4}}));
  CHECK(pieces[2].begin == 9);
  CHECK(c.read_checked({{}, 0, 35}) == 35);                          // the whole tensor, flat
  CHECK(c.read_checked({{}, 10, 30}) == 20);                         // a flat range (a ZeRO shard)
  CHECK(c.read_checked({box({{1, 3}, {2, 4}}), 0, 12}) == 12);       // a box across the column split
  CHECK(c.read_checked({box({{1, 3}, {2, 4}}), 2, 11}) == 9);        // a shard of that box
  CHECK(c.read_checked({box({{0, 5}, {6, 1}}), 0, 5}) == 5);         // one column
  CHECK(c.read_checked({box({{4, 1}, {0, 7}}), 0, 7}) == 7);         // one row

  // Without rank 2's piece, elements [9, 20) of the right-hand slice are missing (row 2 on, partly).
  SlicedCheckpoint gap(shape, {{0, 0, 0, 15, box({{0, 5}, {0, 3}})}, {1, 0, 0, 9, box({{0, 5}, {3, 4}})}});
  CHECK(gap.read_checked({{}, 0, 35}) == 35 - 11);
  CHECK(gap.read_checked({box({{0, 2}, {0, 7}}), 0, 14}) == 14);  // rows 0 and 1 are all there
}

TEST_CASE("random tilings of a 3-D tensor by slices and shards read back any region", "[ckpt]") {
  const std::vector<int64_t> shape{4, 6, 5};
  std::mt19937 rng(7);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int trial = 0; trial < 20; ++trial) {
    // Cut dimension 1 (or 0) into two slices, each split into two flat shards, plus a replica of
    // some flat range of the whole tensor (as an older DDP checkpoint holds).
    const size_t d = trial % 2 ? 1 : 0;
    const int64_t cut = uniform(1, shape[d] - 1);
    std::vector<ManifestPiece> pieces;
    int64_t rank = 0;
    for (auto [o, n] : {std::pair{int64_t{0}, cut}, std::pair{cut, shape[d] - cut}}) {
      std::vector<SliceDim> b = box({{0, shape[0]}, {0, shape[1]}, {0, shape[2]}});
      b[d] = {o, n};
      const int64_t numel = b[0].length * b[1].length * b[2].length, split = uniform(1, numel - 1);
      pieces.push_back({rank++, 0, 0, split, b});
      pieces.push_back({rank++, 0, split, numel, b});
    }
    const int64_t r0 = uniform(0, 100);
    pieces.push_back({rank, 0, r0, uniform(r0 + 1, 120), {}});
    SlicedCheckpoint c(shape, pieces);
    for (int q = 0; q < 10; ++q) {
      std::vector<SliceDim> want;
      int64_t numel = 1;
      for (int64_t n : shape) {
        const int64_t o = uniform(0, n - 1), len = uniform(1, n - o);
        want.push_back({o, len});
        numel *= len;
      }
      const int64_t b = uniform(0, numel - 1), e = uniform(b + 1, numel);
      INFO("trial " << trial << " query " << q);
      CHECK(c.read_checked({want, b, e}) == e - b);
      CHECK(c.read_checked({{}, b, e}) == e - b);
    }
  }
}

TEST_CASE("parse_manifest checks slices against the tensor's shape", "[ckpt]") {
  json j = valid_manifest();
  j["format"] = kCheckpointFormat;
  json& piece = j["tensors"]["wte.weight"]["param"][0];  // shape (256, 32)
  piece["begin"] = 0;
  piece["end"] = 64;
  piece["slice"] = {{0, 256}, {30, 2}};
  CHECK(rejection(j).empty());
  CHECK(parse_manifest(j.dump(), "m.json").find_pieces("wte.weight", "param")->at(0).slice == box({{0, 256}, {30, 2}}));
  // The fuzzer's seed of format 2: the valid manifest with wte's first piece as a box of rows.
  std::ifstream f(std::string(SHARDLAB_SOURCE_DIR) + "/tests/fuzz/corpus/manifest/sliced.json");
  const Manifest sliced = parse_manifest(std::string(std::istreambuf_iterator<char>(f), {}), "sliced.json");
  CHECK(sliced.find_pieces("wte.weight", "param")->at(0).slice == box({{0, 72}, {0, 32}}));
  piece["end"] = 513;
  CHECK(rejection(j) == "'m.json' is not a valid manifest: a piece of param of 'wte.weight' spans [0, 513) of a slice of 512 elements");
  piece["end"] = 64;
  piece["slice"] = {{0, 256}, {30, 3}};
  CHECK(rejection(j) == "'m.json' is not a valid manifest: a piece of param of 'wte.weight' slices [30, 33) of dimension 1, which has 32");
  piece["slice"] = {{0, 256}};
  CHECK(rejection(j) == "'m.json' is not a valid manifest: a piece of param of 'wte.weight' slices 1 dimensions of a tensor of 2");
  piece["slice"] = {{0, 256}, {3, 0}};
  CHECK(rejection(j) == "'m.json' is not a valid manifest: a piece of param of 'wte.weight': slice dimension [3, 3) is empty or negative");
  piece["slice"] = {{0, 256}, {30, 2}};
  j["format"] = kCheckpointFormatV1;
  CHECK(rejection(j) == "'m.json' is not a valid manifest: a piece of param of 'wte.weight' has a \"slice\", which format shardlab.checkpoint/1 does not have");
}
