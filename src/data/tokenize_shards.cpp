// tokenize_shards.cpp — text files to llm.c token shards (tokenize_shards.hpp).
#include "src/data/tokenize_shards.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "src/core/check.hpp"
#include "src/core/units.hpp"
#include "src/data/data.hpp"

namespace shardlab {
namespace fs = std::filesystem;

void TokenizeConfig::validate() const {
  SHARD_REQUIRE(!inputs.empty(), "tokenize: no input files");
  SHARD_REQUIRE(!out_dir.empty(), "tokenize needs --out DIR");
  SHARD_REQUIRE(!prefix.empty() && prefix.find('/') == std::string::npos && prefix[0] != '.',
                "--prefix '{}': expected a file-name prefix (no '/', not starting with '.')", prefix);
  SHARD_REQUIRE(shard_tokens >= 1 && shard_tokens <= INT32_MAX,
                "--shard-tokens {}: expected 1 to 2^31 - 1 (what an llm.c header counts)", shard_tokens);
  SHARD_REQUIRE(val_tokens >= 0 && val_tokens <= INT32_MAX, "--val-tokens {}: expected 0 to 2^31 - 1", val_tokens);
  SHARD_REQUIRE(vocab >= 1 && eot < vocab, "tokenize: end-of-text id {} outside the vocabulary of {}", eot, vocab);
  SHARD_REQUIRE(block_bytes >= 1, "tokenize: a read block of {} bytes", block_bytes);
  for (const std::string& in : inputs)
    SHARD_REQUIRE(in.size() < 4 || in.compare(in.size() - 4, 4, ".bin") != 0,
                  "tokenize: '{}' is an llm.c token file already (.bin); give text files", in);
}

size_t last_safe_cut(std::string_view text, size_t limit, size_t from) {
  limit = std::min(limit, text.size());
  auto letter = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); };
  auto ink = [](char c) { return c > ' ' && c < 0x7f; };  // ASCII, neither space nor control
  for (size_t i = limit; i >= std::max<size_t>(from, 3); --i)
    if (text[i - 2] == '\n' && letter(text[i - 1]) && ink(text[i - 3])) return i - 1;
  return 0;
}

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string shard_name(const TokenizeConfig& c, bool val, int index) {
  return fmt::format("{}_{}_{:06d}.bin", c.prefix, val ? "val" : "train", index);
}

// Whether `name` is PREFIX_val_NNNNNN.bin or PREFIX_train_NNNNNN.bin (six digits).
bool is_our_shard(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix + "_", 0) != 0) return false;
  std::string rest = name.substr(prefix.size() + 1);
  for (const char* kind : {"val_", "train_"})
    if (rest.rfind(kind, 0) == 0) {
      rest = rest.substr(std::string(kind).size());
      return rest.size() == 10 && rest.compare(6, 4, ".bin") == 0 &&
             std::all_of(rest.begin(), rest.begin() + 6, [](char ch) { return ch >= '0' && ch <= '9'; });
    }
  return false;
}

// The prefix's shards already in the directory: refused by name, or removed under overwrite.
void clear_earlier(const TokenizeConfig& c) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(c.out_dir, ec))
    if (is_our_shard(e.path().filename().string(), c.prefix)) found.push_back(e.path());
  std::sort(found.begin(), found.end());
  SHARD_REQUIRE(found.empty() || c.overwrite, "tokenize --out {}: it holds {} shard(s) of --prefix {} already ({}{}): "
                "give another --out or --prefix, or --overwrite to replace them", c.out_dir, found.size(), c.prefix,
                found.front().filename().string(), found.size() > 1 ? ", ..." : "");
  for (const fs::path& p : found) fs::remove(p);
}

class ShardWriter {
 public:
  ShardWriter(const TokenizeConfig& c, TokenizeResult& r) : c_(c), r_(r) {}
  void add(const std::vector<int32_t>& ids) {
    for (int32_t id : ids) {
      SHARD_REQUIRE(id >= 0 && id < c_.vocab, "tokenize: id {} outside the vocabulary of {}", id, c_.vocab);
      pending_.push_back(id);
      if (static_cast<int64_t>(pending_.size()) == capacity()) flush();
    }
  }
  void finish() {
    SHARD_REQUIRE(!in_val() || c_.val_tokens == 0,
                  "tokenize --val-tokens {}: the inputs hold {} tokens; the validation shard would take them all "
                  "(nothing left to train on)", c_.val_tokens, r_.tokens + static_cast<int64_t>(pending_.size()));
    if (!pending_.empty()) flush();
    SHARD_REQUIRE(r_.tokens > r_.val_tokens, "tokenize: the inputs hold no tokens past the validation shard's {}",
                  r_.val_tokens);
  }
  int shards() const { return static_cast<int>(r_.shards.size()); }

