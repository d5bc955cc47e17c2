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
      "optimizer", po::value(&optimizer)->default_value(optimizer),
      "adamw, sgd or muon (torch.optim.Muon on every 2-D weight but the embeddings and the LM head, AdamW with "
      "--beta1/--beta2/--eps on the rest: docs/muon.md)")(
      "weight-decay", po::value(&cfg.optim.weight_decay)->default_value(0.1f, "0.1"),
      "decoupled weight decay, on tensors with >= 2 dims only")(
      "beta1", po::value(&cfg.optim.beta1)->default_value(0.9f, "0.9"), "AdamW beta1")(
      "beta2", po::value(&cfg.optim.beta2)->default_value(0.95f, "0.95"), "AdamW beta2")(
      "eps", po::value(&cfg.optim.eps)->default_value(1e-8f, "1e-8"), "AdamW epsilon")(
      "momentum", po::value(&cfg.optim.momentum)->default_value(0.9f, "0.9"),
      "SGD's momentum; Muon's (0.95 there when not given, torch's default)")(
      "muon-ns-steps", po::value(&cfg.optim.muon.ns_steps)->default_value(5), "Muon: Newton-Schulz steps")(
      "muon-ns-dtype", po::value<std::string>()->default_value("bf16")->notifier([&cfg](const std::string& v) {
        cfg.optim.muon.ns_dtype = parse_dtype(v);
      }), "Muon: the iteration's arithmetic, bf16 (torch's) or f32")(
      "muon-adjust-lr", po::value<std::string>()->default_value("original")->notifier([&cfg](const std::string& v) {
        cfg.optim.muon.adjust_lr = parse_muon_adjust_lr(v);
      }), "Muon: the learning rate per matrix of shape (A, B), original: lr sqrt(max(1, A/B)); match_rms_adamw: "
      "0.2 lr sqrt(max(A, B))")(
      "grad-clip", po::value(&cfg.grad_clip)->default_value(1.f, "1.0"), "global gradient-norm clip (0 = off)");
}

}  // namespace shardlab::cli
