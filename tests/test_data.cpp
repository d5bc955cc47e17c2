#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "src/core/check.hpp"
#include "src/checkpoint/checkpoint_format.hpp"
#include "src/data/data.hpp"
#include "src/data/pretokenize.hpp"
#include "src/data/tokenize_shards.hpp"
#include "src/data/tokenizer.hpp"

using namespace shardlab;
namespace fs = std::filesystem;

namespace {
std::string tmp_path(const std::string& name) { return (fs::temp_directory_path() / ("shardlab_test_" + name)).string(); }

void write_bin(const std::string& path, int32_t magic, int32_t version, int32_t count, const std::vector<uint16_t>& toks) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic, header[1] = version, header[2] = count;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(header.data()), 1024);
  f.write(reinterpret_cast<const char*>(toks.data()), static_cast<std::streamsize>(2 * toks.size()));
}

std::vector<int32_t> counting(int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}
}  // namespace

TEST_CASE("llm.c token files load, and bad ones are named", "[data]") {
  std::vector<uint16_t> toks = {5, 50256, 7, 1, 2, 3};
  std::string ok = tmp_path("ok.bin");
  write_bin(ok, 20240520, 1, 6, toks);
  TokenStream s = load_llmc_bin(ok);
  CHECK(s.to_vector() == std::vector<int32_t>{5, 50256, 7, 1, 2, 3});
  CHECK(s.mapped_parts() == 1);
  CHECK_THROWS_WITH(load_tokens(ok, 50000), Catch::Contains("token 50256 at position 1 does not fit the model's vocabulary of 50000"));
  std::string magic = tmp_path("magic.bin");
  write_bin(magic, 1234, 1, 6, toks);
  CHECK_THROWS_WITH(load_llmc_bin(magic), Catch::Contains("magic 1234 (expected 20240520)"));
  std::string version = tmp_path("version.bin");
  write_bin(version, 20240520, 2, 6, toks);
  CHECK_THROWS_WITH(load_llmc_bin(version), Catch::Contains("version 2 with magic 20240520"));
  std::string truncated = tmp_path("truncated.bin");
  write_bin(truncated, 20240520, 1, 600, toks);
  CHECK_THROWS_WITH(load_llmc_bin(truncated), Catch::Contains("is truncated: header promises 600 tokens, the file holds 6"));
  CHECK_THROWS_WITH(load_tokens(tmp_path("missing.bin"), 10), Catch::Contains("cannot open token file"));
  for (auto& p : {ok, magic, version, truncated}) fs::remove(p);
}

TEST_CASE("any file reads as bytes", "[data]") {
  std::string path = tmp_path("text.txt");
  { std::ofstream(path, std::ios::binary) << "hi\xff"; }
  TokenStream s = load_tokens(path, 256);
  CHECK(s.to_vector() == std::vector<int32_t>{'h', 'i', 255});
  CHECK_THROWS_WITH(load_tokens(path, 128), Catch::Contains("token 255 at position 2"));
  fs::remove(path);
}

TEST_CASE("the synthetic stream is fixed, in vocabulary, and predictable", "[data]") {
  const std::vector<int32_t> a = synthetic_stream(64, 10000).to_vector(), b = synthetic_stream(64, 10000).to_vector();
  CHECK(a == b);
  // Each token is followed by at most four distinct successors: a bigram model can learn it.
  std::map<int32_t, std::map<int32_t, int>> next;
  for (size_t i = 0; i + 1 < a.size(); ++i) {
    REQUIRE(a[i] >= 0);
    REQUIRE(a[i] < 64);
    next[a[i]][a[i + 1]]++;
  }
  for (auto& [tok, succ] : next) CHECK(succ.size() <= 4);
  CHECK(next.size() > 16);  // and it visits much of the vocabulary
}

