#include "src/data/pretokenize.hpp"

#include <algorithm>
#include <iterator>

#include "src/core/check.hpp"
#include "src/data/unicode_classes.hpp"

namespace shardlab {
namespace {

constexpr uint32_t kNotUtf8 = 0xFFFFFFFF;  // a byte that starts no valid UTF-8 sequence

struct CodePoint {
  uint32_t cp;
  size_t len;  // bytes; 0 past the end
};

// The code point at byte i: a valid UTF-8 sequence (no overlong forms, no surrogates), else the
// single byte as kNotUtf8.
CodePoint code_point_at(std::string_view s, size_t i) {
  if (i >= s.size()) return {kNotUtf8, 0};
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return {c, 1};
  const size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (len == 0 || i + len > s.size()) return {kNotUtf8, 1};
  uint32_t cp = c & (0xFFu >> (len + 1));
  for (size_t k = 1; k < len; ++k) {
    if ((b(k) & 0xC0) != 0x80) return {kNotUtf8, 1};
    cp = (cp << 6) | (b(k) & 0x3Fu);
  }
  const bool overlong = (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
  if (overlong || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return {kNotUtf8, 1};
  return {cp, len};
}

enum class Cls : uint8_t { letter, number, space, other };

template <size_t N>
bool in(const unicode::CodePointRange (&table)[N], uint32_t cp) {
  auto it = std::upper_bound(std::begin(table), std::end(table), cp,
                             [](uint32_t v, const unicode::CodePointRange& r) { return v < r.first; });
  return it != std::begin(table) && cp <= std::prev(it)->last;
}

Cls classify(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return Cls::letter;
    if (cp >= '0' && cp <= '9') return Cls::number;
    if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return Cls::space;
    return Cls::other;
  }
  if (cp == kNotUtf8) return Cls::other;
  if (in(unicode::kLetter, cp)) return Cls::letter;
  if (in(unicode::kNumber, cp)) return Cls::number;
  if (in(unicode::kWhiteSpace, cp)) return Cls::space;
  return Cls::other;
}

// A cursor over the text with the few questions the patterns ask.
struct Text {
  std::string_view s;
  CodePoint at(size_t i) const { return code_point_at(s, i); }
  bool is(size_t i, Cls c) const { return i < s.size() && classify(at(i).cp) == c; }
  bool is_newline(size_t i) const { return i < s.size() && (s[i] == '\r' || s[i] == '\n'); }
  size_t next(size_t i) const { return i + at(i).len; }
  size_t run(size_t i, Cls c) const {  // end of the run of class c from i
    while (is(i, c)) i = next(i);
    return i;
  }
  size_t run_count(size_t i, Cls c, int most) const {  // \p{N}{1,most}
    for (int k = 0; k < most && is(i, c); ++k) i = next(i);
    return i;
  }
};

// 's|'t|'re|'ve|'m|'ll|'d at i (an apostrophe), case-insensitively for llama3: the match's end, or i.
size_t contraction(const Text& t, size_t i, bool ignore_case) {
  if (t.s[i] != '\'') return i;
  for (std::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
    size_t j = i + 1;
    bool ok = true;
    for (char want : suffix) {
      const CodePoint c = t.at(j);
      // Unicode simple case folding adds one character to these letters: U+017F LATIN SMALL LETTER
      // LONG S folds to 's' (the regex engine matches "'ſ" as a contraction).
      ok = c.len > 0 && (c.cp == static_cast<uint32_t>(want) ||
                         (ignore_case && (c.cp == static_cast<uint32_t>(want - 'a' + 'A') || (want == 's' && c.cp == 0x17F))));
      if (!ok) break;
      j += c.len;
    }
    if (ok) return j;
  }
  return i;
}

// \s+(?!\S)|\s+ at i (white space): the whole run when it ends the text or is one character,
// else all but its last character, which then leads what follows.
size_t whitespace(const Text& t, size_t i) {
  const size_t end = t.run(i, Cls::space);
  if (end == t.s.size()) return end;
  size_t last = i;  // start of the run's last character
  for (size_t k = i; k < end; k = t.next(k)) last = k;
  return last == i ? end : last;
}

size_t match_gpt2(const Text& t, size_t i) {
  if (size_t e = contraction(t, i, false); e > i) return e;
  const size_t j = t.s[i] == ' ' ? i + 1 : i;  // " ?" before a letter, number or other run
  for (Cls c : {Cls::letter, Cls::number, Cls::other}) {
    if (t.is(i, c)) return t.run(i, c);
    if (j > i && t.is(j, c)) return t.run(j, c);
  }
  return whitespace(t, i);
}

size_t match_llama3(const Text& t, size_t i) {
  if (size_t e = contraction(t, i, true); e > i) return e;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (t.is(i, Cls::letter)) return t.run(i, Cls::letter);
  if (!t.is(i, Cls::number) && !t.is_newline(i) && t.is(t.next(i), Cls::letter)) return t.run(t.next(i), Cls::letter);
  // \p{N}{1,3}
  if (t.is(i, Cls::number)) return t.run_count(i, Cls::number, 3);
  // ?[^\s\p{L}\p{N}]+[\r\n]*
  const size_t j = t.s[i] == ' ' && t.is(i + 1, Cls::other) ? i + 1 : i;
  if (t.is(j, Cls::other)) {
    size_t e = t.run(j, Cls::other);
    while (t.is_newline(e)) ++e;
    return e;
  }
  // \s*[\r\n]+: up to and including the run's last newline, when it holds one
  const size_t end = t.run(i, Cls::space);
  size_t after_newline = i;
  for (size_t k = i; k < end; k = t.next(k))
    if (t.is_newline(k)) after_newline = k + 1;
  if (after_newline > i) return after_newline;
  return whitespace(t, i);
}

constexpr const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace

const char* split_pattern_regex(SplitPattern p) { return p == SplitPattern::gpt2 ? kGpt2Regex : kLlama3Regex; }

bool parse_split_pattern(std::string_view regex, SplitPattern* out) {
  for (SplitPattern p : {SplitPattern::gpt2, SplitPattern::llama3})
    if (regex == split_pattern_regex(p)) return *out = p, true;
  return false;
}

void split_by_pattern(std::string_view text, SplitPattern p, const std::function<void(std::string_view)>& emit) {
  const Text t{text};
  for (size_t i = 0; i < text.size();) {
    const size_t e = p == SplitPattern::gpt2 ? match_gpt2(t, i) : match_llama3(t, i);
    SHARD_CHECK(e > i && e <= text.size(), "split pattern matched [{}, {}) of {} bytes", i, e, text.size());
    emit(text.substr(i, e - i));
    i = e;
  }
}

void split_digits(std::string_view text, bool individual, const std::function<void(std::string_view)>& emit) {
  const Text t{text};
  for (size_t i = 0; i < text.size();) {
    const bool number = t.is(i, Cls::number);
    size_t e = t.next(i);
    if (!number)
      while (e < text.size() && !t.is(e, Cls::number)) e = t.next(e);
    else if (!individual)
      e = t.run(i, Cls::number);
    emit(text.substr(i, e - i));
    i = e;
  }
}

std::vector<std::string> gpt2_split(const std::string& text) {
  std::vector<std::string> out;
  split_by_pattern(text, SplitPattern::gpt2, [&](std::string_view piece) { out.emplace_back(piece); });
  return out;
}

}  // namespace shardlab
