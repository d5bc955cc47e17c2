#include "src/data/data.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>

#include "src/core/check.hpp"
#include "src/core/rng.hpp"
#include "src/data/tokenizer.hpp"

namespace shardlab {

void require_regular_file(const std::string& path);  // token_files.cpp

namespace {
// A text data file's bytes, whole.
std::string read_text_file(const std::string& path) {
  require_regular_file(path);
  std::ifstream f(path, std::ios::binary);
  SHARD_REQUIRE(f.good(), "cannot open data file '{}'", path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
}  // namespace

void write_llmc_bin(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab) {
  SHARD_REQUIRE(tokens.size() <= static_cast<size_t>(INT32_MAX), "'{}': {} tokens are more than an llm.c token file "
                "holds (2^31 - 1)", path, tokens.size());
  auto bad = std::find_if(tokens.begin(), tokens.end(), [&](int32_t t) { return t < 0 || t >= vocab; });
  SHARD_REQUIRE(bad == tokens.end(), "'{}': token {} at position {} does not fit the vocabulary of {}", path,
                bad == tokens.end() ? 0 : *bad, bad - tokens.begin(), vocab);
  const bool wide = vocab > 65536;
  int32_t header[256] = {};
  header[0] = wide ? 20240801 : 20240520;  // llm.c's magic and version of each width (token_files.cpp)
  header[1] = wide ? 7 : 1;
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
  f.close();  // an error only the close reports (a quota, a network file system) fails here too
  SHARD_REQUIRE(!f.fail(), "writing token file '{}' failed", path);
}

TokenStream load_text_bytes(const std::string& path) {
  const std::string bytes = read_text_file(path);
  return {std::vector<int32_t>(reinterpret_cast<const unsigned char*>(bytes.data()),
                               reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size()), path};
}

TokenStream load_text_tokens(const std::string& path, const Tokenizer& tokenizer) {
  return {tokenizer.encode(read_text_file(path)), path};
}

TokenStream synthetic_stream(int64_t vocab, int64_t length) {
  SHARD_REQUIRE(vocab >= 8, "synthetic data needs a vocabulary of at least 8 tokens, got {}", vocab);
  // Fixed seed: the embedded data set is the same for every run and every --seed.
  Rng succ(20240520, "synthetic successors"), walk(20240520, "synthetic walk");
  const double cumulative[4] = {0.55, 0.80, 0.95, 1.0};
  std::vector<int32_t> tokens(static_cast<size_t>(length));
  int64_t tok = 0;
  for (int64_t i = 0; i < length; ++i) {
    tokens[static_cast<size_t>(i)] = static_cast<int32_t>(tok);
    float u = walk.uniform(static_cast<uint64_t>(i));
    int k = 0;
    while (k < 3 && u >= cumulative[k]) ++k;
    tok = succ.bits(static_cast<uint64_t>(tok * 4 + k))[0] % static_cast<uint32_t>(vocab);
  }
  return {std::move(tokens), "synthetic"};
}

TokenStream zero_stream(int64_t length, std::string source) {
  return {std::vector<int32_t>(static_cast<size_t>(length), 0), std::move(source)};
}

TokenStream load_tokens(const std::string& what, int64_t vocab, const Tokenizer* tokenizer) {
  TokenStream s;
  if (what == "synthetic") {
    s = synthetic_stream(vocab);
  } else {
    const std::vector<std::string> paths = data_paths(what);
    for (const std::string& p : paths) {
      const TokenStream one = !is_text_source(p) ? load_llmc_bin(p)
                              : tokenizer        ? load_text_tokens(p, *tokenizer)
                                                 : load_text_bytes(p);
      if (paths.size() == 1) s = one;
      else s.append_stream(one);
    }
    s.source = what;
  }
  uint32_t bad = 0;
  const int64_t at = s.first_outside(vocab, &bad);
  SHARD_REQUIRE(at < 0, "'{}': token {} at position {} does not fit the model's vocabulary of {}", s.source, bad, at,
                vocab);
  return s;
}

TokenStream split_tail(TokenStream& s, double fraction) {
  SHARD_REQUIRE(fraction > 0 && fraction < 1, "--val-fraction {}: expected a fraction between 0 and 1 (exclusive)",
                fraction);
  const int64_t n = s.size();
  const int64_t tail = std::llround(fraction * static_cast<double>(n));
  SHARD_REQUIRE(tail >= 1 && tail < n, "--val-fraction {} of the {} tokens of '{}' leaves {} for validation and {} for "
                "training: both need tokens", fraction, n, s.source, tail, n - tail);
  TokenStream val = s.slice(n - tail, n, fmt::format("{} (last {} tokens)", s.source, tail));
  s = s.slice(0, n - tail, fmt::format("{} (first {} tokens)", s.source, n - tail));
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
  const int64_t n = stream.size();
  num_sequences_ = n >= T_ + 1 ? (n - 1) / T_ : 0;
  SHARD_REQUIRE(num_sequences_ >= 1, "'{}' holds {} tokens, too few for one sequence of {} (+1 target)",
                stream.source, n, T_);
}

void BatchLoader::fill(int64_t step, int64_t first, int64_t count, int32_t* inputs, int32_t* targets) const {
  SHARD_CHECK(first >= 0 && first + count <= B_, "batch slice [{}, {}) of a global batch of {}", first,
              first + count, B_);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t j = sequence_at(step * B_ + first + i);
    stream_.read(j * T_, T_, inputs + i * T_);
    stream_.read(j * T_ + 1, T_, targets + i * T_);
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