TEST_CASE("batches follow the documented rule", "[data]") {
  TokenStream s(counting(41), "test");  // 41 tokens, T = 4: (41 - 1) / 4 = 10 sequences
  BatchLoader loader(s, 4, 3);
  CHECK(loader.num_sequences() == 10);
  std::vector<int32_t> in(3 * 4), tgt(3 * 4);
  loader.fill(0, 0, 3, in.data(), tgt.data());
  CHECK(in == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  CHECK(tgt == std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  // Step 3 takes sequences 9, 10 -> 0, 11 -> 1 (wrapping); rank 1 of 3 takes only its slice.
  std::vector<int32_t> one(4), onet(4);
  loader.fill(3, 1, 1, one.data(), onet.data());
  CHECK(one == std::vector<int32_t>{0, 1, 2, 3});
  loader.fill(3, 0, 1, one.data(), onet.data());
  CHECK(one == std::vector<int32_t>{36, 37, 38, 39});
  CHECK(onet == std::vector<int32_t>{37, 38, 39, 40});
  TokenStream small({1, 2, 3}, "short.txt");
  CHECK_THROWS_WITH(BatchLoader(small, 4, 1), Catch::Contains("'short.txt' holds 3 tokens, too few for one sequence of 4"));
}

TEST_CASE("shuffled epochs are permutations of (seed, epoch), and batches run on across epochs", "[data][shuffle]") {
  const int64_t n = 10;
  auto p0 = epoch_permutation(7, 0, n), p1 = epoch_permutation(7, 1, n);
  CHECK(p0 == epoch_permutation(7, 0, n));  // a function of its arguments only
  CHECK(p0 != p1);                          // two epochs differ in order
  CHECK(p0 != epoch_permutation(8, 0, n));  // and seeds differ
  for (const auto& p : {p0, p1}) {
    std::vector<int64_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < n; ++i) CHECK(sorted[static_cast<size_t>(i)] == i);
  }
  TokenStream s(counting(41), "test");  // 10 sequences of T = 4
  BatchLoader loader(s, 4, 3, ShuffleConfig{true, 7});
  // Positions 0..29 (10 steps of 3) are epochs 0, 1 and 2 back to back; step 3 straddles epochs 0 and 1.
  for (int64_t p = 0; p < 30; ++p)
    CHECK(loader.sequence_at(p) == epoch_permutation(7, p / n, n)[static_cast<size_t>(p % n)]);
  std::vector<int32_t> in(3 * 4), tgt(3 * 4);
  loader.fill(3, 0, 3, in.data(), tgt.data());
  for (int64_t i = 0; i < 3; ++i) {
    int64_t j = loader.sequence_at(9 + i);
    CHECK(in[static_cast<size_t>(i * 4)] == j * 4);
    CHECK(tgt[static_cast<size_t>(i * 4 + 3)] == j * 4 + 4);
  }
  // A rank's slice equals the same part of the whole batch (so any world size sees one order).
  std::vector<int32_t> part(4), partt(4);
  loader.fill(3, 2, 1, part.data(), partt.data());
  CHECK(std::equal(part.begin(), part.end(), in.begin() + 8));
}

TEST_CASE("--val-fraction cuts the tail off the training stream", "[data][validation]") {
  TokenStream s(counting(100), "t");
  TokenStream v = split_tail(s, 0.1);
  CHECK(s.size() == 90);
  CHECK(v.size() == 10);
  CHECK(v.to_vector().front() == 90);
  CHECK(s.to_vector().back() == 89);  // no training sequence reaches a validation token
  TokenStream s2 = s;
  CHECK_THROWS_WITH(split_tail(s2, 0.0), Catch::Contains("--val-fraction 0: expected a fraction between 0 and 1"));
  CHECK_THROWS_WITH(split_tail(s2, 1.0), Catch::Contains("--val-fraction 1: expected a fraction between 0 and 1"));
  CHECK_THROWS_WITH(split_tail(s2, 0.001), Catch::Contains("leaves 0 for validation"));
}

TEST_CASE("llm.c's uint32 token files (magic 20240801, version 7) carry ids past 65,535", "[data]") {
  // Written by hand as llm.c's dev/data/data_common.py writes its "llama-3" form.
  const std::vector<uint32_t> wide = {0, 65535, 65536, 128255, 7};
  const std::string path = tmp_path("wide.bin");
  const auto write = [&](int32_t magic, int32_t version, int32_t count) {
    std::vector<int32_t> header(256, 0);
    header[0] = magic, header[1] = version, header[2] = count;
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(header.data()), 1024);
    f.write(reinterpret_cast<const char*>(wide.data()), static_cast<std::streamsize>(4 * wide.size()));
  };
  write(20240801, 7, 5);
  CHECK(load_llmc_bin(path).to_vector() == std::vector<int32_t>{0, 65535, 65536, 128255, 7});
  CHECK(load_tokens(path, 128256).size() == 5);
  CHECK_THROWS_WITH(load_tokens(path, 128000), Catch::Contains("token 128255 at position 3 does not fit the model's "
                                                               "vocabulary of 128000"));
  write(20240801, 1, 5);
  CHECK_THROWS_WITH(load_llmc_bin(path), Catch::Contains("version 1 with magic 20240801"));
  write(20240801, 7, 6);
  CHECK_THROWS_WITH(load_llmc_bin(path), Catch::Contains("header promises 6 tokens, the file holds 5"));
  write(20240802, 7, 5);
  CHECK_THROWS_WITH(load_llmc_bin(path), Catch::Contains("magic 20240802 (expected 20240520), nor 20240801"));
  fs::remove(path);
}

