#include "src/data/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>

#include "src/core/check.hpp"

namespace shardlab {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Byte-level BPE's byte -> code point table: printable Latin-1 bytes map to themselves, the other
// 68 bytes to 256, 257, ... in order.
const std::map<uint32_t, unsigned char>& code_point_bytes() {
  static const std::map<uint32_t, unsigned char> back = [] {
    std::map<uint32_t, unsigned char> m;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      m[printable ? b : next++] = static_cast<unsigned char>(b);
    }
    return m;
  }();
  return back;
}

// A token as the files write it (UTF-8 of the table's code points, all below U+0800) -> its bytes.
std::string to_bytes(const std::string& utf8, const std::string& where) {
  const auto& back = code_point_bytes();
  std::string out;
  for (size_t i = 0; i < utf8.size();) {
    const auto c = static_cast<unsigned char>(utf8[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : 0;
    SHARD_REQUIRE(len > 0 && i + len <= utf8.size(),
                  "{}: token '{}' holds a character outside byte-level BPE's byte table", where, utf8);
    const uint32_t cp = len == 1 ? c : ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(utf8[i + 1]) & 0x3Fu);
    auto it = back.find(cp);
    SHARD_REQUIRE(it != back.end(), "{}: token '{}' holds a character outside byte-level BPE's byte table", where,
                  utf8);
    out.push_back(static_cast<char>(it->second));
    i += len;
  }
  return out;
}

}  // namespace

std::string byte_level_text(std::string_view bytes) {
  static const std::array<std::string, 256> text = [] {
    std::array<std::string, 256> t;
    for (const auto& [cp, b] : code_point_bytes())  // cp < 0x800: one or two UTF-8 bytes
      t[b] = cp < 0x80 ? std::string(1, static_cast<char>(cp))
                       : std::string{static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    return t;
  }();
  std::string out;
  for (const char c : bytes) out += text[static_cast<unsigned char>(c)];
  return out;
}

namespace {

json read_json(const fs::path& p) {
  std::ifstream f(p);
  SHARD_REQUIRE(f.good(), "cannot open '{}'", p.string());
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw InputError(fmt::format("'{}' is not valid JSON: {}", p.string(), e.what()));
  }
}

// A component's "type" for messages: null when absent.
std::string type_of(const json& c) {
  if (c.is_null()) return "null";
  return c.is_object() && c.contains("type") && c["type"].is_string() ? c["type"].get<std::string>() : c.dump();
}

bool is_unset(const json& obj, const char* key) {  // absent, null, false, or an empty string
  if (!obj.contains(key) || obj[key].is_null()) return true;
  const json& v = obj[key];
  return (v.is_boolean() && !v.get<bool>()) || (v.is_string() && v.get<std::string>().empty()) ||
         (v.is_number() && v.get<double>() == 0);
}

constexpr const char* kImplemented =
    "shardlab reads byte-level BPE: model type \"BPE\" with a ByteLevel pre-tokenizer and decoder, as GPT-2, "
    "Llama 3 and SmolLM ship";

}  // namespace

Tokenizer::Tokenizer(const std::string& dir) {
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  const fs::path hf = fs::path(dir) / "tokenizer.json";
  std::string ranks;
  if (fs::is_regular_file(hf))
    read_hf_json(hf.string());
  else if (fs::is_regular_file(fs::path(dir) / "encoder.json") || !find_tiktoken(dir, &ranks))
    read_gpt2_files(dir);
  else
    read_tiktoken(ranks);
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(std::string(1, static_cast<char>(b)));
    if (it != vocab_.end()) byte_ids_[b] = it->second;
  }
}

void Tokenizer::add_token(int32_t id, std::string bytes) {
  SHARD_REQUIRE(id >= 0, "{}: token '{}' has id {}", source_, bytes, id);
  if (static_cast<size_t>(id) >= tokens_.size()) tokens_.resize(static_cast<size_t>(id) + 1), has_token_.resize(tokens_.size());
  tokens_[static_cast<size_t>(id)] = std::move(bytes);
  has_token_[static_cast<size_t>(id)] = true;
}

// The merge (a, b) -> a+b at priority `rank`: a, b and a+b must all be tokens (as HF's BPE requires).
void Tokenizer::add_merge(const std::string& a, const std::string& b, int32_t rank) {
  auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
  for (const auto& [it, what] : {std::pair{ia, a}, std::pair{ib, b}, std::pair{iab, a + b}})
    SHARD_REQUIRE(it != vocab_.end(), "{}: merge {} of '{}' and '{}' needs the token '{}', which the vocabulary lacks",
                  source_, rank, a, b, what);
  merges_.insert_or_assign(pair_key(ia->second, ib->second), Merge{rank, iab->second});  // a repeated pair: the last wins, as in HF
}

