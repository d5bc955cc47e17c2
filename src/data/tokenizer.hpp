// tokenizer.hpp — byte-level BPE, read from either of the two forms models ship it in:
//
//  * DIR/tokenizer.json (Hugging Face `tokenizers`): a "BPE" model with a ByteLevel pre-tokenizer
//    and decoder, as GPT-2, Llama 3 and SmolLM ship. What encode computes equals HF's
//    `Tokenizer.encode(text, add_special_tokens=False).ids`:
//      - added tokens (<|endoftext|>, <|begin_of_text|>, ...) are cut out of the text first, as HF
//        does whether or not add_special_tokens is set (leftmost, then longest; those with
//        "normalized": false before those with true);
//      - each remaining segment passes the pre-tokenizers in order: ByteLevel (GPT-2's split
//        pattern when use_regex), Split with GPT-2's or Llama 3's pattern (pretokenize.hpp), Digits;
//      - each piece is merged pair by pair, lowest merge rank first (leftmost among equal ranks),
//        or taken whole when the model has ignore_merges and the vocabulary holds it.
//    The post-processor (a BOS template) is what add_special_tokens adds, and is not applied.
//    Anything else (WordPiece, Unigram, Metaspace BPE like Llama 2's, byte fallback, dropout,
//    normalizers, other regexes, added tokens with lstrip/rstrip/single_word) is refused by name.
//  * DIR/encoder.json and DIR/vocab.bpe: GPT-2's files as OpenAI published them (used when there
//    is no tokenizer.json). GPT-2's split pattern; no added tokens (<|endoftext|> in text is text).
//  * DIR/gpt2.tiktoken or DIR/tokenizer.model: tiktoken's BPE ranks ("base64(bytes) rank" lines;
//    tiktoken.cpp), used when neither of the above is there: GPT-2's (as the openai-whisper sdist
//    ships it: GPT-2's pattern, <|endoftext|> as above) or Llama 3's original tokenizer.model
//    (Llama 3's pattern, its 256 special tokens added after the ranks).
//
// Tokens are byte strings: byte-level BPE writes each byte as a printable code point (the "bytes to
// unicode" table), which the reader maps back once, so encoding and decoding work on raw bytes and
// decoding is exact for any ids (an added token decodes to its text).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "src/model/family.hpp"
#include "src/data/pretokenize.hpp"

namespace shardlab {

// A merge table's key: the pair of token ids (left << 32 | right).
inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Bytes as byte-level BPE writes them: each byte as its printable code point, in UTF-8.
std::string byte_level_text(std::string_view bytes);

// The tokenizer.json of "bytes as tokens" (a text --data without --tokenizer): ids 0-255 are the
// bytes, no merges, no regex; what an export of such a run carries (tokenizer_export.cpp).
nlohmann::json byte_tokenizer_json();

class Tokenizer {
 public:
  // DIR/tokenizer.json when it exists, else DIR/encoder.json with DIR/vocab.bpe, else a tiktoken
  // file (gpt2.tiktoken, tokenizer.model), else the two-file form's message. InputError names a
  // missing or malformed file, and the component of a tokenizer.json shardlab does not implement.
  explicit Tokenizer(const std::string& dir);
  TokenizerKind kind() const { return kind_; }
  const std::string& source() const { return source_; }  // its tokenizer.json or directory, for messages
  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(std::span<const int32_t> ids) const;  // InputError for an id outside the vocabulary
  size_t size() const { return tokens_.size(); }           // the largest id + 1
  // This tokenizer as a Hugging Face tokenizer.json (tokenizer_export.cpp), whatever form it was
  // read from: byte-level BPE with its vocabulary, its merges in rank order, ignore_merges, its
  // added tokens and its pre-tokenizers, which transformers' AutoTokenizer and this class read back
  // to the same ids (tiktoken ranks: every split of a token, as its merges here).
  nlohmann::json to_hf_json() const;
  // The id of the first of `texts` that is a token (added or in the vocabulary), or -1.
  int32_t find_token(std::initializer_list<std::string_view> texts) const;
  // Whether an added token's text holds byte c (it could span a cut made there: tokenize_shards.hpp).
  bool added_token_holds(char c) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t id;  // the merged token
  };
  struct AddedToken {
    std::string text;
    int32_t id;
    bool normalized;  // matched after those that are not
  };
  enum class PreTokenizer : uint8_t { gpt2, llama3, digits, digits_individual };

  void read_gpt2_files(const std::string& dir);
  static bool find_tiktoken(const std::string& dir, std::string* path);  // gpt2.tiktoken or tokenizer.model
  void read_tiktoken(const std::string& path);
  void read_hf_json(const std::string& path);
  void read_hf_model(const nlohmann::json& model);
  void read_hf_pre_tokenizer(const nlohmann::json& pre);
  void read_hf_added_tokens(const nlohmann::json& added);
  void add_token(int32_t id, std::string bytes);
  void add_merge(const std::string& a, const std::string& b, int32_t rank);
  void encode_segment(std::string_view text, size_t stage, std::vector<int32_t>& out,
                      std::unordered_map<std::string, std::vector<int32_t>>& cache) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;

  TokenizerKind kind_ = TokenizerKind::gpt2_bpe;
  std::string source_;
  std::vector<std::string> tokens_;                  // id -> bytes
  std::vector<bool> has_token_;                      // ids the files define (a vocabulary may have holes)
  std::unordered_map<std::string, int32_t> vocab_;   // bytes -> id (the model's vocabulary, not added tokens)
  int32_t byte_ids_[256];                            // id of each single byte (-1: none)
  std::unordered_map<uint64_t, Merge> merges_;       // (left id << 32 | right id) -> merge
  std::vector<AddedToken> added_;                    // longest first
  std::vector<PreTokenizer> pre_;                    // in order
  bool ignore_merges_ = false;
};

}  // namespace shardlab
