// model.hpp — Model: a full (unsharded) model of any family on one rank: f32 parameters and
// gradients per unit in one flat buffer each, forward + loss + backward over the units, HF-named
// safetensors load and save (a file or an HF model directory, hf_dir.hpp). Single-rank training and the reference tests use it; the sharding
// strategies hold the same units' parameters in FlatParams instead.
#pragma once
#include <memory>
#include <vector>

#include "src/model/family.hpp"
#include "src/model/hf_dir.hpp"
#include "src/model/runner.hpp"
#include "src/model/safetensors.hpp"

namespace shardlab {

// Reads every tensor of `unit` from HF-named weights (a file or a directory) into `out` (the
// unit's flat layout), under any name the family's adapter accepts (GPT-2: a "transformer." prefix
// or none); throws InputError naming a missing tensor or a shape mismatch.
void read_unit(HfWeights& w, const UnitLayout& unit, std::span<float> out, const ModelSpec& spec);

// Writes every unit's parameters (values[u]: unit u's flat f32 buffer) as HF-named safetensors:
// a .safetensors file, or an HF model directory (config.json, shards past 5 GB) otherwise.
// `overwrite`: replace weights no shardlab export wrote there (HfWriteOptions::overwrite);
// base_config (from base_source): the config.json the model came with (HfWriteOptions::base_config).
// Returns HfModelWriter::config_note.
std::string write_units(const std::string& path, const ModelSpec& spec,
                        const std::vector<std::unique_ptr<Unit>>& units, const std::vector<std::vector<float>>& values,
                        DType dtype = DType::f32, bool overwrite = false, const std::string& base_config = "",
                        const std::string& base_source = "");

class Model : private UnitHooks {
 public:
  // Under tensor parallelism (tp active) this rank's part of the model (family layout for
  // tp.config): init() and load() fill that part of every tensor as the whole model would have it,
  // and forward_backward() computes with the group (its loss is the whole model's).
  Model(const ModelSpec& spec, Backend& be, Pool& pool, const TpContext& tp = {});

  const ModelSpec& spec() const { return spec_; }
  size_t num_units() const { return units_.size(); }
  Unit& unit(size_t i) { return *units_[i]; }
  int64_t num_params() const;

  void init(uint64_t seed);  // the family's initialisation through the counter-based RNG
  // Loads every parameter from an HF-named file or HF model directory ("transformer." prefix and
  // attention-mask buffers accepted); throws InputError naming a missing tensor or a shape mismatch.
  void load(const std::string& path);
  void save(const std::string& path, DType dtype = DType::f32) const;  // tensor-parallel degree 1 only

  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  Tensor unit_params(size_t i) const { return params_[i].flat(DType::f32); }
  Tensor unit_grads(size_t i) const { return grads_[i].flat(DType::f32); }
  void zero_grads();

  // Forward, mean cross-entropy, backward for one micro-batch. Gradients accumulate, scaled by
  // grad_scale (1 / accumulation steps). Returns the mean loss; copies the logits to *logits when given.
  float forward_backward(const Batch& batch, float grad_scale, std::vector<float>* logits = nullptr,
                         Checkpointing checkpointing = Checkpointing::none);

 private:
  ParamSet view_set(size_t i, const std::vector<Block>& storage) const;
  Tensor find(const std::string& name, const std::vector<Block>& storage, const char* what) const;
  ParamSet forward_params(size_t u) override { return view_set(u, params_); }
  ParamSet backward_params(size_t u) override { return view_set(u, params_); }
  ParamSet grads(size_t u) override { return view_set(u, grads_); }

  ModelSpec spec_;
  Backend& be_;
  Pool& pool_;
  TpContext tp_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<Block> params_, grads_;  // one flat f32 buffer per unit
};

}  // namespace shardlab