// ---- GPT-2's encoder.json + vocab.bpe ---------------------------------------------------------

void Tokenizer::read_gpt2_files(const std::string& dir) {
  const fs::path enc = fs::path(dir) / "encoder.json", merges = fs::path(dir) / "vocab.bpe";
  for (const fs::path& p : {enc, merges})
    SHARD_REQUIRE(fs::is_regular_file(p), "--tokenizer '{}': '{}' is missing (a directory holds a Hugging Face "
                  "tokenizer.json, GPT-2's encoder.json and vocab.bpe, or a tiktoken gpt2.tiktoken or tokenizer.model; "
                  "scripts/fetch-gpt2-tokenizer.sh "
                  "fetches)", dir, p.string());
  kind_ = TokenizerKind::gpt2_bpe;
  source_ = enc.string();
  pre_ = {PreTokenizer::gpt2};
  const json j = read_json(enc);
  SHARD_REQUIRE(j.is_object() && !j.empty(), "'{}' must map token strings to ids", enc.string());
  for (const auto& [key, value] : j.items()) {
    SHARD_REQUIRE(value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() < int64_t(j.size()),
                  "'{}': token '{}' has id {}, outside [0, {})", enc.string(), key, value.dump(), j.size());
    std::string bytes = to_bytes(key, enc.string());
    vocab_[bytes] = value.get<int32_t>();
    add_token(value.get<int32_t>(), std::move(bytes));
  }
  source_ = merges.string();
  std::ifstream m(merges);
  std::string line;
  int32_t rank = 0;
  while (std::getline(m, line)) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    size_t sp = line.find(' ');
    SHARD_REQUIRE(sp != std::string::npos, "'{}': merge '{}' is not two tokens", merges.string(), line);
    add_merge(to_bytes(line.substr(0, sp), merges.string()), to_bytes(line.substr(sp + 1), merges.string()), rank++);
  }
  SHARD_REQUIRE(rank > 0, "'{}' holds no merges", merges.string());
  source_ = dir;
}

// ---- Hugging Face tokenizer.json ----------------------------------------------------------------

void Tokenizer::read_hf_json(const std::string& path) {
  kind_ = TokenizerKind::hf_byte_bpe;
  source_ = path;
  const json j = read_json(path);
  SHARD_REQUIRE(j.is_object() && j.contains("model") && j["model"].is_object(),
                "'{}' is not a Hugging Face tokenizer.json (no \"model\" object)", path);
  const std::string model = type_of(j["model"]);
  SHARD_REQUIRE(model == "BPE", "'{}': model type '{}' is not implemented: {}", path, model, kImplemented);
  read_hf_pre_tokenizer(j.value("pre_tokenizer", json()));
  const json normalizer = j.value("normalizer", json());
  SHARD_REQUIRE(normalizer.is_null(), "'{}': normalizer '{}' is not implemented (shardlab reads tokenizers without "
                "one, as byte-level BPE ships)", path, type_of(normalizer));
  const json decoder = j.value("decoder", json());
  SHARD_REQUIRE(type_of(decoder) == "ByteLevel", "'{}': decoder '{}' is not implemented: {}", path, type_of(decoder),
                kImplemented);
  read_hf_model(j["model"]);
  read_hf_added_tokens(j.value("added_tokens", json::array()));
}

