// decode.hpp — incremental decoding with a KV cache (sample, train --sample-every): the prompt runs
// once through every unit (prefill), each unit keeping what later positions need of it (a layer's
// keys and values) in its cache; each new token then runs one position through every unit. A unit
// opts in with Unit::decodes() and computes in Unit::forward_cached, so the per-family logic lives
// with the family's units; this loop, like run_forward, takes each unit's parameters from the
// hooks (a strategy gathers them) and never knows the family.
#pragma once
#include <span>
#include <vector>

#include "src/model/runner.hpp"

namespace shardlab {

class Decoder {
 public:
  // Whether every unit decodes with a cache; otherwise callers decode by whole forwards (run_forward).
  static bool supported(const std::vector<std::unique_ptr<Unit>>& units);

  // One sequence (B = 1) of at most spec.seq positions. The caches come from the pool (category
  // activations) on the first forward and live until reset() or the Decoder's end.
  Decoder(const std::vector<std::unique_ptr<Unit>>& units, const ModelSpec& spec, Backend& be, Pool& pool);

  int64_t length() const { return length_; }  // positions in the caches
  // Positions [length(), length() + n) of the sequence, `tokens` (n >= 1, length() + n <= seq),
  // through every unit, forward only (after_forward(u) follows each unit, as in run_forward);
  // logits receives their (n, V) logits. InputError when the positions would exceed seq.
  void forward(std::span<const int32_t> tokens, UnitHooks& hooks, std::vector<float>& logits);
  void reset();  // frees the caches; the next forward starts at position 0

 private:
  const std::vector<std::unique_ptr<Unit>>& units_;
  ModelSpec spec_;  // a copy: decoding computes the logits whatever --loss-chunk says
  Backend& be_;
  Pool& pool_;
  std::vector<Saved> caches_;  // one per unit
  int64_t length_ = 0;
};

}  // namespace shardlab
