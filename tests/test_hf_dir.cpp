// Hugging Face model directories: a directory transformers wrote (tests/reference/make_hf_dir.py)
// loads and computes what transformers computes; shardlab's own directories round-trip, split into
// shards as save_pretrained splits them; and every malformed directory is refused by name.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "src/model/model.hpp"

using namespace shardlab;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kHfDir = std::string(SHARDLAB_SOURCE_DIR) + "/tests/reference/hf_gpt2_tiny";
const std::string kHfRef = std::string(SHARDLAB_SOURCE_DIR) + "/tests/reference/hf_gpt2_tiny.json";

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("shardlab_test_hf_" + name);
  fs::remove_all(p);
  return p.string();
}

json read_json(const fs::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::trunc);
  f << text;
}

struct Cpu {
  std::unique_ptr<Backend> be = make_cpu_backend(BackendConfig{1});
  Pool pool{*be};
};

// Every parameter of a and b, bit for bit (after rounding a's through `stored`).
int differences(Model& a, Model& b, DType stored = DType::f32) {
  int diffs = 0;
  for (size_t u = 0; u < a.num_units(); ++u) {
    auto pa = a.unit_params(u).span<float>(), pb = b.unit_params(u).span<float>();
    for (size_t i = 0; i < pa.size(); ++i) {
      float want = pa[i];
      if (stored == DType::bf16) want = bf16_bits_to_f32(f32_to_bf16_bits(want));
      if (stored == DType::f16) want = f16_bits_to_f32(f32_to_f16_bits(want));
      diffs += pb[i] != want;
    }
  }
  return diffs;
}

std::vector<HfTensorDecl> hf_tensors(const Model& m) {
  std::vector<HfTensorDecl> t;
  for (size_t u = 0; u < m.num_units(); ++u)
    for (const TensorDecl& d : const_cast<Model&>(m).unit(u).layout().tensors)
      t.push_back({family_of(m.spec()).hf_name(d), d.shape});
  return t;
}

// Writes m's parameters through HfModelWriter, as export does.
void write_model(Model& m, const std::string& out, HfWriteOptions opts) {
  HfModelWriter w(out, m.spec(), hf_tensors(m), std::move(opts));
  for (size_t u = 0; u < m.num_units(); ++u)
    for (const TensorDecl& d : m.unit(u).layout().tensors) {
      auto v = m.unit_params(u).span<float>().subspan(static_cast<size_t>(d.offset), static_cast<size_t>(d.numel));
      w.write_next(v);
    }
  w.finish();
}

}  // namespace

namespace {

// Loads a directory transformers wrote and checks the logits and loss of its reference file.
void check_against_transformers(const std::string& dir, const std::string& reference) {
  const ModelSpec spec = read_hf_config(dir);
  Cpu cpu;
  Model m(spec, *cpu.be, cpu.pool);
  m.load(dir);
  const json ref = read_json(reference);
  const auto all = ref["tokens"].get<std::vector<int32_t>>();
  REQUIRE(static_cast<int64_t>(all.size()) == spec.seq + 1);
  std::vector<int32_t> tokens(all.begin(), all.end() - 1), targets(all.begin() + 1, all.end());
  std::vector<float> logits;
  const float loss = m.forward_backward(Batch{tokens.data(), targets.data(), 1, spec.seq}, 1.f, &logits);
  REQUIRE(static_cast<int64_t>(logits.size()) == spec.seq * spec.vocab);
  double worst = 0;
  for (int64_t t = 0; t < spec.seq; ++t)
    for (int64_t v = 0; v < spec.vocab; ++v)
      worst = std::max(worst, std::fabs(logits[static_cast<size_t>(t * spec.vocab + v)] - ref["logits"][t][v].get<double>()));
  std::printf("transformers' %s directory: loss %.7f vs %.7f, logits max abs error %.3g\n", spec.name.c_str(), loss,
              ref["loss"].get<double>(), worst);
  CHECK(worst <= 2e-5);  // f32 against float64, as the PyTorch reference test (values rounded to 1e-7)
  CHECK(loss == Approx(ref["loss"].get<double>()).epsilon(1e-5));
}

}  // namespace

