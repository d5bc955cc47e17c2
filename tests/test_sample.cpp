// Sampling: the token choice is a deterministic function of (logits, seed, stream, index); greedy
// picks the largest; top-k never leaves the k largest; prompts outside the vocabulary are named.
#include <catch2/catch.hpp>
#include <set>

#include "src/train/sample.hpp"
#include "src/data/tokenizer.hpp"

using namespace shardlab;

TEST_CASE("sample_token: greedy, top-k, temperature, determinism", "[sample]") {
  std::vector<float> logits = {0.1f, 2.0f, -1.f, 1.9f, 0.5f, 2.0f};
  SampleConfig greedy;
  greedy.top_k = 1;
  CHECK(sample_token(logits, greedy, 0) == 1);  // the largest; a tie goes to the lower index
  SampleConfig cold;
  cold.temperature = 0;
  CHECK(sample_token(logits, cold, 7) == 1);
  SampleConfig c;
  c.seed = 5;
  std::vector<int32_t> a, b;
  for (int64_t i = 0; i < 200; ++i) a.push_back(sample_token(logits, c, i)), b.push_back(sample_token(logits, c, i));
  CHECK(a == b);  // same seed, same draws
  CHECK(std::set<int32_t>(a.begin(), a.end()).size() >= 4);  // and they are draws, not a constant
  c.stream = 1;
  std::vector<int32_t> other;
  for (int64_t i = 0; i < 200; ++i) other.push_back(sample_token(logits, c, i));
  CHECK(other != a);
  c.top_k = 3;  // only 1, 5 and 3
  for (int64_t i = 0; i < 200; ++i) {
    int32_t t = sample_token(logits, c, i);
    CHECK((t == 1 || t == 5 || t == 3));
  }
  c.top_k = 0;
  c.temperature = 1e-3f;  // nearly greedy: the two tied maxima only
  for (int64_t i = 0; i < 50; ++i) {
    int32_t t = sample_token(logits, c, i);
    CHECK((t == 1 || t == 5));
  }
}

TEST_CASE("prompts: bytes for byte-level models, token ids otherwise, out-of-vocabulary named", "[sample]") {
  CHECK(encode_prompt("ab", 256) == std::vector<int32_t>{97, 98});
  CHECK(decode_tokens(std::vector<int32_t>{104, 105}, 256) == "hi");
  CHECK_THROWS_WITH(encode_prompt("01z", 64), Catch::Contains("byte 122 ('z') at position 2 is outside the model's vocabulary of 64"));
  CHECK(encode_prompt("50256, 13 7", 50257) == std::vector<int32_t>{50256, 13, 7});
  CHECK(decode_tokens(std::vector<int32_t>{50256, 13}, 50257) == "50256 13");
  CHECK_THROWS_WITH(encode_prompt("hello", 50257), Catch::Contains("'hello' is not a token id"));
  CHECK_THROWS_WITH(encode_prompt("50257", 50257), Catch::Contains("'50257' is not a token id of the model's vocabulary of 50257"));
  SampleConfig bad;
  bad.top_k = 300;
  CHECK_THROWS_WITH(bad.validate(256), Catch::Contains("--top-k 300"));
  bad.top_k = 0;
  bad.temperature = -1;
  CHECK_THROWS_WITH(bad.validate(256), Catch::Contains("--temperature -1"));
}

TEST_CASE("TextStream prints what is complete and splits no UTF-8 character", "[sample]") {
  TextStream bytes(256, nullptr);
  CHECK(bytes.push('h') == "h");
  CHECK(bytes.push(0xC3).empty());  // the lead byte of "é": held
  CHECK(bytes.push(0xA9) == "\xC3\xA9");
  CHECK(bytes.push(0xE2).empty());  // three bytes announced, "→"
  CHECK(bytes.push(0x86).empty());
  CHECK(bytes.push(0x92) == "\xE2\x86\x92");
  CHECK(bytes.push(0xC3).empty());
  CHECK(bytes.push('x') == "\xC3x");  // not UTF-8 after all: printed as it is, nothing lost
  CHECK(bytes.push(0xF0).empty());
  CHECK(bytes.finish() == "\xF0");  // the end returns what is held
  TextStream ids(50257, nullptr);
  CHECK(ids.push(50256) == "50256");
  CHECK(ids.push(13) == " 13");
  CHECK(ids.finish().empty());

  // A byte-level BPE whose byte tokens split "é" (0xC3 0xA9) in two: nothing until it is whole, and
  // the pieces add up to decode_tokens of the whole sequence.
  const Tokenizer tok(std::string(SHARDLAB_SOURCE_DIR) + "/tests/fixtures/tokenizers/llama3-style");
  int32_t lead = -1, tail = -1;
  for (int32_t id = 0; id < static_cast<int32_t>(tok.size()); ++id) {
    const std::string text = tok.decode(std::span<const int32_t>(&id, 1));
    if (text == "\xC3") lead = id;
    if (text == "\xA9") tail = id;
  }
  REQUIRE((lead >= 0 && tail >= 0));
  const std::vector<int32_t> seq = {tok.encode("caf")[0], lead, tail, tok.encode("!")[0]};
  TextStream stream(static_cast<int64_t>(tok.size()), &tok);
  std::vector<std::string> pieces;
  for (int32_t t : seq) pieces.push_back(stream.push(t));
  pieces.push_back(stream.finish());
  CHECK(pieces[1].empty());
  CHECK(pieces[2] == "\xC3\xA9");
  std::string joined;
  for (const std::string& p : pieces) joined += p;
  CHECK(joined == decode_tokens(seq, static_cast<int64_t>(tok.size()), &tok));
  CHECK(joined.find("\xC3\xA9!") != std::string::npos);
}
