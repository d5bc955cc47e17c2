#include "src/train/tokenizer.hpp"

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "src/core/check.hpp"

namespace shardlab {
namespace {

// GPT-2's byte -> code point table: printable Latin-1 bytes map to themselves, the other 68 bytes
// to 256, 257, ... in order.
std::vector<uint32_t> byte_code_points() {
  std::vector<uint32_t> cp(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    cp[b] = printable ? b : next++;
  }
  return cp;
}

// A token as written in encoder.json / vocab.bpe (UTF-8 of the table's code points) -> its bytes.
std::string to_bytes(const std::string& utf8, const std::map<uint32_t, unsigned char>& back, const std::string& where) {
  std::string out;
  for (size_t i = 0; i < utf8.size();) {
    unsigned char c = static_cast<unsigned char>(utf8[i]);
    uint32_t cp = c;
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 0;
    SHARD_REQUIRE(len > 0 && i + len <= utf8.size(), "{}: token '{}' is not the UTF-8 GPT-2 writes", where, utf8);
    if (len == 2) cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(utf8[i + 1]) & 0x3Fu);
    if (len == 3)
      cp = ((c & 0x0Fu) << 12) | ((static_cast<unsigned char>(utf8[i + 1]) & 0x3Fu) << 6) |
           (static_cast<unsigned char>(utf8[i + 2]) & 0x3Fu);
    auto it = back.find(cp);
    SHARD_REQUIRE(it != back.end(), "{}: token '{}' holds a character outside GPT-2's byte table", where, utf8);
    out.push_back(static_cast<char>(it->second));
    i += len;
  }
  return out;
}

std::string merge_key(const std::string& a, const std::string& b) { return std::to_string(a.size()) + ':' + a + b; }

enum class CharClass { letter, digit, space, other };
CharClass classify(unsigned char c) {
  if (c >= 0x80) return CharClass::letter;  // non-ASCII (UTF-8 bytes): letters of any script
  if (std::isalpha(c)) return CharClass::letter;
  if (std::isdigit(c)) return CharClass::digit;
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return CharClass::space;
  return CharClass::other;
}

}  // namespace

std::vector<std::string> gpt2_split(const std::string& text) {
  std::vector<std::string> out;
  const size_t n = text.size();
  auto cls = [&](size_t i) { return classify(static_cast<unsigned char>(text[i])); };
  auto run = [&](size_t i, CharClass c) {
    while (i < n && cls(i) == c) ++i;
    return i;
  };
  for (size_t i = 0; i < n;) {
    if (text[i] == '\'') {  // 's 't 're 've 'm 'll 'd
      bool matched = false;
      for (const char* s : {"s", "t", "re", "ve", "m", "ll", "d"}) {
        size_t len = std::char_traits<char>::length(s);
        if (text.compare(i + 1, len, s) == 0) {
          out.push_back(text.substr(i, len + 1));
          i += len + 1;
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    size_t start = i;
    if (text[i] == ' ' && i + 1 < n && cls(i + 1) != CharClass::space) ++i;  // " ?" before a run
    CharClass c = cls(i);
    if (c != CharClass::space) {
      size_t end = run(i, c);
      out.push_back(text.substr(start, end - start));
      i = end;
      continue;
    }
    size_t end = run(i, CharClass::space);  // \s+(?!\S), else \s+
    if (end < n && end - i > 1) --end;      // leave the last one to precede what follows
    out.push_back(text.substr(i, end - i));
    i = end;
  }
  return out;
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path enc = fs::path(dir) / "encoder.json", merges = fs::path(dir) / "vocab.bpe";
  for (const fs::path& p : {enc, merges})
    SHARD_REQUIRE(fs::is_regular_file(p), "--tokenizer '{}': '{}' is missing (GPT-2's encoder.json and vocab.bpe; "
                  "scripts/fetch-gpt2-tokenizer.sh fetches them)", dir, p.string());
  const std::vector<uint32_t> cp = byte_code_points();
  std::map<uint32_t, unsigned char> back;
  for (int b = 0; b < 256; ++b) back[cp[static_cast<size_t>(b)]] = static_cast<unsigned char>(b);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(std::ifstream(enc));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("'{}' is not valid JSON: {}", enc.string(), e.what()));
  }
  SHARD_REQUIRE(j.is_object() && !j.empty(), "'{}' must map token strings to ids", enc.string());
  tokens_.resize(j.size());
  for (const auto& [key, value] : j.items()) {
    SHARD_REQUIRE(value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() < int64_t(j.size()),
                  "'{}': token '{}' has id {}, outside [0, {})", enc.string(), key, value.dump(), j.size());
    std::string bytes = to_bytes(key, back, enc.string());
    tokens_[value.get<size_t>()] = bytes;
    ids_[bytes] = value.get<int32_t>();
  }
  std::ifstream m(merges);
  std::string line;
  int rank = 0;
  while (std::getline(m, line)) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    size_t sp = line.find(' ');
    SHARD_REQUIRE(sp != std::string::npos, "'{}': merge '{}' is not two tokens", merges.string(), line);
    ranks_[merge_key(to_bytes(line.substr(0, sp), back, merges.string()),
                     to_bytes(line.substr(sp + 1), back, merges.string()))] = rank++;
  }
  SHARD_REQUIRE(rank > 0, "'{}' holds no merges", merges.string());
}

// Byte-pair merging of one piece: start from single bytes, merge the adjacent pair of lowest rank
// until no pair has one.
std::vector<std::string> Gpt2Tokenizer::bpe(const std::string& piece) const {
  std::vector<std::string> parts;
  for (char c : piece) parts.emplace_back(1, c);
  while (parts.size() > 1) {
    int best = std::numeric_limits<int>::max();
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = ranks_.find(merge_key(parts[i], parts[i + 1]));
      if (it != ranks_.end() && it->second < best) best = it->second, at = i;
    }
    if (best == std::numeric_limits<int>::max()) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  return parts;
}

std::vector<int32_t> Gpt2Tokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  for (const std::string& piece : gpt2_split(text))
    for (const std::string& part : bpe(piece)) {
      auto it = ids_.find(part);
      SHARD_CHECK(it != ids_.end(), "BPE produced '{}', which encoder.json does not list", part);
      ids.push_back(it->second);
    }
  return ids;
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    SHARD_REQUIRE(id >= 0 && static_cast<size_t>(id) < tokens_.size(), "token id {} is outside the tokenizer's {}",
                  id, tokens_.size());
    out += tokens_[static_cast<size_t>(id)];
  }
  return out;
}

}  // namespace shardlab
