// optim_options.cpp — the optimizer's and the learning-rate schedule's flags (one group of
// options.hpp's training flags, in a file of its own).
#include "tools/options.hpp"

namespace shardlab::cli {

void add_optimizer(Desc& g, TrainConfig& cfg, std::string& schedule, std::string& optimizer) {
  g.add_options()("lr", po::value(&cfg.schedule.lr)->default_value(1e-3f, "1e-3"), "peak learning rate")(
      "schedule", po::value(&schedule)->default_value(schedule), "constant or cosine")(
      "warmup-steps", po::value(&cfg.schedule.warmup_steps)->default_value(10), "linear warmup steps")(
      "min-lr-frac", po::value(&cfg.schedule.min_lr_frac)->default_value(0.1f, "0.1"), "cosine ends at lr * this")(
      "lr-decay-steps", po::value(&cfg.lr_decay_steps)->default_value(0),
      "the step the cosine reaches lr * --min-lr-frac (and stays at after); 0 = --steps. A run meant to be "
      "resumed to more steps gives the final count here, so its schedule does not change when it is (a resume "
      "checks the schedule: docs/checkpoints-and-models.md)")(
      "optimizer", po::value(&optimizer)->default_value(optimizer), "adamw or sgd")(
      "weight-decay", po::value(&cfg.optim.weight_decay)->default_value(0.1f, "0.1"),
      "decoupled weight decay, on tensors with >= 2 dims only")(
      "beta1", po::value(&cfg.optim.beta1)->default_value(0.9f, "0.9"), "AdamW beta1")(
      "beta2", po::value(&cfg.optim.beta2)->default_value(0.95f, "0.95"), "AdamW beta2")(
      "eps", po::value(&cfg.optim.eps)->default_value(1e-8f, "1e-8"), "AdamW epsilon")(
      "momentum", po::value(&cfg.optim.momentum)->default_value(0.9f, "0.9"), "SGD momentum")(
      "grad-clip", po::value(&cfg.grad_clip)->default_value(1.f, "1.0"), "global gradient-norm clip (0 = off)");
}

}  // namespace shardlab::cli