TEST_CASE("token files are written in the narrow form while the vocabulary allows, and read back", "[data]") {
  const std::string path = tmp_path("written.bin");
  const auto header = [&] {
    std::vector<int32_t> h(256);
    std::ifstream f(path, std::ios::binary);
    f.read(reinterpret_cast<char*>(h.data()), 1024);
    return std::tuple{h[0], h[1], h[2], fs::file_size(path)};
  };
  const std::vector<int32_t> narrow = {0, 1, 65535, 42};
  write_llmc_bin(path, narrow, 65536);
  CHECK(header() == std::tuple{20240520, 1, 4, uintmax_t{1024 + 2 * 4}});
  CHECK(load_llmc_bin(path).to_vector() == narrow);
  const std::vector<int32_t> wide = {0, 65536, 128255, 100000, 3};
  write_llmc_bin(path, wide, 128256);
  CHECK(header() == std::tuple{20240801, 7, 5, uintmax_t{1024 + 4 * 5}});
  CHECK(load_llmc_bin(path).to_vector() == wide);
  write_llmc_bin(path, narrow, 128256);  // a large vocabulary takes the wide form whatever the ids
  CHECK(std::get<0>(header()) == 20240801);
  CHECK(load_llmc_bin(path).to_vector() == narrow);
  CHECK_THROWS_WITH(write_llmc_bin(path, wide, 65536), Catch::Contains("token 65536 at position 1 does not fit the "
                                                                       "vocabulary of 65536"));
  fs::remove(path);
}

TEST_CASE("a text file with a tokenizer is its tokens", "[data][hf-tokenizer]") {
  const std::string dir = std::string(SHARDLAB_SOURCE_DIR) + "/tests/fixtures/tokenizers/llama3-style";
  const Tokenizer tok(dir);
  const std::string path = tmp_path("tokenized.txt"), text = "Licensed under the Apache License, Version 2.0\n";
  { std::ofstream(path, std::ios::binary) << text; }
  const TokenStream s = load_tokens(path, 808, &tok);
  // HF tokenizers 0.23.3: Tokenizer.from_file(<that dir>/tokenizer.json).encode(text, add_special_tokens=False).ids
  CHECK(s.to_vector() == std::vector<int32_t>{745, 67, 452, 268, 616, 324, 11, 220, 752, 417, 220, 17, 13, 15, 198});
  CHECK(tok.decode(s.to_vector()) == text);
  CHECK(load_tokens(path, 808).size() == static_cast<int64_t>(text.size()));  // without one, its bytes
  fs::remove(path);
}

TEST_CASE("shards in a list or a pattern are one stream, read in place across their boundaries", "[data][shards]") {
  const fs::path dir = fs::temp_directory_path() / "shardlab_test_shards";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<int32_t> all(1000);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>((i * 7919) % 50000);
  const std::string whole = (dir / "all.bin").string(), a = (dir / "shard_0.bin").string(),
                    b = (dir / "shard_1.bin").string(), c = (dir / "shard_2.bin").string();
  write_llmc_bin(whole, all, 50257);
  write_llmc_bin(a, {all.begin(), all.begin() + 333}, 50257);
  write_llmc_bin(b, {all.begin() + 333, all.begin() + 334}, 50257);  // a shard of one token
  write_llmc_bin(c, {all.begin() + 334, all.end()}, 128256);          // another width: uint32
  for (const std::string& what : {a + "," + b + "," + c, (dir / "shard_*.bin").string(),
                                  (dir / "shard_[0-1].bin").string() + "," + c}) {
    const TokenStream s = load_tokens(what, 50257);
    CHECK(s.source == what);
    CHECK(s.mapped_parts() == 3);
    CHECK(s.to_vector() == all);
    // Sequences of 10 straddle the shards' boundaries (at 333 and 334): the loader reads across them.
    const TokenStream concatenated = load_tokens(whole, 50257);
    BatchLoader whole_loader(concatenated, 10, 4), shards(s, 10, 4);
    for (int64_t step = 0; step < 30; ++step) {
      std::vector<int32_t> x(40), y(40), u(40), v(40);
      whole_loader.fill(step, 0, 4, x.data(), y.data());
      shards.fill(step, 0, 4, u.data(), v.data());
      REQUIRE(x == u);
      REQUIRE(y == v);
    }
    // A validation tail cut off a list is a slice of it.
    TokenStream train = s;
    const TokenStream val = split_tail(train, 0.67);
    CHECK(val.to_vector() == std::vector<int32_t>(all.begin() + 330, all.end()));
    CHECK(train.to_vector() == std::vector<int32_t>(all.begin(), all.begin() + 330));
    CHECK(train.mapped_parts() == 1);  // the first shard only
    CHECK(val.mapped_parts() == 3);
  }
  CHECK(describe_source(a + "," + b).bytes == fs::file_size(a) + fs::file_size(b));
  CHECK(describe_source(a + "," + b).hash != describe_source(b + "," + a).hash);  // the order is the stream's
  CHECK(describe_source(whole).hash == describe_source(whole).hash);
  CHECK_THROWS_WITH(load_tokens((dir / "none_*.bin").string(), 50257), Catch::Contains("matches no file"));
  CHECK_THROWS_WITH(load_tokens(a + ",", 50257), Catch::Contains("an empty item in the list"));
  const std::string text = (dir / "notes.txt").string();
  { std::ofstream(text) << "hello"; }
  CHECK_THROWS_WITH(load_tokens(a + "," + text, 50257), Catch::Contains("mixes llm.c .bin shards and text files"));
  CHECK_THROWS_WITH(load_tokens(a + "," + c, 40000), Catch::Contains("does not fit the model's vocabulary of 40000"));
  fs::remove_all(dir);
}

