// pretokenize.hpp — the split patterns byte-level BPE tokenizers cut text with before merging,
// written out by hand (no regex library): each is a fixed alternation whose first matching branch,
// tried in order at the current position, gives the next piece, exactly as a backtracking regex
// engine (Oniguruma, in Hugging Face `tokenizers`) matches it.
//
//   gpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//           \s*[\r\n]+|\s+(?!\S)|\s+          (tiktoken's cl100k_base; Llama 3 ships it)
//
// Every code point is a letter, a number, white space or something else, so one branch always
// matches and the pieces cover the text. The classes are those of tokenizers' regex engine
// (unicode_classes.hpp, generated from it). Bytes that are not UTF-8 count each as an "other"
// character (HF never sees them: its input is a str).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace shardlab {

enum class SplitPattern : uint8_t { gpt2, llama3 };

// The regex as tokenizer.json writes it (after JSON unescaping), and the pattern it names.
const char* split_pattern_regex(SplitPattern p);
bool parse_split_pattern(std::string_view regex, SplitPattern* out);

// Calls emit with each piece of `text` in order; the pieces concatenate to `text`.
void split_by_pattern(std::string_view text, SplitPattern p, const std::function<void(std::string_view)>& emit);
// HF's Digits pre-tokenizer: runs of numbers (\p{N}) as pieces of their own, each number alone when
// `individual`.
void split_digits(std::string_view text, bool individual, const std::function<void(std::string_view)>& emit);

// GPT-2's pre-tokenisation of text into pieces (exposed for tests).
std::vector<std::string> gpt2_split(const std::string& text);

}  // namespace shardlab
