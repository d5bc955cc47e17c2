// tokenize_shards.hpp — `shardlab tokenize`: text files to llm.c token shards, so a real data set
// needs no other project's scripts.
//
// The layout is llm.c's (dev/data/fineweb.py): each input file is a document, the end-of-text token
// (when there is one) written before each; the first `val_tokens` of the stream go to
// PREFIX_val_000000.bin, the rest to PREFIX_train_000001.bin, 000002, ... of `shard_tokens` each
// (the last one shorter). Shards are the uint16 form where the vocabulary fits it, else uint32
// (data.hpp, write_llmc_bin), so `train --data 'DIR/PREFIX_train_*.bin' --val-data
// DIR/PREFIX_val_000000.bin` reads them.
//
// Nothing lost, nothing half-written: every shard goes to a hidden temporary beside it and is
// renamed into place once whole; shards of the prefix already in the directory are refused (named)
// unless `overwrite`, which removes them first. A file is read in blocks and encoded a block at a
// time where the tokenizer cuts there anyway (after a newline between a printable ASCII byte and an
// ASCII letter: no pre-tokenizer piece of GPT-2's or Llama 3's pattern spans it, last_safe_cut), so
// memory stays a block's while the ids are those of encoding the file whole; text with no such line
// start (JSON lines, indented code, other scripts) is held until one comes, the whole file at worst;
// where an added token holds a newline (it could span such a cut) each file is encoded whole. A
// failure part-way says that the shards written before it are an incomplete set.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace shardlab {

struct TokenizeConfig {
  std::vector<std::string> inputs;   // text files, in stream order
  std::string out_dir;               // created if needed
  std::string prefix = "data";       // PREFIX_val_000000.bin, PREFIX_train_000001.bin, ...
  int64_t shard_tokens = 100'000'000;  // tokens per train shard (llm.c's fineweb.py: 10^8)
  int64_t val_tokens = 0;            // the stream's first tokens, as the validation shard (0: none)
  int32_t eot = -1;                  // written before each document; -1: none
  int64_t vocab = 0;                 // the tokenizer's size: every id below it
  bool overwrite = false;            // remove the prefix's earlier shards instead of refusing them
  bool whole_files = false;          // encode each file whole (an added token holds a newline)
  int64_t block_bytes = 64 << 20;    // read size (a test makes it small to cross many cuts)
  void validate() const;
};

struct TokenizeResult {
  int64_t tokens = 0, val_tokens = 0;  // all written, and those in the validation shard
  uint64_t bytes_read = 0;
  int documents = 0;
  std::vector<std::string> shards;  // written, in order (the validation shard first)
  double seconds = 0;
};

using EncodeFn = std::function<std::vector<int32_t>(std::string_view)>;

// Encodes the inputs with `encode` into shards under c.out_dir. Progress (bytes read, tokens,
// shards, time left at the pace so far) on `progress` every 10 s; null: none. InputError for an
// unreadable input, an id outside the vocabulary, shards of the prefix already there, a validation
// shard that would take every token.
TokenizeResult tokenize_to_shards(const TokenizeConfig& c, const EncodeFn& encode, std::FILE* progress);

// Where a block of text may be cut for encoding: just after the last '\n' that is followed by an
// ASCII letter and preceded by a printable ASCII byte (not a space: GPT-2's `\s+(?!\S)` would take
// a run of white space ending a block whole), at or before `limit`, looking no further back than
// `from`; 0 when there is none (exposed for tests).
size_t last_safe_cut(std::string_view text, size_t limit, size_t from = 0);

}  // namespace shardlab