TEST_CASE("data that is not a regular file is refused by name", "[data]") {
  CHECK_THROWS_WITH(load_tokens("/dev/zero", 256), Catch::Contains("data file '/dev/zero' is a character device"));
  CHECK_THROWS_WITH(load_tokens("/dev/null.bin", 256), Catch::Contains("cannot open token file '/dev/null.bin'"));
  CHECK_THROWS_WITH(load_tokens(fs::temp_directory_path().string(), 256), Catch::Contains("is a directory"));
  CHECK_THROWS_WITH(describe_source("/dev/zero"), Catch::Contains("is a character device"));
  // A pipe named like a shard is refused, not opened to wait for a writer.
  const std::string pipe = tmp_path("pipe.bin");
  fs::remove(pipe);
  REQUIRE(::mkfifo(pipe.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(load_tokens(pipe, 256), Catch::Contains("data file '" + pipe + "' is a pipe"));
  fs::remove(pipe);
}

// tokenize's block cuts (tokenize_shards.hpp): at every cut last_safe_cut allows, GPT-2's and Llama
// 3's split patterns give the same pieces on the two halves as on the whole text, so the ids of a
// file read in blocks are those of the whole file. Blank lines, trailing spaces and \r\n, where
// GPT-2's `\s+(?!\S)` takes a block's last white space whole, allow no cut.
TEST_CASE("tokenize: a block is cut only where both split patterns cut the whole text", "[data]") {
  const std::vector<std::string> texts = {
      "end.\n\nNext line\nand more\n", "word  \nNext\r\nLine\n", "a\nb\nc", "1.\nX 2\n\nY\n  Z\nW",
      "tab\t\nA\n\n\nB x\ny", "caf\xc3\xa9\nDone\n(x)\nz", "\n\nA\nB"};
  auto pieces = [](std::string_view t, SplitPattern p) {
    std::vector<std::string> out;
    split_by_pattern(t, p, [&out](std::string_view s) { out.emplace_back(s); });
    return out;
  };
  size_t cuts = 0;
  for (const std::string& t : texts)
    for (size_t limit = 0; limit <= t.size(); ++limit) {
      const size_t cut = last_safe_cut(t, limit);
      if (cut == 0) continue;
      ++cuts;
      REQUIRE(cut <= limit);
      CHECK(t[cut - 1] == '\n');
      for (SplitPattern p : {SplitPattern::gpt2, SplitPattern::llama3}) {
        std::vector<std::string> halves = pieces(std::string_view(t).substr(0, cut), p);
        for (std::string& s : pieces(std::string_view(t).substr(cut), p)) halves.push_back(std::move(s));
        CHECK(halves == pieces(t, p));
      }
    }
  CHECK(cuts > 0);
  CHECK(last_safe_cut("end.\n\nNext", 10) == 0);   // "\n\n": GPT-2 splits '\n','\n' whole, '\n\n' at a block's end
  CHECK(last_safe_cut("word  \nNext", 11) == 0);  // trailing spaces
  CHECK(last_safe_cut("x\r\nNext", 7) == 0);      // \r\n
  CHECK(last_safe_cut("x.\nNext", 7) == 3);
  CHECK(last_safe_cut("x.\nNext\nMore", 12) == 8);
  CHECK(last_safe_cut("x.\nNext\nMore", 12, 10) == 0);  // looks no further back than `from`
}