TEST_CASE("a GPT-2 directory written by transformers loads and computes transformers' logits", "[hf_dir]") {
  const ModelSpec spec = read_hf_config(kHfDir);  // bf16, two shards and an index, "transformer." names
  const ModelSpec tiny = model_preset("tiny");
  CHECK(spec.family == FamilyId::gpt2);
  CHECK(spec.name == "hf_gpt2_tiny");
  CHECK((spec.layers == tiny.layers && spec.dim == tiny.dim && spec.heads == tiny.heads && spec.seq == tiny.seq &&
         spec.vocab == tiny.vocab));
  check_against_transformers(kHfDir, kHfRef);
}

TEST_CASE("a Llama directory written by transformers loads and computes transformers' logits", "[hf_dir][llama]") {
  // tests/reference/make_hf_llama_dir.py: bf16 shards with an index, grouped-query heads, an untied
  // lm_head, and transformers 5's "rope_parameters" with Llama 3.1's frequency scaling.
  const std::string dir = std::string(SHARDLAB_SOURCE_DIR) + "/tests/reference/hf_llama_tiny";
  const ModelSpec spec = read_hf_config(dir);
  CHECK(spec.family == FamilyId::llama);
  CHECK((spec.layers == 2 && spec.dim == 32 && spec.heads == 4 && spec.num_kv_heads() == 2 &&
         spec.ffn_hidden() == 88 && spec.vocab == 256 && !spec.tied_head && spec.rope_theta == 500000));
  CHECK(spec.rope_scaling.enabled());
  check_against_transformers(dir, std::string(SHARDLAB_SOURCE_DIR) + "/tests/reference/hf_llama_tiny.json");
}

TEST_CASE("a model written as an HF directory reads back bit for bit, in f32, bf16 and f16", "[hf_dir]") {
  Cpu cpu;
  const ModelSpec spec = model_preset("tiny");
  Model a(spec, *cpu.be, cpu.pool), b(spec, *cpu.be, cpu.pool);
  a.init(5);
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    const std::string dir = fresh_dir(std::string("roundtrip_") + dtype_name(t));
    a.save(dir, t);  // a path without .safetensors: a directory
    REQUIRE(fs::is_directory(dir));
    CHECK(fs::exists(fs::path(dir) / "model.safetensors"));
    CHECK(!fs::exists(fs::path(dir) / "model.safetensors.index.json"));
    const json config = read_json(fs::path(dir) / "config.json");
    CHECK(config["model_type"] == "gpt2");
    CHECK(config["torch_dtype"] == (t == DType::f32 ? "float32" : t == DType::bf16 ? "bfloat16" : "float16"));
    ModelSpec back = read_hf_config(dir);
    back.name = spec.name;
    CHECK(spec_to_json(back) == spec_to_json(spec));
    CHECK(HfWeights(dir).entry("wte.weight").dtype == t);
    b.load(dir);
    CHECK(differences(a, b, t) == 0);
  }
}

// The export transformers was checked to load (MixtralForCausalLM and Qwen3MoeForCausalLM give
// shardlab's cross-entropy and auxiliary loss of the saved model, docs/models.md); here its config
// reads back to the same spec and its per-expert tensors to the same values.
TEST_CASE("a mixture of experts written as an HF directory reads back bit for bit", "[hf_dir][moe]") {
  Cpu cpu;
  for (const char* preset : {"qwen3-moe-tiny", "mixtral-tiny"}) {
    const ModelSpec spec = model_preset(preset);
    Model a(spec, *cpu.be, cpu.pool), b(spec, *cpu.be, cpu.pool);
    a.init(7);
    const std::string dir = fresh_dir(std::string("roundtrip_") + preset);
    a.save(dir, DType::f32);
    const json config = read_json(fs::path(dir) / "config.json");
    CHECK(config["model_type"] == family_of(spec).name());
    CHECK(config["num_experts_per_tok"] == 2);
    CHECK(config["output_router_logits"] == true);  // transformers' loss then has the auxiliary term
    ModelSpec back = read_hf_config(dir);
    back.name = spec.name;
    CHECK(spec_to_json(back) == spec_to_json(spec));
    const std::string expert = spec.family == FamilyId::mixtral ? "model.layers.1.block_sparse_moe.experts.3.w2.weight"
                                                                : "model.layers.1.mlp.experts.3.down_proj.weight";
    CHECK(HfWeights(dir).entry(expert).shape == std::vector<int64_t>{32, 24});
    b.load(dir);
    CHECK(differences(a, b, DType::f32) == 0);
  }
}