void Tokenizer::read_hf_pre_tokenizer(const json& pre) {
  const json stages = pre.is_null()                ? json::array()
                      : type_of(pre) == "Sequence" ? pre.value("pretokenizers", json::array())
                                                   : json::array({pre});
  bool byte_level = false;
  for (const json& s : stages) {
    const std::string type = type_of(s);
    SHARD_REQUIRE(!byte_level, "'{}': pre-tokenizer '{}' after ByteLevel is not implemented (ByteLevel comes last)",
                  source_, type);
    if (type == "ByteLevel") {
      SHARD_REQUIRE(is_unset(s, "add_prefix_space"), "'{}': ByteLevel pre-tokenizer with add_prefix_space is not "
                    "implemented (it adds a space the text does not hold)", source_);
      if (s.value("use_regex", true)) pre_.push_back(PreTokenizer::gpt2);
      byte_level = true;
    } else if (type == "Split") {
      const json pattern = s.value("pattern", json());
      const std::string regex = pattern.is_object() && pattern.contains("Regex") ? pattern["Regex"].get<std::string>() : "";
      SplitPattern p;
      SHARD_REQUIRE(parse_split_pattern(regex, &p), "'{}': Split pre-tokenizer with pattern {} is not implemented "
                    "(shardlab implements GPT-2's regex and Llama 3's)", source_, pattern.dump());
      const std::string behavior = s.value("behavior", "");
      SHARD_REQUIRE(behavior == "Isolated" && !s.value("invert", false), "'{}': Split pre-tokenizer with behavior "
                    "'{}'{} is not implemented (Isolated, not inverted)", source_, behavior,
                    s.value("invert", false) ? " inverted" : "");
      pre_.push_back(p == SplitPattern::gpt2 ? PreTokenizer::gpt2 : PreTokenizer::llama3);
    } else if (type == "Digits") {
      pre_.push_back(s.value("individual_digits", false) ? PreTokenizer::digits_individual : PreTokenizer::digits);
    } else {
      throw InputError(fmt::format("'{}': pre-tokenizer '{}' is not implemented: {} (SentencePiece-style BPE such as "
                                   "Llama 2's, with Metaspace and byte fallback, is not byte-level)",
                                   source_, type, kImplemented));
    }
  }
  SHARD_REQUIRE(byte_level, "'{}': no ByteLevel pre-tokenizer (pre_tokenizer {}): {} (SentencePiece-style BPE such as "
                "Llama 2's, with Metaspace and byte fallback, is not byte-level)", source_, type_of(pre), kImplemented);
}

void Tokenizer::read_hf_model(const json& model) {
  for (const char* key : {"dropout", "byte_fallback", "continuing_subword_prefix", "end_of_word_suffix"})
    SHARD_REQUIRE(is_unset(model, key), "'{}': BPE with {} {} is not implemented: {}", source_, key, model[key].dump(),
                  kImplemented);
  ignore_merges_ = model.value("ignore_merges", false);
  const json& vocab = model.value("vocab", json());
  SHARD_REQUIRE(vocab.is_object() && !vocab.empty(), "'{}': the BPE model has no vocabulary", source_);
  for (const auto& [key, value] : vocab.items()) {
    SHARD_REQUIRE(value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() < (int64_t(1) << 31),
                  "'{}': token '{}' has id {}", source_, key, value.dump());
    std::string bytes = to_bytes(key, source_);
    const auto id = value.get<int32_t>();
    SHARD_REQUIRE(static_cast<size_t>(id) >= tokens_.size() || !has_token_[static_cast<size_t>(id)],
                  "'{}': id {} names two tokens, '{}' and another", source_, id, key);
    vocab_[bytes] = id;
    add_token(id, std::move(bytes));
  }
  const json merges = model.value("merges", json::array());
  SHARD_REQUIRE(merges.is_array(), "'{}': the BPE model's merges are not a list", source_);
  int32_t rank = 0;
  for (const json& m : merges) {
    // Two forms: "a b" (older files) and ["a", "b"] (tokenizers >= 0.20, which allows spaces in tokens).
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      SHARD_REQUIRE(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                    "'{}': merge {} '{}' is not two tokens separated by one space", source_, rank, s);
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      SHARD_REQUIRE(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                    "'{}': merge {} {} is neither \"a b\" nor [\"a\", \"b\"]", source_, rank, m.dump());
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    }
    add_merge(to_bytes(a, source_), to_bytes(b, source_), rank++);
  }
}

void Tokenizer::read_hf_added_tokens(const json& added) {
  SHARD_REQUIRE(added.is_array(), "'{}': added_tokens is not a list", source_);
  for (const json& t : added) {
    const std::string text = t.value("content", "");
    SHARD_REQUIRE(!text.empty() && t.contains("id") && t["id"].is_number_integer(),
                  "'{}': added token {} needs a content and an id", source_, t.dump());
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      SHARD_REQUIRE(!t.value(flag, false), "'{}': added token '{}' with {} is not implemented", source_, text, flag);
    const auto id = t["id"].get<int32_t>();
    add_token(id, text);  // decodes to its text (HF looks added tokens up before the model's)
    added_.push_back({text, id, t.value("normalized", !t.value("special", false))});
  }
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& x, const AddedToken& y) { return x.text.size() > y.text.size(); });
}

