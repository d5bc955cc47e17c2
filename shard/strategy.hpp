// strategy.hpp — how a data-parallel run holds and moves the model: dp, ddp, zero1, zero2, zero3.
//
// A Strategy answers the runner's UnitHooks (which parameters a unit computes with, where its
// gradients go, what happens after each unit) and owns the rest of a step: zeroing gradients,
// the global gradient norm, and the optimizer update of whatever this rank holds.
//
//   dp     rank 0 holds the model and the optimizer; each step it broadcasts the parameters,
//          gathers the logits, computes the loss, scatters the loss gradient, and receives the
//          summed gradients. Replicas free their copies after backward (torch.nn.DataParallel).
//   ddp    full replicas; gradients all-reduced in buckets as backward produces them.
//   zero1  optimizer state sharded; gradients reduce-scattered; parameters all-gathered after the step.
//   zero2  as zero1, but each unit's full gradient is reduce-scattered and freed during backward.
//   zero3  parameters sharded too (FSDP full shard): all-gather a unit before use, free after.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.hpp"
#include "shard/flat_param.hpp"
#include "src/comm/communicator.hpp"
#include "src/model/runner.hpp"

namespace shardlab {

struct StrategyConfig {
  std::string name = "ddp";          // dp | ddp | zero1 | zero2 | zero3
  double bucket_mb = 25;             // ddp: gradient bucket size
  bool reshard_after_forward = true; // zero3: free a gathered unit after its forward
  int prefetch = 1;                  // zero3: units gathered ahead of use
  int max_gathered = 0;              // zero3: cap on gathered units at once; 0 = prefetch + 2
  void validate() const;
};

std::vector<std::string> strategy_names();

struct StrategyEnv {
  Backend& be;
  Pool& pool;
  Communicator& comm;
  const ModelSpec& spec;
  const std::vector<std::unique_ptr<Unit>>& units;
  OptimConfig optim;
};

class Strategy : public UnitHooks {
 public:
  explicit Strategy(StrategyEnv env);
  virtual std::string name() const = 0;
  virtual void init_params(uint64_t seed) = 0;  // GPT-2 initialisation of what this rank holds
  void load_params(const std::string& safetensors_path);  // --init: every rank keeps its part
  virtual void begin_step() = 0;
  virtual void begin_micro(int64_t k, bool last) {
    micro_ = k;
    last_micro_ = last;
  }
  // DP computes the loss of the whole batch on rank 0; it needs every rank's targets (global order).
  virtual void set_global_targets(const int32_t* targets, int64_t count) {}
  // Global squared gradient norm, the same on every rank; waits for outstanding reductions.
  virtual double grad_norm_sq() = 0;
  virtual void optimizer_step(int64_t step, float lr, float grad_scale) = 0;
  // Collective: unit u's full parameters (or reduced gradient, before the step) on every rank.
  virtual std::vector<float> gather_unit_params(size_t u) = 0;
  virtual std::vector<float> gather_unit_grads(size_t u) = 0;

 protected:
  virtual void set_unit_values(size_t u, std::span<const float> full) = 0;
  // Views of unit u's tensors (and those it borrows) given where each unit's full buffer is.
  template <class FullOf>
  ParamSet views(size_t u, FullOf full_of) const {
    ParamSet s;
    add_unit_views(s, env_.units[u]->layout(), full_of(u));
    for (const auto& [owner, decl] : borrowed_[u])
      s.set(decl->name, full_of(owner).slice(decl->offset, decl->numel).reshape(decl->shape));
    return s;
  }
  const UnitLayout& layout(size_t u) const { return env_.units[u]->layout(); }
  size_t num_units() const { return env_.units.size(); }
  std::vector<float> to_host(Tensor t) const;
  double sum_squares(const std::vector<Tensor>& tensors) const;  // local, on the host

  StrategyEnv env_;
  int rank_, world_;
  std::vector<std::vector<std::pair<size_t, const TensorDecl*>>> borrowed_;  // per unit: (owner, tensor)
  int64_t micro_ = 0;
  bool last_micro_ = true;
};

std::unique_ptr<Strategy> make_strategy(const StrategyConfig& cfg, StrategyEnv env);
std::unique_ptr<Strategy> make_ddp(const StrategyConfig& cfg, StrategyEnv env);
std::unique_ptr<Strategy> make_zero(const StrategyConfig& cfg, StrategyEnv env, int stage);
std::unique_ptr<Strategy> make_dp(const StrategyConfig& cfg, StrategyEnv env);

}  // namespace shardlab
