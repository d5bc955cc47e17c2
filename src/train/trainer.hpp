// trainer.hpp — single-rank training: data -> Gpt2Model forward/backward -> clip -> optimizer,
// with a progress line per step, a final summary and an optional JSONL log.
#pragma once
#include <cstdio>
#include <memory>
#include <string>

#include "optim/optimizer.hpp"
#include "src/model/model.hpp"
#include "src/train/data.hpp"

namespace shardlab {

struct TrainConfig {
  ModelSpec spec;
  std::string data = "synthetic";
  int64_t steps = 200;
  int64_t batch = 8;  // global, in sequences
  int64_t accum = 1;  // micro-steps per step
  uint64_t seed = 1337;
  OptimConfig optim;
  LrSchedule schedule;
  float grad_clip = 1.f;     // 0 = off
  std::string init;          // safetensors to start from
  std::string log_path;      // JSONL, one object per step
  std::string save_path;     // safetensors written at the end
  int64_t print_every = 1;   // progress line every k steps (and the last)
  void validate() const;
};

struct StepStats {
  int64_t step = 0;  // 1-based
  float loss = 0, lr = 0, grad_norm = 0;
  double ms = 0, tokens_per_s = 0;
  uint64_t peak_bytes = 0;
};

class Trainer {
 public:
  Trainer(Backend& be, Pool& pool, TrainConfig cfg);
  StepStats step(int64_t t);  // t is 0-based
  // The whole run: progress to `out`, the JSONL log, the final save. Returns the last step's stats.
  StepStats run(std::FILE* out);
  Gpt2Model& model() { return model_; }

 private:
  Backend& be_;
  Pool& pool_;
  TrainConfig cfg_;
  TokenStream stream_;
  BatchLoader loader_;
  Gpt2Model model_;
  Optimizer optim_;
  std::vector<int32_t> inputs_, targets_;
};

}  // namespace shardlab
