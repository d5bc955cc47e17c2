#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "src/model/model.hpp"

using namespace shardlab;
namespace fs = std::filesystem;

namespace {
std::string tmp_path(const std::string& name) { return (fs::temp_directory_path() / ("shardlab_test_" + name)).string(); }

void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  uint64_t len = header.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f << header;
  std::string data(data_bytes, '\0');
  f << data;
}
}  // namespace

TEST_CASE("an HF-named model round-trips through safetensors in f32, bf16 and f16", "[safetensors]") {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  ModelSpec spec = model_preset("tiny");
  Model a(spec, *be, pool), b(spec, *be, pool);
  a.init(3);
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    std::string path = tmp_path(std::string("roundtrip_") + dtype_name(t) + ".safetensors");
    a.save(path, t);
    SafetensorsReader r(path);
    CHECK(r.has("wte.weight"));
    CHECK(r.has("h.1.mlp.c_proj.bias"));
    CHECK(r.entry("h.0.attn.c_attn.weight").shape == std::vector<int64_t>{spec.dim, 3 * spec.dim});
    CHECK(r.entry("wte.weight").dtype == t);
    b.load(path);
    int diffs = 0;
    for (size_t u = 0; u < a.num_units(); ++u) {
      auto pa = a.unit_params(u).span<float>(), pb = b.unit_params(u).span<float>();
      for (size_t i = 0; i < pa.size(); ++i) {
        float want = pa[i];
        if (t == DType::bf16) want = bf16_bits_to_f32(f32_to_bf16_bits(want));
        if (t == DType::f16) want = f16_bits_to_f32(f32_to_f16_bits(want));
        diffs += pb[i] != want;
      }
    }
    CHECK(diffs == 0);
    fs::remove(path);
  }
}

TEST_CASE("bad safetensors files fail with a message naming the problem", "[safetensors]") {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  ModelSpec spec = model_preset("tiny");
  Model m(spec, *be, pool);
  m.init(1);
  std::string good = tmp_path("good.safetensors");
  m.save(good);
  auto size = fs::file_size(good);

  std::string truncated = tmp_path("truncated.safetensors");
  fs::copy_file(good, truncated, fs::copy_options::overwrite_existing);
  fs::resize_file(truncated, size - 100);
  CHECK_THROWS_WITH(SafetensorsReader(truncated), Catch::Contains("is truncated or corrupt"));

  std::string tiny = tmp_path("tiny.safetensors");
  fs::copy_file(good, tiny, fs::copy_options::overwrite_existing);
  fs::resize_file(tiny, 5);
  CHECK_THROWS_WITH(SafetensorsReader(tiny), Catch::Contains("too short for a safetensors header"));

  std::string huge = tmp_path("huge_header.safetensors");
  {
    std::ofstream f(huge, std::ios::binary | std::ios::trunc);
    uint64_t len = 1ull << 40;  // a header claiming a terabyte: must not be allocated
    f.write(reinterpret_cast<const char*>(&len), 8);
    f << "{}";
  }
  CHECK_THROWS_WITH(SafetensorsReader(huge), Catch::Contains("bad header"));

  std::string notjson = tmp_path("notjson.safetensors");
  write_raw(notjson, "{\"a\": [1, 2", 0);
  CHECK_THROWS_WITH(SafetensorsReader(notjson), Catch::Contains("not valid JSON"));

  std::string lying = tmp_path("lying.safetensors");
  write_raw(lying, R"({"x": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 60]}})", 64);
  CHECK_THROWS_WITH(SafetensorsReader(lying), Catch::Contains("needs 64 bytes but its offsets give 60"));

  std::string overflow = tmp_path("overflow.safetensors");
  write_raw(overflow,
            R"({"x": {"dtype": "F32", "shape": [4294967296, 4294967296, 4096], "data_offsets": [0, 64]}})", 64);
  CHECK_THROWS_WITH(SafetensorsReader(overflow), Catch::Contains("larger than the file"));

  std::string ints = tmp_path("ints.safetensors");
  write_raw(ints, R"({"x": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}})", 16);
  SafetensorsReader ri(ints);  // other dtypes may be present (HF mask buffers) ...
  std::vector<float> two(2);
  CHECK_THROWS_WITH(ri.read_f32("x", two), Catch::Contains("tensor 'x' is I64"));  // ... but are not read

  // A file of another architecture: a shape mismatch names the tensor and both shapes.
  ModelSpec wider = spec;
  wider.dim = 64;
  Model w(wider, *be, pool);
  CHECK_THROWS_WITH(w.load(good), Catch::Contains("tensor 'wte.weight' has shape (256, 32), the model expects (256, 64)"));
  ModelSpec deeper = spec;
  deeper.layers = 3;
  Model d(deeper, *be, pool);
  CHECK_THROWS_WITH(d.load(good), Catch::Contains("has no tensor 'h.2.ln_1.weight'"));
  CHECK_THROWS_WITH(m.load(tmp_path("does_not_exist.safetensors")), Catch::Contains("cannot open safetensors file"));
  for (const auto& p : {good, truncated, tiny, huge, notjson, lying, overflow, ints}) fs::remove(p);
}
