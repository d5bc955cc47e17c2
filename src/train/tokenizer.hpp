// tokenizer.hpp — GPT-2's byte-level BPE, from the two files OpenAI published with the model:
// encoder.json (token string -> id) and vocab.bpe (the merges, in priority order).
//
// Tokens are byte strings: GPT-2 writes each byte as a printable code point (the "bytes to
// unicode" table), which this reader maps back once, so encoding and decoding work on raw bytes.
// Text is first split as GPT-2's pattern splits it (contractions, an optional space with a run of
// letters, of digits or of other symbols, runs of whitespace), then each piece is merged pair by
// pair, lowest merge rank first. Letters and digits are classified for ASCII; every other
// (UTF-8, non-ASCII) character counts as a letter, which matches GPT-2 for letters of any script
// and differs only for non-ASCII digits and punctuation. Decoding is exact for any ids.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace shardlab {

class Gpt2Tokenizer {
 public:
  // Reads dir/encoder.json and dir/vocab.bpe; InputError names a missing or malformed file.
  explicit Gpt2Tokenizer(const std::string& dir);
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(std::span<const int32_t> ids) const;  // InputError for an id outside the vocabulary
  size_t size() const { return tokens_.size(); }

 private:
  std::vector<std::string> bpe(const std::string& piece) const;

  std::vector<std::string> tokens_;                 // id -> bytes
  std::unordered_map<std::string, int32_t> ids_;    // bytes -> id
  std::unordered_map<std::string, int> ranks_;      // merge key(a, b) -> priority (lower first)
};

// GPT-2's pre-tokenisation of text into pieces (exposed for tests).
std::vector<std::string> gpt2_split(const std::string& text);

}  // namespace shardlab
