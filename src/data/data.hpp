// data.hpp — token streams and the batching rule every strategy and world size shares.
//
// Sources: llm.c `.bin` shards (memory-mapped: read in place in their own width, one copy per node
// in the page cache), any other file as text (its bytes, vocab 256, or with --tokenizer its tokens),
// several files as one stream (a comma-separated list or glob patterns), or "synthetic": an embedded
// deterministic stream a small model visibly learns, so the main job needs no download.
//
// An llm.c token file is a 256 x int32 header (magic, version, token count; the rest zero), then the
// tokens, in one of the two forms llm.c's dev/data/data_common.py writes:
//   magic 20240520, version 1: uint16 tokens (GPT-2's, ids up to 65,535)
//   magic 20240801, version 7: uint32 tokens (Llama 3's vocabulary of 128,256)
//
// Batching: sequence j is tokens[j*T : j*T + T + 1] (inputs the first T, targets the last T).
// Step t's global batch is sequences t*B .. t*B + B - 1, modulo the number of sequences; rank r
// of W takes the contiguous slice [r*B/W, (r+1)*B/W), and micro-step k of it the next `micro`.
//
// Shuffling (--shuffle): positions p = t*B + i run over the concatenation of epochs, each a
// permutation of the S sequences: position p is sequence perm_e[p mod S] with e = p / S, and
// perm_e is a function of (seed, e) only (Fisher-Yates over the counter RNG). So the global order
// is the same at every world size and strategy, a batch that straddles two epochs takes the end of
// one and the start of the next (no padding, no sequence dropped or repeated within an epoch), and
// a resumed run continues the same order from the step alone. Without it, perm_e is the identity.
//
// Validation (--val-fraction F): the last round(F * n) tokens form the validation stream and are
// cut from the training stream, so no training sequence reaches into them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/data/source.hpp"

namespace shardlab {

// Part of a token stream: one file's tokens, held in memory (text, synthetic) or mapped from an
// llm.c file (read in place, in its own width: the page cache keeps one copy per node however many
// ranks read it).
struct TokenPart {
  std::shared_ptr<const void> keep;  // owns `data`: a vector or a mapping
  const void* data = nullptr;
  int width = 4;  // bytes per token: 2 (uint16) or 4 (uint32 / int32)
  int64_t count = 0;
  bool mapped = false;  // read in place from a file
};

// Tokens [begin, end) of the concatenation of its parts. Copies share the parts.
class TokenStream {
 public:
  TokenStream() = default;
  TokenStream(std::vector<int32_t> tokens, std::string source);  // held in memory
  void append(TokenPart part);
  void append_stream(const TokenStream& other);  // other's tokens after this stream's
  int64_t size() const { return end_ - begin_; }
  // out[0, count) <- tokens [pos, pos + count) of the stream, across parts.
  void read(int64_t pos, int64_t count, int32_t* out) const;
  std::vector<int32_t> to_vector() const;
  // The position of the first token outside [0, vocab) and its value, or -1 when every token fits.
  int64_t first_outside(int64_t vocab, uint32_t* value) const;
  // Tokens [begin, end) of this stream, named `source`.
  TokenStream slice(int64_t begin, int64_t end, std::string source) const;
  int mapped_parts() const;  // parts of this slice read in place from a file

  std::string source;  // for messages: the path, the list or pattern, or "synthetic"

 private:
  std::pair<int64_t, int64_t> in_slice(size_t i) const;  // part i's tokens [lo, hi) inside [begin_, end_)
  std::vector<TokenPart> parts_;
  std::vector<int64_t> starts_;  // where each part begins in the concatenation
  int64_t total_ = 0, begin_ = 0, end_ = 0;
};

class Tokenizer;

// "synthetic", or one stream of files in order: a path, a comma-separated list, or glob patterns
// (each pattern's matches sorted by name). Files ending in .bin are llm.c shards, mapped; any other
// file is text, encoded by `tokenizer` when there is one, else its bytes; one list is all of one
// kind. Checks that every token fits the vocabulary; throws InputError naming the file and the
// offending value, a pattern that matches nothing, or a path that is not a regular file.
TokenStream load_tokens(const std::string& what, int64_t vocab, const Tokenizer* tokenizer = nullptr);
bool is_text_source(const std::string& what);  // neither "synthetic" nor llm.c .bin shards: text
// The files `what` names, in stream order (patterns expanded); empty for "synthetic".
std::vector<std::string> data_paths(const std::string& what);
// ("--data", file) and ("--val-data", file) for every file the two sources name: inputs that no
// output may overwrite (outputs.hpp).
std::vector<std::pair<std::string, std::string>> data_inputs(const std::string& data, const std::string& val_data);
TokenStream load_llmc_bin(const std::string& path);  // mapped
TokenStream load_text_bytes(const std::string& path);
TokenStream load_text_tokens(const std::string& path, const Tokenizer& tokenizer);
// Writes an llm.c token file: the uint16 form when vocab <= 65,536 and every id fits, else uint32.
// InputError for an id outside [0, vocab) or more tokens than the header's int32 count holds.
void write_llmc_bin(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab);
// A first-order Markov chain over `vocab` tokens in which each token has four likely successors:
// a model that learns it goes from ln(vocab) to about 1.2 nats. Same stream for every run.
TokenStream synthetic_stream(int64_t vocab, int64_t length = 1 << 20);
// `length` zero tokens named `source`: a stand-in where a Trainer reads no data (predictions, sample).
TokenStream zero_stream(int64_t length, std::string source);

// `what` (as load_tokens takes it) as a checkpoint records it: a file's size and the FNV-1a-64 hash
// of its size, first MiB and last MiB (two reads, however large the file); for several files, the
// sizes summed and the hashes chained in order; "synthetic" as such.
DataSource describe_source(const std::string& what);

// Removes the last round(fraction * n) tokens of `s` and returns them as a stream of their own;
// InputError unless 0 < fraction < 1 and both parts keep at least one token.
TokenStream split_tail(TokenStream& s, double fraction);

// Sequence order of epoch `epoch` over `n` sequences: a permutation that depends on (seed, epoch) only.
std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t n);

struct ShuffleConfig {
  bool on = false;
  uint64_t seed = 0;
};

class BatchLoader {
 public:
  BatchLoader(const TokenStream& stream, int64_t seq_len, int64_t global_batch, ShuffleConfig shuffle = {});
  int64_t num_sequences() const { return num_sequences_; }
  // Fills count sequences starting at position `first` of step t's global batch.
  void fill(int64_t step, int64_t first, int64_t count, int32_t* inputs, int32_t* targets) const;
  // The sequence index at global position p (p = t*B + i).
  int64_t sequence_at(int64_t p) const;

 private:
  const TokenStream& stream_;
  int64_t T_, B_, num_sequences_;
  ShuffleConfig shuffle_;
  mutable int64_t perm_epoch_ = -1;  // the epoch perm_ holds (a cache: fill stays a function of its arguments)
  mutable std::vector<int64_t> perm_;
};

}  // namespace shardlab