TEST_CASE("past max_shard_size a directory is split as save_pretrained splits it, with an index", "[hf_dir]") {
  Cpu cpu;
  const ModelSpec spec = model_preset("tiny");
  Model a(spec, *cpu.be, cpu.pool), b(spec, *cpu.be, cpu.pool);
  a.init(9);
  const std::string dir = fresh_dir("sharded");
  const uint64_t max = 20000;  // tiny: 138,752 bytes in f32, wte alone 32,768
  HfWriteOptions opts;
  opts.max_shard_size = max;
  write_model(a, dir, opts);

  const json index = read_json(fs::path(dir) / "model.safetensors.index.json");
  const std::vector<HfTensorDecl> tensors = hf_tensors(a);
  std::map<std::string, uint64_t> bytes;  // per tensor
  uint64_t total = 0;
  for (const HfTensorDecl& t : tensors) {
    uint64_t n = 4;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    bytes[t.name] = n;
    total += n;
  }
  CHECK(index["metadata"]["total_size"] == total);
  CHECK(index["metadata"]["total_parameters"] == total / 4);
  const auto& map = index["weight_map"];
  REQUIRE(map.size() == tensors.size());  // every tensor, no other
  // Shards in tensor order; a shard full when the next tensor would take it past max; one larger
  // than max only when it is a single tensor.
  std::vector<std::string> order;
  std::map<std::string, uint64_t> shard_bytes;
  std::map<std::string, int> shard_tensors;
  for (size_t i = 0; i < tensors.size(); ++i) {
    REQUIRE(map.contains(tensors[i].name));
    const std::string f = map[tensors[i].name];
    if (order.empty() || order.back() != f) {
      CHECK(std::find(order.begin(), order.end(), f) == order.end());  // contiguous
      if (!order.empty()) CHECK(shard_bytes[order.back()] + bytes[tensors[i].name] > max);
      order.push_back(f);
    }
    shard_bytes[f] += bytes[tensors[i].name];
    shard_tensors[f] += 1;
  }
  REQUIRE(order.size() > 2);
  for (size_t s = 0; s < order.size(); ++s) {
    char want[64];
    std::snprintf(want, sizeof(want), "model-%05zu-of-%05zu.safetensors", s + 1, order.size());
    CHECK(order[s] == want);
    CHECK((shard_bytes[order[s]] <= max || shard_tensors[order[s]] == 1));
    CHECK(SafetensorsReader((fs::path(dir) / order[s]).string()).entries().size() == size_t(shard_tensors[order[s]]));
  }
  CHECK(!fs::exists(fs::path(dir) / "model.safetensors"));
  b.load(dir);
  CHECK(differences(a, b) == 0);

  // Written again in one file: the index and shards go (model.safetensors would shadow them anyway),
  // a tokenizer file stays.
  write_text(fs::path(dir) / "tokenizer.json", "{}");
  write_model(a, dir, HfWriteOptions{});
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.insert(e.path().filename().string());
  CHECK(files == std::set<std::string>{"config.json", "model.safetensors", "tokenizer.json"});
  b.init(1);
  b.load(dir);
  CHECK(differences(a, b) == 0);
}

TEST_CASE("an export refuses a directory that holds anything but an earlier export", "[hf_dir]") {
  Cpu cpu;
  Model a(model_preset("tiny"), *cpu.be, cpu.pool);
  a.init(2);
  const std::string dir = fresh_dir("foreign");
  fs::create_directories(dir);
  write_text(fs::path(dir) / "notes.txt", "mine");
  CHECK_THROWS_WITH(a.save(dir), Catch::Contains("holds 'notes.txt', which an export does not write"));
  CHECK(!fs::exists(fs::path(dir) / "config.json"));
  const std::string file = fresh_dir("a_file");
  write_text(file, "x");
  CHECK_THROWS_WITH(a.save(file), Catch::Contains("is a file: an export goes to an HF model directory"));
}