 private:
  bool in_val() const { return c_.val_tokens > 0 && r_.shards.empty(); }
  int64_t capacity() const { return in_val() ? c_.val_tokens : c_.shard_tokens; }
  void flush() {
    const bool val = in_val();
    // llm.c's numbering: the validation shard 0, the train shards from 1 (with or without one).
    const fs::path final_path = fs::path(c_.out_dir) / shard_name(c_, val, val ? 0 : ++trained_);
    const fs::path tmp = fs::path(c_.out_dir) / fmt::format(".{}.tmp", final_path.filename().string());
    try {
      write_llmc_bin(tmp.string(), pending_, c_.vocab);
      fs::rename(tmp, final_path);
    } catch (...) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw;
    }
    r_.tokens += static_cast<int64_t>(pending_.size());
    if (val) r_.val_tokens = static_cast<int64_t>(pending_.size());
    r_.shards.push_back(final_path.string());
    pending_.clear();
  }

  const TokenizeConfig& c_;
  TokenizeResult& r_;
  std::vector<int32_t> pending_;
  int trained_ = 0;  // train shards written
};

uint64_t total_bytes(const std::vector<std::string>& inputs) {
  uint64_t all = 0;
  for (const std::string& in : inputs) {
    std::error_code ec;
    SHARD_REQUIRE(fs::is_regular_file(in, ec), "tokenize: '{}' is not a readable regular file", in);
    all += fs::file_size(in, ec);
  }
  return all;
}

}  // namespace

namespace {
TokenizeResult tokenize_all(const TokenizeConfig& c, const EncodeFn& encode, std::FILE* progress);
}

TokenizeResult tokenize_to_shards(const TokenizeConfig& c, const EncodeFn& encode, std::FILE* progress) {
  c.validate();
  try {
    return tokenize_all(c, encode, progress);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{} (the shards written under {} before this are an incomplete set: run again, "
                                 "--overwrite replaces them)", e.what(), c.out_dir));
  }
}

namespace {
TokenizeResult tokenize_all(const TokenizeConfig& c, const EncodeFn& encode, std::FILE* progress) {
  const double t0 = now_s();
  const uint64_t all = total_bytes(c.inputs);
  std::error_code ec;
  fs::create_directories(c.out_dir, ec);
  SHARD_REQUIRE(fs::is_directory(c.out_dir), "tokenize --out {}: cannot create the directory: {}", c.out_dir,
                ec.message());
  clear_earlier(c);
  TokenizeResult r;
  ShardWriter out(c, r);
  double next_report = t0 + 10;
  int64_t encoded = 0;
  auto report = [&] {
    if (!progress || now_s() < next_report) return;
    next_report = now_s() + 10;
    const double el = now_s() - t0, frac = all ? double(r.bytes_read) / double(all) : 1.0;
    std::fprintf(progress, "tokenize: %s of %s read (%.0f%%), %lld tokens, %d shard(s) written, %.0f s; about %.0f s "
                 "left (an estimate at this pace)\n", format_bytes(double(r.bytes_read)).c_str(),
                 format_bytes(double(all)).c_str(), 100 * frac, static_cast<long long>(encoded), out.shards(), el,
                 frac > 0 ? el * (1 - frac) / frac : 0.0);
    std::fflush(progress);
  };
  std::string block(static_cast<size_t>(c.whole_files ? 0 : c.block_bytes), '\0');
  for (const std::string& in : c.inputs) {
    std::ifstream f(in, std::ios::binary);
    SHARD_REQUIRE(f.good(), "tokenize: cannot open '{}'", in);
    ++r.documents;
    if (c.eot >= 0) out.add({c.eot}), ++encoded;
    std::string carry;  // text after the last cut, encoded with the next block
    auto put = [&](std::string_view text) {
      const std::vector<int32_t> ids = encode(text);
      encoded += static_cast<int64_t>(ids.size());
      out.add(ids);
    };
    if (c.whole_files) {
      const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      SHARD_REQUIRE(!f.bad(), "tokenize: reading '{}' failed", in);
      r.bytes_read += text.size();
      put(text);
      report();
      continue;
    }
    while (f) {
      f.read(block.data(), static_cast<std::streamsize>(block.size()));
      SHARD_REQUIRE(!f.bad(), "tokenize: reading '{}' failed", in);
      const size_t got = static_cast<size_t>(f.gcount());
      r.bytes_read += got;
      carry.append(block.data(), got);
      // Only the new bytes can hold a new cut (and the two before them: a cut looks back 3).
      const size_t cut = f ? last_safe_cut(carry, carry.size(), carry.size() - got) : carry.size();  // end: all
      if (cut == 0) continue;                                                    // no cut yet: read on
      put(std::string_view(carry).substr(0, cut));
      carry.erase(0, cut);
      report();
    }
    if (!carry.empty()) put(carry);
  }
  out.finish();
  r.seconds = now_s() - t0;
  return r;
}
}  // namespace

}  // namespace shardlab
