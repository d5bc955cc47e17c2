#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "src/model/spec.hpp"
#include "src/train/checkpoint_format.hpp"

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
  CHECK_THROWS_WITH(spec_from_json(k), "unknown model family 'gpt3': expected one of gpt2");
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
}

TEST_CASE("parse_manifest returns every field typed", "[ckpt]") {
  const Manifest m = parse_manifest(valid_manifest().dump(), "valid.json");
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
  CHECK_THAT(rejection(json::parse("{}")), Catch::Contains("is not a valid manifest: its format is not shardlab.checkpoint/1"));
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
