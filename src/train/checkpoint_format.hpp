// checkpoint_format.hpp — the on-disk checkpoint format (see checkpoint.hpp): manifest parsing and
// validation, checked reads of the per-rank files, and the helpers save and load share.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/check.hpp"
#include "src/core/dtype.hpp"
#include "src/core/hash.hpp"

namespace shardlab {

inline constexpr const char* kCheckpointFormat = "shardlab.checkpoint/1";

// Parses and validates a manifest's structure (types, ranges, file names, a sane model spec);
// throws InputError naming `origin`. Nothing is allocated from the sizes it claims.
nlohmann::json parse_manifest(const std::string& text, const std::string& origin);
nlohmann::json read_manifest(const std::filesystem::path& dir);  // dir/manifest.json, parsed and validated

// The newest complete checkpoint (a step_* directory with a manifest) under dir, or "".
std::string latest_checkpoint(const std::string& dir);
// Writes a consolidated HF-named safetensors file, one tensor in memory at a time.
void export_checkpoint(const std::string& path, const std::string& out, DType dtype = DType::f32);

namespace fs = std::filesystem;

// The files of a checkpoint, checked once each against the manifest's size and checksum.
class CheckpointFiles {
 public:
  CheckpointFiles(fs::path dir, const nlohmann::json& files) : dir_(std::move(dir)) {
    for (const auto& f : files) by_rank_[f.at("rank").get<int>()] = f;
  }
  // Checks that n floats at byte offset `off` lie inside rank r's (verified) file.
  void check_range(int r, uint64_t off, uint64_t n, const std::string& tensor) {
    fs::path p = path_of(r, tensor);
    verify(r, p);
    uint64_t size = by_rank_[r].at("bytes").get<uint64_t>();
    SHARD_REQUIRE(off <= size && n <= (size - off) / sizeof(float), "'{}': tensor '{}' needs bytes [{}, {}) of a {}-byte file",
                  p.string(), tensor, off, off + n * sizeof(float), size);
  }
  // Reads n floats at byte offset `off` of rank r's file.
  void read(int r, uint64_t off, float* out, size_t n, const std::string& tensor) {
    check_range(r, off, n, tensor);
    fs::path p = path_of(r, tensor);
    std::ifstream f(p, std::ios::binary);
    f.seekg(static_cast<std::streamoff>(off));
    f.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(n * sizeof(float)));
    SHARD_REQUIRE(f.good(), "'{}' is truncated: tensor '{}' needs bytes [{}, {})", p.string(), tensor, off,
                  off + n * sizeof(float));
  }

 private:
  fs::path path_of(int r, const std::string& tensor) const {
    auto it = by_rank_.find(r);
    SHARD_REQUIRE(it != by_rank_.end(), "manifest names rank {}'s file for tensor '{}' but does not list it", r, tensor);
    return dir_ / it->second.at("file").get<std::string>();
  }
  void verify(int r, const fs::path& p) {
    if (verified_.count(r)) return;
    const auto& e = by_rank_[r];
    std::error_code ec;
    uint64_t size = fs::file_size(p, ec);
    SHARD_REQUIRE(!ec, "checkpoint file '{}' is missing: {}", p.string(), ec.message());
    SHARD_REQUIRE(size == e.at("bytes").get<uint64_t>(), "'{}' is truncated or corrupt: {} bytes, the manifest says {}",
                  p.string(), size, e.at("bytes").get<uint64_t>());
    std::ifstream f(p, std::ios::binary);
    std::vector<char> buf(1 << 20);
    uint64_t h = kFnv1a64Basis;
    while (f) {
      f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      h = fnv1a64(std::string_view(buf.data(), static_cast<size_t>(f.gcount())), h);
    }
    std::string got = fmt::format("fnv1a64:{:016x}", h);
    SHARD_REQUIRE(got == e.at("checksum").get<std::string>(), "'{}' is corrupt: checksum {} but the manifest says {}",
                  p.string(), got, e.at("checksum").get<std::string>());
    verified_.insert({r, true});
  }

  fs::path dir_;
  std::map<int, nlohmann::json> by_rank_;
  std::map<int, bool> verified_;
};

}  // namespace shardlab
