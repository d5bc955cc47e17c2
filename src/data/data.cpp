#include "src/data/data.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "src/core/check.hpp"
#include "src/core/hash.hpp"
#include "src/checkpoint/checkpoint_format.hpp"
#include "src/core/rng.hpp"
#include "src/data/tokenizer.hpp"

namespace shardlab {

namespace {
// An ifstream opens a directory without complaint on Linux and fails only on the first read, with
// libstdc++'s "basic_filebuf::underflow" text: name the path before that.
void require_not_directory(const std::string& path) {
  std::error_code ec;
  SHARD_REQUIRE(!std::filesystem::is_directory(path, ec),
                "data file '{}' is a directory (--data and --val-data take a file: an llm.c .bin shard or text)", path);
}

// A text data file's bytes, whole.
std::string read_text_file(const std::string& path) {
  require_not_directory(path);
  std::ifstream f(path, std::ios::binary);
  SHARD_REQUIRE(f.good(), "cannot open data file '{}'", path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

constexpr int32_t kMagic16 = 20240520, kVersion16 = 1;  // llm.c's "gpt-2" header: uint16 tokens
constexpr int32_t kMagic32 = 20240801, kVersion32 = 7;  // llm.c's "llama-3" header: uint32 tokens

template <class T>
std::vector<int32_t> read_tokens(std::ifstream& f, const std::string& path, int64_t count) {
  std::vector<T> raw(static_cast<size_t>(count));
  f.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(sizeof(T) * raw.size()));
  SHARD_REQUIRE(f.good(), "'{}': reading {} tokens failed", path, count);
  std::vector<int32_t> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if constexpr (sizeof(T) == 4)
      SHARD_REQUIRE(raw[i] <= static_cast<uint32_t>(INT32_MAX), "'{}': token {} at position {} is past 2^31 - 1",
                    path, raw[i], i);
    out[i] = static_cast<int32_t>(raw[i]);
  }
  return out;
}
}  // namespace

TokenStream load_llmc_bin(const std::string& path) {
  require_not_directory(path);
  std::ifstream f(path, std::ios::binary);
  SHARD_REQUIRE(f.good(), "cannot open token file '{}'", path);
  std::error_code ec;
  uint64_t size = std::filesystem::file_size(path, ec);
  SHARD_REQUIRE(!ec && size >= 1024, "'{}' is too short for an llm.c token file header (1024 bytes)", path);
  int32_t header[256];
  f.read(reinterpret_cast<char*>(header), sizeof(header));
  const int32_t magic = header[0], version = header[1];
  SHARD_REQUIRE(magic == kMagic16 || magic == kMagic32, "'{}' is not an llm.c token file: magic {} (expected {}), nor "
                "{} (the uint32 form)", path, magic, kMagic16, kMagic32);
  const bool wide = magic == kMagic32;
  SHARD_REQUIRE(version == (wide ? kVersion32 : kVersion16), "'{}': llm.c token file version {} with magic {} "
                "(shardlab reads magic {} version {}: uint16 tokens, and magic {} version {}: uint32 tokens)", path,
                version, magic, kMagic16, kVersion16, kMagic32, kVersion32);
  const int64_t count = header[2];
  const uint64_t width = wide ? 4 : 2;
  SHARD_REQUIRE(count >= 0 && 1024 + width * static_cast<uint64_t>(count) <= size,
                "'{}' is truncated: header promises {} tokens, the file holds {}", path, count, (size - 1024) / width);
  return {wide ? read_tokens<uint32_t>(f, path, count) : read_tokens<uint16_t>(f, path, count), path};
}

void write_llmc_bin(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab) {
  SHARD_REQUIRE(tokens.size() <= static_cast<size_t>(INT32_MAX), "'{}': {} tokens are more than an llm.c token file "
                "holds (2^31 - 1)", path, tokens.size());
  auto bad = std::find_if(tokens.begin(), tokens.end(), [&](int32_t t) { return t < 0 || t >= vocab; });
  SHARD_REQUIRE(bad == tokens.end(), "'{}': token {} at position {} does not fit the vocabulary of {}", path,
                bad == tokens.end() ? 0 : *bad, bad - tokens.begin(), vocab);
  const bool wide = vocab > 65536;
  int32_t header[256] = {};
  header[0] = wide ? kMagic32 : kMagic16;
  header[1] = wide ? kVersion32 : kVersion16;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  SHARD_REQUIRE(f.good(), "cannot write token file '{}'", path);
  f.write(reinterpret_cast<const char*>(header), sizeof(header));
  if (wide) {
    f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(4 * tokens.size()));
  } else {
    const std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
    f.write(reinterpret_cast<const char*>(narrow.data()), static_cast<std::streamsize>(2 * narrow.size()));
  }
  SHARD_REQUIRE(f.good(), "writing token file '{}' failed", path);
}