// ---- encoding -----------------------------------------------------------------------------------

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  std::unordered_map<std::string, std::vector<int32_t>> cache;  // piece -> ids, for this call only (no shared state)
  // Added tokens, as HF's AddedVocabulary cuts them: leftmost, then longest; the tokens that are not
  // "normalized" first, then those that are in what is left.
  bool starts[2][256] = {};  // [normalized][byte]: some added token starts with it
  for (const AddedToken& t : added_) starts[t.normalized][static_cast<unsigned char>(t.text[0])] = true;
  const auto cut = [&](std::string_view s, bool normalized, const auto& gap) {
    size_t from = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (!starts[normalized][static_cast<unsigned char>(s[i])]) continue;
      for (const AddedToken& t : added_) {
        if (t.normalized != normalized || t.text[0] != s[i] || s.compare(i, t.text.size(), t.text) != 0) continue;
        if (i > from) gap(s.substr(from, i - from));
        out.push_back(t.id);
        i += t.text.size() - 1;
        from = i + 1;
        break;
      }
    }
    if (from < s.size()) gap(s.substr(from));
  };
  const auto plain = [&](std::string_view s) { encode_segment(s, 0, out, cache); };
  if (added_.empty())
    plain(text);
  else
    cut(text, false, [&](std::string_view s) { cut(s, true, plain); });
  return out;
}

void Tokenizer::encode_segment(std::string_view text, size_t stage, std::vector<int32_t>& out,
                               std::unordered_map<std::string, std::vector<int32_t>>& cache) const {
  if (stage == pre_.size()) {
    std::string key(text);
    auto it = cache.find(key);
    if (it == cache.end()) {
      if (cache.size() >= (1u << 20)) cache.clear();  // bounds the memory of a long text's distinct pieces
      std::vector<int32_t> ids;
      bpe(text, ids);
      it = cache.emplace(std::move(key), std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const auto next = [&](std::string_view piece) { encode_segment(piece, stage + 1, out, cache); };
  switch (pre_[stage]) {
    case PreTokenizer::gpt2: return split_by_pattern(text, SplitPattern::gpt2, next);
    case PreTokenizer::llama3: return split_by_pattern(text, SplitPattern::llama3, next);
    case PreTokenizer::digits: return split_digits(text, false, next);
    case PreTokenizer::digits_individual: return split_digits(text, true, next);
  }
}

// Byte-pair merging of one piece: start from its bytes and apply the merge of lowest rank, the
// leftmost among equals, until no adjacent pair has one. A min-heap of candidate (rank, position)
// pairs keeps it O(n log n) for long pieces (a run of spaces or of '='); an entry whose pair has
// changed since it was pushed is dropped when it comes up.
void Tokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (auto it = vocab_.find(std::string(piece)); it != vocab_.end()) return out.push_back(it->second);
  }
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // neighbours still alive (-1: none)
  };
  const auto n = static_cast<int32_t>(piece.size());
  std::vector<Symbol> sym(piece.size());
  for (int32_t i = 0; i < n; ++i) {
    const auto b = static_cast<unsigned char>(piece[static_cast<size_t>(i)]);
    SHARD_REQUIRE(byte_ids_[b] >= 0, "{}: the vocabulary has no token for byte 0x{:02x}, so byte-level BPE cannot "
                  "encode it", source_, b);
    sym[static_cast<size_t>(i)] = {byte_ids_[b], i - 1, i + 1 < n ? i + 1 : -1};
  }
  struct Candidate {
    int32_t rank, pos, id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto consider = [&](int32_t left) {
    if (left < 0 || sym[static_cast<size_t>(left)].next < 0) return;
    auto it = merges_.find(pair_key(sym[static_cast<size_t>(left)].id, sym[static_cast<size_t>(sym[static_cast<size_t>(left)].next)].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = sym[static_cast<size_t>(c.pos)];
    if (left.id < 0 || left.next < 0) continue;  // merged into its left neighbour, or now the last
    auto it = merges_.find(pair_key(left.id, sym[static_cast<size_t>(left.next)].id));
    if (it == merges_.end() || it->second.id != c.id) continue;  // the pair changed since it was pushed
    Symbol& right = sym[static_cast<size_t>(left.next)];
    left.id = c.id;
    left.next = right.next;
    if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = c.pos;
    right.id = -1;
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = sym[static_cast<size_t>(i)].next) out.push_back(sym[static_cast<size_t>(i)].id);
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    SHARD_REQUIRE(id >= 0 && static_cast<size_t>(id) < tokens_.size(), "token id {} is outside the tokenizer's {}",
                  id, tokens_.size());
    SHARD_REQUIRE(has_token_[static_cast<size_t>(id)], "token id {} is not defined by {}", id, source_);
    out += tokens_[static_cast<size_t>(id)];
  }
  return out;
}

}  // namespace shardlab