TEST_CASE("a bad HF directory is refused naming the file and what is wrong", "[hf_dir]") {
  Cpu cpu;
  const ModelSpec spec = model_preset("tiny");
  Model a(spec, *cpu.be, cpu.pool);
  a.init(4);
  const std::string dir = fresh_dir("bad");
  const fs::path config = fs::path(dir) / "config.json";
  auto sharded = [&] {
    fs::remove_all(dir);
    HfWriteOptions o;
    o.max_shard_size = 40000;
    write_model(a, dir, o);
  };

  SECTION("config.json") {
    a.save(dir);
    const json good = read_json(config);
    fs::remove(config);
    CHECK_THROWS_WITH(read_hf_config(dir), Catch::Contains("config.json' is missing"));
    write_text(config, "{\"model_type\": \"gpt2\",");
    CHECK_THROWS_WITH(read_hf_config(dir), Catch::Contains("config.json' is not valid JSON"));
    json c = good;
    c.erase("model_type");
    write_text(config, c.dump());
    CHECK_THROWS_WITH(read_hf_config(dir), Catch::Contains("has no \"model_type\" string"));
    c["model_type"] = "mamba";
    write_text(config, c.dump());
    CHECK_THROWS_WITH(read_hf_config(dir), Catch::Contains("model_type 'mamba' is not a family shardlab implements") &&
                                                Catch::Contains("gpt2"));
    c = good;
    c.erase("n_layer");
    write_text(config, c.dump());
    CHECK_THROWS_WITH(read_hf_config(dir), Catch::Contains("config.json': missing n_layer"));
  }
  SECTION("no weights") {
    a.save(dir);
    fs::remove(fs::path(dir) / "model.safetensors");
    CHECK_THROWS_WITH(HfWeights(dir), Catch::Contains("has neither model.safetensors nor model.safetensors.index.json"));
  }
  SECTION("an index naming a missing shard") {
    sharded();
    fs::remove(fs::path(dir) / "model-00002-of-00004.safetensors");
    CHECK_THROWS_WITH(HfWeights(dir),
                      Catch::Contains("names the shard 'model-00002-of-00004.safetensors'") && Catch::Contains("which is missing"));
  }
  SECTION("an index without a weight_map, or one naming a shard outside the directory") {
    sharded();
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    json j = read_json(index);
    write_text(index, json{{"metadata", j["metadata"]}}.dump());
    CHECK_THROWS_WITH(HfWeights(dir), Catch::Contains("has no \"weight_map\" object"));
    j["weight_map"]["wte.weight"] = "../elsewhere.safetensors";
    write_text(index, j.dump());
    CHECK_THROWS_WITH(HfWeights(dir), Catch::Contains("tensor 'wte.weight' is in '../elsewhere.safetensors'"));
  }
  SECTION("a missing tensor, and one the index puts in the wrong shard") {
    sharded();
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    json j = read_json(index);
    json k = j;
    k["weight_map"].erase("h.1.ln_2.bias");
    write_text(index, k.dump());
    Model b(spec, *cpu.be, cpu.pool);
    CHECK_THROWS_WITH(b.load(dir), Catch::Contains("model.safetensors.index.json' has no tensor 'h.1.ln_2.bias'"));
    j["weight_map"]["wte.weight"] = "model-00004-of-00004.safetensors";
    write_text(index, j.dump());
    CHECK_THROWS_WITH(b.load(dir), Catch::Contains("puts tensor 'wte.weight' in '") &&
                                       Catch::Contains("model-00004-of-00004.safetensors', which has no such tensor"));
  }
  SECTION("a misshapen tensor") {
    ModelSpec wide = spec;
    wide.dim = 64;
    Model w(wide, *cpu.be, cpu.pool);
    w.init(1);
    HfWriteOptions o;
    o.max_shard_size = 40000;
    write_model(w, dir, o);
    Model b(spec, *cpu.be, cpu.pool);
    CHECK_THROWS_WITH(b.load(dir), Catch::Contains("model-00001-of-") &&
                                       Catch::Contains("tensor 'wte.weight' has shape (256, 64), the model expects (256, 32)"));
  }
  SECTION("a tensor of a dtype shardlab does not read") {
    a.save(dir);
    const fs::path file = fs::path(dir) / "model.safetensors";
    const std::string header = R"({"wte.weight":{"dtype":"I32","shape":[256,32],"data_offsets":[0,32768]}})";
    std::ofstream f(file, std::ios::binary | std::ios::trunc);
    const uint64_t len = header.size();
    f.write(reinterpret_cast<const char*>(&len), 8);
    f << header << std::string(32768, '\0');
    f.close();
    Model b(spec, *cpu.be, cpu.pool);
    CHECK_THROWS_WITH(b.load(dir), Catch::Contains("model.safetensors': tensor 'wte.weight' is I32; shardlab reads F32, "
                                                   "BF16 and F16"));
  }
  fs::remove_all(dir);
}