TokenStream load_text_bytes(const std::string& path) {
  const std::string bytes = read_text_file(path);
  TokenStream s;
  s.source = path;
  s.tokens.reserve(bytes.size());
  for (char c : bytes) s.tokens.push_back(static_cast<unsigned char>(c));
  return s;
}

TokenStream load_text_tokens(const std::string& path, const Tokenizer& tokenizer) {
  return {tokenizer.encode(read_text_file(path)), path};
}

TokenStream synthetic_stream(int64_t vocab, int64_t length) {
  SHARD_REQUIRE(vocab >= 8, "synthetic data needs a vocabulary of at least 8 tokens, got {}", vocab);
  // Fixed seed: the embedded data set is the same for every run and every --seed.
  Rng succ(20240520, "synthetic successors"), walk(20240520, "synthetic walk");
  const double cumulative[4] = {0.55, 0.80, 0.95, 1.0};
  TokenStream s;
  s.source = "synthetic";
  s.tokens.resize(static_cast<size_t>(length));
  int64_t tok = 0;
  for (int64_t i = 0; i < length; ++i) {
    s.tokens[static_cast<size_t>(i)] = static_cast<int32_t>(tok);
    float u = walk.uniform(static_cast<uint64_t>(i));
    int k = 0;
    while (k < 3 && u >= cumulative[k]) ++k;
    tok = succ.bits(static_cast<uint64_t>(tok * 4 + k))[0] % static_cast<uint32_t>(vocab);
  }
  return s;
}

TokenStream zero_stream(int64_t length, std::string source) {
  TokenStream s;
  s.tokens.assign(static_cast<size_t>(length), 0);
  s.source = std::move(source);
  return s;
}

DataSource describe_source(const std::string& what) {
  if (what == "synthetic") return {what, 0, ""};
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(what, ec);
  SHARD_REQUIRE(!ec, "cannot read data file '{}': {}", what, ec.message());
  std::ifstream f(what, std::ios::binary);
  SHARD_REQUIRE(f.good(), "cannot open data file '{}'", what);
  constexpr uint64_t kMiB = 1 << 20;
  std::string head(static_cast<size_t>(std::min(size, kMiB)), '\0');
  std::string tail(static_cast<size_t>(size > kMiB ? std::min(size - kMiB, kMiB) : 0), '\0');
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  f.seekg(static_cast<std::streamoff>(size - tail.size()));
  f.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  SHARD_REQUIRE(f.good(), "reading data file '{}' failed", what);
  const std::string size_text = std::to_string(size);
  const uint64_t h = fnv1a64(tail, fnv1a64(head, fnv1a64(size_text)));
  return {what, size, fnv1a64_text(h)};
}

bool is_text_source(const std::string& what) {
  return what != "synthetic" && !(what.size() >= 4 && what.compare(what.size() - 4, 4, ".bin") == 0);
}

