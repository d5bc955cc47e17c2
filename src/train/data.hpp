// data.hpp — token streams and the batching rule every strategy and world size shares.
//
// Sources: llm.c `.bin` shards (a 256 x int32 header: magic 20240520, version 1, token count; then
// uint16 tokens), any other file as bytes (vocab 256), or "synthetic": an embedded deterministic
// stream a small model visibly learns, so the main job needs no download.
//
// Batching: sequence j is tokens[j*T : j*T + T + 1] (inputs the first T, targets the last T).
// Step t's global batch is sequences t*B .. t*B + B - 1, modulo the number of sequences; rank r
// of W takes the contiguous slice [r*B/W, (r+1)*B/W), and micro-step k of it the next `micro`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shardlab {

struct TokenStream {
  std::vector<int32_t> tokens;
  std::string source;  // for messages: the path, or "synthetic"
};

// "synthetic", a path ending in .bin (llm.c shard), or any other path (bytes). Checks that every
// token fits the vocabulary; throws InputError naming the file and the offending value.
TokenStream load_tokens(const std::string& what, int64_t vocab);
TokenStream load_llmc_bin(const std::string& path);
TokenStream load_text_bytes(const std::string& path);
// A first-order Markov chain over `vocab` tokens in which each token has four likely successors:
// a model that learns it goes from ln(vocab) to about 1.2 nats. Same stream for every run.
TokenStream synthetic_stream(int64_t vocab, int64_t length = 1 << 20);

class BatchLoader {
 public:
  BatchLoader(const TokenStream& stream, int64_t seq_len, int64_t global_batch);
  int64_t num_sequences() const { return num_sequences_; }
  // Fills count sequences starting at position `first` of step t's global batch.
  void fill(int64_t step, int64_t first, int64_t count, int32_t* inputs, int32_t* targets) const;

 private:
  const TokenStream& stream_;
  int64_t T_, B_, num_sequences_;
};

}  // namespace shardlab
