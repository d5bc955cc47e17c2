// tiktoken.cpp — the BPE-ranks form of byte-level BPE (tokenizer.hpp): one "base64(bytes) rank"
// line per token, the rank being its id, as OpenAI's tiktoken loads it (GPT-2's gpt2.tiktoken,
// shipped in the openai-whisper sdist) and as Llama 3's original tokenizer.model is written.
//
// There is no merge list: tiktoken merges, within a piece, the adjacent pair whose concatenation has
// the lowest rank. The merge table built here holds, for every token of two or more bytes, each
// split of it into two tokens, at the token's rank: the same merges in the same order, so the
// tokenizer's one BPE loop (Tokenizer::bpe) gives tiktoken's ids.
#include <filesystem>
#include <fstream>

#include "src/core/check.hpp"
#include "src/data/tokenizer.hpp"

namespace shardlab {
namespace {

namespace fs = std::filesystem;

// Standard base64 (RFC 4648, with padding) -> bytes; false for anything else.
bool base64_decode(std::string_view in, std::string& out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + static_cast<size_t>(k)];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0, ++pad;
      } else if (pad > 0 || (v[k] = value(c)) < 0) {
        return false;
      }
    }
    const uint32_t w = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out.push_back(static_cast<char>(w >> 16));
    if (pad < 2) out.push_back(static_cast<char>((w >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(w & 0xff));
  }
  return true;
}

// Llama 3's special tokens after its 128,000 ranks (Meta's reference tokenizer for Llama 3.0; 3.1
// renamed four reserved ones, 128004, 128005, 128008 and 128010, which stay reserved names here).
std::vector<std::string> llama3_special_tokens() {
  std::vector<std::string> t = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                                "<|reserved_special_token_1|>", "<|reserved_special_token_2|>",
                                "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
                                "<|reserved_special_token_4|>", "<|eot_id|>"};
  for (int i = 5; i < 251; ++i) t.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  return t;
}

}  // namespace

bool Tokenizer::find_tiktoken(const std::string& dir, std::string* path) {
  for (const char* name : {"gpt2.tiktoken", "tokenizer.model"}) {
    const fs::path p = fs::path(dir) / name;
    if (fs::is_regular_file(p)) return *path = p.string(), true;
  }
  return false;
}

void Tokenizer::read_tiktoken(const std::string& path) {
  const bool gpt2 = fs::path(path).filename() == "gpt2.tiktoken";
  kind_ = gpt2 ? TokenizerKind::gpt2_bpe : TokenizerKind::hf_byte_bpe;
  source_ = path;
  pre_ = {gpt2 ? PreTokenizer::gpt2 : PreTokenizer::llama3};
  std::ifstream in(path);
  SHARD_REQUIRE(in.good(), "--tokenizer: cannot read '{}'", path);
  std::string line, bytes;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    int64_t rank = -1;
    try {
      if (sp != std::string::npos) rank = std::stoll(line.substr(sp + 1));
    } catch (const std::exception&) {
    }
    SHARD_REQUIRE(sp != std::string::npos && rank >= 0 && rank < (int64_t(1) << 30) &&
                      base64_decode(std::string_view(line).substr(0, sp), bytes),
                  "'{}' line {}: '{}' is not \"base64 rank\" (a tiktoken BPE file; for a SentencePiece "
                  "tokenizer.model, as Llama 2 ships, give its tokenizer.json instead)", path, lineno,
                  line.substr(0, 60));
    SHARD_REQUIRE(vocab_.emplace(bytes, static_cast<int32_t>(rank)).second, "'{}' line {}: a token repeats",
                  path, lineno);
    add_token(static_cast<int32_t>(rank), bytes);
  }
  SHARD_REQUIRE(!vocab_.empty(), "'{}' holds no tokens", path);
  ignore_merges_ = true;  // tiktoken takes a piece that is a token whole before merging
  // Every split of a token into two tokens merges to it at its rank.
  for (const auto& [token, id] : vocab_)
    for (size_t cut = 1; cut < token.size(); ++cut) {
      auto a = vocab_.find(token.substr(0, cut)), b = vocab_.find(token.substr(cut));
      if (a != vocab_.end() && b != vocab_.end()) merges_[pair_key(a->second, b->second)] = Merge{id, id};
    }
  // The tokens after the ranks: GPT-2's <|endoftext|> is a vocabulary token (text in text, as its
  // encoder.json has it); Llama 3's are added tokens, cut out of the text first.
  const auto first = static_cast<int32_t>(tokens_.size());
  if (gpt2) {
    vocab_["<|endoftext|>"] = first;
    add_token(first, "<|endoftext|>");
    return;
  }
  const std::vector<std::string> special = llama3_special_tokens();
  for (size_t i = 0; i < special.size(); ++i) {
    add_token(first + static_cast<int32_t>(i), special[i]);
    added_.push_back({special[i], first + static_cast<int32_t>(i), false});
  }
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& x, const AddedToken& y) { return x.text.size() > y.text.size(); });
}

}  // namespace shardlab