TokenStream load_tokens(const std::string& what, int64_t vocab, const Tokenizer* tokenizer) {
  TokenStream s;
  if (what == "synthetic") {
    s = synthetic_stream(vocab);
  } else {
    s = !is_text_source(what) ? load_llmc_bin(what) : tokenizer ? load_text_tokens(what, *tokenizer) : load_text_bytes(what);
  }
  auto bad = std::find_if(s.tokens.begin(), s.tokens.end(), [&](int32_t t) { return t < 0 || t >= vocab; });
  SHARD_REQUIRE(bad == s.tokens.end(), "'{}': token {} at position {} does not fit the model's vocabulary of {}",
                s.source, bad == s.tokens.end() ? 0 : *bad, bad - s.tokens.begin(), vocab);
  return s;
}

TokenStream split_tail(TokenStream& s, double fraction) {
  SHARD_REQUIRE(fraction > 0 && fraction < 1, "--val-fraction {}: expected a fraction between 0 and 1 (exclusive)",
                fraction);
  const int64_t n = static_cast<int64_t>(s.tokens.size());
  const int64_t tail = std::llround(fraction * static_cast<double>(n));
  SHARD_REQUIRE(tail >= 1 && tail < n, "--val-fraction {} of the {} tokens of '{}' leaves {} for validation and {} for "
                "training: both need tokens", fraction, n, s.source, tail, n - tail);
  TokenStream val;
  val.tokens.assign(s.tokens.end() - tail, s.tokens.end());
  val.source = fmt::format("{} (last {} tokens)", s.source, tail);
  s.tokens.resize(static_cast<size_t>(n - tail));
  s.source = fmt::format("{} (first {} tokens)", s.source, n - tail);
  return val;
}

std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t n) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = i;
  const Rng rng(seed, fmt::format("data shuffle epoch {}", epoch));
  for (int64_t i = n - 1; i > 0; --i) {  // Fisher-Yates; 64 random bits per draw, so the modulo bias is < 2^-40
    auto b = rng.bits(static_cast<uint64_t>(i));
    uint64_t r = ((static_cast<uint64_t>(b[0]) << 32) | b[1]) % static_cast<uint64_t>(i + 1);
    std::swap(perm[static_cast<size_t>(i)], perm[r]);
  }
  return perm;
}

BatchLoader::BatchLoader(const TokenStream& stream, int64_t seq_len, int64_t global_batch, ShuffleConfig shuffle)
    : stream_(stream), T_(seq_len), B_(global_batch), shuffle_(shuffle) {
  SHARD_REQUIRE(T_ >= 1 && B_ >= 1, "sequence length {} and batch {} must be positive", T_, B_);
  int64_t n = static_cast<int64_t>(stream.tokens.size());
  num_sequences_ = n >= T_ + 1 ? (n - 1) / T_ : 0;
  SHARD_REQUIRE(num_sequences_ >= 1, "'{}' holds {} tokens, too few for one sequence of {} (+1 target)",
                stream.source, n, T_);
}

void BatchLoader::fill(int64_t step, int64_t first, int64_t count, int32_t* inputs, int32_t* targets) const {
  SHARD_CHECK(first >= 0 && first + count <= B_, "batch slice [{}, {}) of a global batch of {}", first,
              first + count, B_);
  for (int64_t i = 0; i < count; ++i) {
    int64_t j = sequence_at(step * B_ + first + i);
    const int32_t* seq = stream_.tokens.data() + j * T_;
    std::memcpy(inputs + i * T_, seq, static_cast<size_t>(T_) * sizeof(int32_t));
    std::memcpy(targets + i * T_, seq + 1, static_cast<size_t>(T_) * sizeof(int32_t));
  }
}

}  // namespace shardlab

namespace shardlab {

int64_t BatchLoader::sequence_at(int64_t p) const {
  if (!shuffle_.on) return p % num_sequences_;
  const int64_t epoch = p / num_sequences_;
  if (epoch != perm_epoch_) {
    perm_ = epoch_permutation(shuffle_.seed, epoch, num_sequences_);
    perm_epoch_ = epoch;
  }
  return perm_[static_cast<size_t>(p % num_sequences_)];
}

}  // namespace shardlab
