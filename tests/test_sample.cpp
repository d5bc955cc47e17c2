// Sampling: the token choice is a deterministic function of (logits, seed, stream, index); greedy
// picks the largest; top-k never leaves the k largest; prompts outside the vocabulary are named.
#include <catch2/catch.hpp>
#include <set>

#include "src/train/sample.hpp"

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
