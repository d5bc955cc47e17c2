// sample.hpp — text generation from a model's next-token distribution.
//
// The forward itself is Trainer::generate (any strategy, any world size: every rank runs the same
// forward on the same context and so draws the same token). This file holds what does not depend on
// where the parameters live: picking a token from one row of logits, and turning prompts and tokens
// into text and back for byte-level models (vocab 256) and for token ids otherwise.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace shardlab {

class Tokenizer;

struct SampleConfig {
  int64_t tokens = 64;       // tokens to generate
  float temperature = 1.f;   // 0 = greedy
  int64_t top_k = 0;         // keep the k most likely tokens (0 = all; 1 = greedy)
  uint64_t seed = 1337;      // with the token index, the only source of randomness (counter RNG)
  uint64_t stream = 0;       // separates samples of one seed (train --sample-every: the step)
  bool kv_cache = true;      // decode with a KV cache when the units can (false: a whole forward per token)
  void validate(int64_t vocab) const;
};

// The token drawn for position `index` of a sample from `logits` (one row, V values): greedy
// (the lowest index among the largest) when temperature is 0 or top_k is 1, else softmax(logits /
// temperature) over the top_k largest, with a uniform number of (seed, stream, index). Deterministic.
int32_t sample_token(std::span<const float> logits, const SampleConfig& c, int64_t index);

// Prompt text to tokens: with a tokenizer (--tokenizer: byte-level BPE), its encoding; else bytes for a
// byte-level model (vocab 256, or smaller: then every byte must be below vocab), else token ids
// separated by spaces or commas. InputError names a byte or id outside the vocabulary.
std::vector<int32_t> encode_prompt(const std::string& prompt, int64_t vocab, const Tokenizer* tokenizer = nullptr);
// Tokens as text: the tokenizer's decoding when there is one, bytes for vocab <= 256, else the ids
// separated by spaces.
std::string decode_tokens(std::span<const int32_t> tokens, int64_t vocab, const Tokenizer* tokenizer = nullptr);

// decode_tokens one token at a time, for printing tokens as they come: push(t) returns the text
// that is complete so far, holding back the bytes of a UTF-8 character a later token may finish (a
// byte-level BPE token can end inside one); finish() returns what is held. Everything returned, in
// order, is decode_tokens of every token pushed: the same bytes, only split.
class TextStream {
 public:
  TextStream(int64_t vocab, const Tokenizer* tokenizer) : vocab_(vocab), tokenizer_(tokenizer) {}
  std::string push(int32_t token);
  std::string finish() { return std::exchange(held_, {}); }

 private:
  int64_t vocab_;
  const Tokenizer* tokenizer_;
  bool first_ = true;  // token ids are separated by spaces: none before the first
  std::string held_;
};

}  // namespace shardlab
