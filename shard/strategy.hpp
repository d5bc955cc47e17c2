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
//
// Mixed precision is a policy per buffer: parameters are stored (and gathered) in param_dtype,
// gradients stored and reduced in reduce_dtype, and when param_dtype is not f32 an f32 master copy
// of what this rank updates lives beside the optimizer state. Kernels compute in f32: a unit's
// bf16 parameters are widened into a workspace while it runs, and its gradients accumulate in an
// f32 workspace that is folded into the reduce-dtype buffer after its backward.
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
  DType param_dtype = DType::f32;    // storage of the parameters units compute with
  DType reduce_dtype = DType::f32;   // storage and communication of gradients
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
  Strategy(const StrategyConfig& cfg, StrategyEnv env);
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

  // ---- checkpoints: what this rank owns and updates ----
  // Elements [begin, end) of unit u's real parameters this rank updates (empty for DP replicas).
  virtual std::pair<int64_t, int64_t> owned_range(size_t u) const = 0;
  // f32 buffers whose first end - begin elements are that range: the parameters the optimizer
  // updates (the master copy under mixed precision), then each optimizer state.
  virtual std::vector<Tensor> owned_state(size_t u) const = 0;
  // "param", then the optimizer's state names.
  std::vector<std::string> owned_state_names() const { return with_param(Optimizer::state_names(env_.optim.kind)); }
  // After owned_state buffers were overwritten (a load): bring every copy of the parameters up to date.
  virtual void sync_after_load() = 0;

 protected:
  virtual void set_unit_values(size_t u, std::span<const float> full) = 0;
  // Views of unit u's tensors (and those it borrows) given where each unit's full buffer is.
  template <class FullOf>
  ParamSet views(size_t u, FullOf full_of) const {
    ParamSet s;
    add_unit_views(s, env_.units[u]->layout(), full_of(u));
    for (const BorrowedTensor& b : borrowed_[u])
      s.set(b.decl->name, full_of(b.owner).slice(b.decl->offset, b.decl->numel).reshape(b.decl->shape));
    return s;
  }
  const UnitLayout& layout(size_t u) const { return env_.units[u]->layout(); }
  size_t num_units() const { return env_.units.size(); }
  std::vector<float> to_host(Tensor t) const;  // any dtype, widened to f32
  double sum_squares(const std::vector<Tensor>& tensors) const;  // local; any dtype

  // ---- mixed precision (no-ops when the storage is f32) ----
  // f32 view of unit u's parameters stored in `storage`; widened into a workspace held until
  // release_compute_params(u).
  Tensor compute_params(size_t u, Tensor storage);
  void release_compute_params(size_t u);
  // f32 tensor unit u's backward accumulates into; flush_grads(u, storage) adds it to `storage`.
  Tensor compute_grads(size_t u, Tensor storage);
  void flush_grads(size_t u, Tensor storage);
  // Writes f32 values into a parameter buffer of any dtype (and into its master copy, if any).
  void write_values(Tensor storage, Tensor master, std::span<const float> values);
  // dst += src for buffers of any (equal) dtype, computed in f32.
  void accumulate(Tensor dst, Tensor src);
  // Releases the f32 compute copies of unit u and of the units it borrows from.
  void release_unit_params(size_t u) {
    release_compute_params(u);
    for (const BorrowedTensor& b : borrowed_[u]) release_compute_params(b.owner);
  }
  bool mixed() const { return cfg_.param_dtype != DType::f32; }
  static std::vector<std::string> with_param(std::vector<std::string> optim_names) {
    optim_names.insert(optim_names.begin(), "param");
    return optim_names;
  }
  // owned_state of a strategy whose optimizer keeps unit u as group u.
  static std::vector<Tensor> state_of(Tensor updated, const Optimizer& o, size_t u) {
    std::vector<Tensor> t = {updated};
    for (size_t i = 0; i < o.state_names().size(); ++i) t.push_back(o.state(u, i));
    return t;
  }

  StrategyConfig cfg_;
  StrategyEnv env_;
  int rank_, world_;
  std::vector<std::vector<BorrowedTensor>> borrowed_;  // per unit
  int64_t micro_ = 0;
  bool last_micro_ = true;

 private:
  std::vector<Block> param_ws_, grad_ws_;  // per unit: f32 workspaces of mixed precision
};

std::unique_ptr<Strategy> make_strategy(const StrategyConfig& cfg, StrategyEnv env);
std::unique_ptr<Strategy> make_ddp(const StrategyConfig& cfg, StrategyEnv env);
std::unique_ptr<Strategy> make_zero(const StrategyConfig& cfg, StrategyEnv env, int stage);
std::unique_ptr<Strategy> make_dp(const StrategyConfig& cfg, StrategyEnv env);

}  // namespace shardlab
