// hf_reference.hpp — a model directory transformers wrote and its reference file
// (tests/reference/make_hf_<family>_dir.py): the spec from its config.json, the token stream, the
// batch and ten steps' cross-entropies transformers computed, and what the tests build from them.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/model/model.hpp"
#include "src/model/safetensors.hpp"
#include "src/train/trainer.hpp"

namespace shardlab::test {

struct HfReference {
  // `name`: the directory under tests/reference/ and its "<name>.safetensors"; `read`: the
  // family's spec_from_hf_config.
  HfReference(const std::string& name, ModelSpec (*read)(const nlohmann::json&))
      : dir(root() + name), file(root() + name + ".safetensors") {
    spec = read(nlohmann::json::parse(file.metadata().at("hf_config")));
    const auto b = nlohmann::json::parse(file.metadata().at("batch"));
    B = b["B"], T = b["T"], steps = b["steps"], lr = b["lr"];
    tokens = nlohmann::json::parse(file.metadata().at("tokens")).get<std::vector<int32_t>>();
    ce = nlohmann::json::parse(file.metadata().at("ce")).get<std::vector<double>>();
  }
  static std::string root() { return std::string(SHARDLAB_SOURCE_DIR) + "/tests/reference/"; }
  // The directory loaded into `model`, then its forward and backward on the first batch as
  // shardlab's loader cuts it (sequence j is tokens[j T, j T + T + 1)): shardlab's loss and
  // transformers' ("loss_ce"); the gradients stay in the model.
  struct FirstStep {
    float loss = 0;
    double want = 0;
  };
  FirstStep first_step(Model& model) const {
    model.load(dir);
    std::vector<int32_t> inputs, targets;
    for (int64_t j = 0; j < B; ++j)
      for (int64_t t = 0; t < T; ++t)
        inputs.push_back(tokens[j * T + t]), targets.push_back(tokens[j * T + t + 1]);
    return {model.forward_backward(Batch{inputs.data(), targets.data(), B, T}, 1.f),
            std::stod(file.metadata().at("loss_ce"))};
  }
  // Training from the directory as the reference trained: constant lr, no warmup, no clipping.
  TrainConfig training() const {
    TrainConfig cfg;
    cfg.spec = spec;
    cfg.init = dir;
    cfg.steps = steps;
    cfg.batch = B;
    cfg.schedule.kind = ScheduleKind::constant;
    cfg.schedule.lr = static_cast<float>(lr);
    cfg.schedule.warmup_steps = 0;
    cfg.grad_clip = 0;
    return cfg;
  }
  std::string dir;
  SafetensorsReader file;
  ModelSpec spec;
  int64_t B = 0, T = 0, steps = 0;
  double lr = 0;
  std::vector<int32_t> tokens;
  std::vector<double> ce;
};

}  // namespace shardlab::test
