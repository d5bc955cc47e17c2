// strategy.hpp — how a data-parallel run holds and moves the model: dp, ddp, zero1, zero2, zero3.
//
// A Strategy answers the runner's UnitHooks (which parameters a unit computes with, where its gradients go,
// what happens after each unit) and owns the rest of a step: zeroing gradients, the global gradient norm,
// and the optimizer update of whatever this rank holds (with a ParamEdit's change, param_edit.hpp).
//   dp     rank 0 holds the model and the optimizer; each step it broadcasts the parameters,
//          gathers the logits, computes the loss, scatters the loss gradient, and receives the
//          summed gradients. Replicas free their copies after backward (torch.nn.DataParallel).
//   ddp    full replicas; gradients all-reduced in buckets as backward produces them.
//   zero1  optimizer state sharded; gradients reduce-scattered; parameters all-gathered after the step.
//   zero2  as zero1, but each unit's full gradient is reduce-scattered and freed during backward.
//   zero3  parameters sharded too (FSDP full shard): all-gather a unit before use, free after.
// Mixed precision is a policy (shard/mixed_precision.hpp). Every strategy runs unchanged on every Backend
// (on the meta backend the same code is the memory prediction, src/train/predict).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.hpp"
#include "shard/flat_param.hpp"
#include "shard/mixed_precision.hpp"
#include "shard/param_edit.hpp"
#include "src/comm/communicator.hpp"
#include "src/comm/mesh.hpp"
#include "src/model/runner.hpp"

namespace shardlab {

enum class StrategyKind : uint8_t { dp, ddp, zero1, zero2, zero3 };
// InputError naming every accepted name (and the closest one) otherwise; `aliases` are names the
// caller resolves itself before calling (the command line's hsdp), listed among the choices.
StrategyKind parse_strategy(const std::string& s, const std::vector<std::string>& aliases = {});
const char* strategy_name(StrategyKind k);
int zero_stage(StrategyKind k);  // 1, 2, 3 for zero1-3; 0 for dp and ddp
const std::vector<StrategyKind>& all_strategies();  // dp, ddp, zero1, zero2, zero3
std::vector<StrategyKind> parse_strategy_list(const std::string& comma_separated);
// The strategies' model-state and traffic formulas: shard/strategy_formulas.hpp.

// --offload (ZeRO-Offload / ZeRO-Infinity): what lives on the host tier of the rank's memory.
//   optimizer  (zero1-3) the f32 master weights and the optimizer state; each unit's reduced
//              gradient shard is copied to the host as its reduction completes, the update runs
//              there (Backend::host()), and the updated parameters return in the parameter dtype.
//   params     (zero3) the parameter shards too: each is copied to the device just before its
//              all-gather (prefetched with it), and freed from the device when the gather is done.
enum class Offload : uint8_t { none, optimizer, params };
Offload parse_offload(const std::string& s);  // InputError naming the choices otherwise
const char* offload_name(Offload o);
// The strongest offload `kind` allows, up to `asked` (params needs zero3, optimizer a ZeRO stage).
Offload offload_for(StrategyKind kind, Offload asked);

// ZeRO++ (Wang et al. 2023), zero3's levers on its three collectives (shard/zero.cpp):
//   qwZ  weight_bits 8: each rank's parameter shard is block-quantized (ops/quantize.hpp) before the
//        all-gather and dequantized after; the shard itself, which the optimizer updates, stays exact.
//   hpZ  secondary: after a unit's forward, each rank keeps the slice of its gathered parameters that
//        is its place in its node (Category::secondary_shard, M / ranks on the node), and backward
//        all-gathers from those within the node (dp_shard_node).
//   qgZ  grad_bits 4 or 8: the gradient reduce-scatter becomes two all-to-alls of block-quantized
//        gradients, within the node (dequantized and summed there, in f32) then across nodes
//        (dp_shard_cross). error_feedback (off by default) carries each rank's quantization error of
//        its own gradient into its next reduction: a full f32 gradient per unit more per rank.
// hpZ and qgZ need the layout's ranks per node (--ranks-per-node).
struct ZeroPP {
  int weight_bits = 0;  // --quantize-weights int8: 8; 0 off
  int grad_bits = 0;    // --quantize-grads int4 | int8: 4 or 8; 0 off
  bool secondary = false;  // --secondary-shard node
  int64_t block = 256;     // --quantize-block: elements per f32 scale
  bool error_feedback = false;  // --error-feedback (qgZ, f32 gradients)
  bool any() const { return weight_bits > 0 || grad_bits > 0 || secondary; }
  bool hierarchical() const { return grad_bits > 0 || secondary; }
  std::string label() const;  // "qwZ hpZ qgZ4", "" when off
  bool operator==(const ZeroPP&) const = default;
};

// --prefetch auto (the default): as deep as the device budget allows, never past kPrefetchDepth,
// decided from the predicted step before the run (src/train/predict.hpp, auto_prefetch); the
// Trainer resolves it before the strategy is built, so a Strategy never sees kPrefetchAuto.
inline constexpr int kPrefetchAuto = -1;
inline constexpr int kPrefetchDepth = 1;

struct StrategyConfig {
  StrategyKind kind = StrategyKind::ddp;
  double bucket_mb = 25;             // ddp: gradient bucket size
  bool reshard_after_forward = true; // zero3: free a gathered unit after its forward
  int prefetch = kPrefetchAuto;      // zero3: units gathered ahead of use (kPrefetchAuto: the budget's)
  int max_gathered = 0;              // zero3: cap on gathered units at once; 0 = prefetch + 2
  MixedPrecisionPolicy precision;
  Offload offload = Offload::none;
  ZeroPP zeropp;  // zero3 only
  // The options alone; the rules between the strategy and the mesh are ParallelLayout::validate's.
  void validate() const;
  // This configuration under `k`, with --offload applied as far as k allows and ZeRO++ for zero3 only (hybrid sharding:
  // ParallelLayout::dims_under).
  StrategyConfig under(StrategyKind k) const;
  // "zero3", "zero3 off:params", "zero2 S=2" (hybrid over shard groups of dims.dp_shard): a report row's label.
  std::string label(const ParallelDims& dims) const;
};

struct StrategyEnv {
  Backend& be;
  Pool& pool;
  // The ranks that hold the same tensors and add up their gradients: the data-parallel group x cp,
  // without expert parallelism's ranks (mesh.edp_cp(); dp_cp at --ep 1).
  Communicator& comm;
  Mesh& mesh;
  const ModelSpec& spec;
  const std::vector<std::unique_ptr<Unit>>& units;
  OptimConfig optim;
};

class Strategy : public UnitHooks {
 public:
  Strategy(const StrategyConfig& cfg, StrategyEnv env);
  StrategyKind kind() const { return cfg_.kind; }
  std::string name() const { return strategy_name(cfg_.kind); }
  void init_params(uint64_t seed);                        // each tensor's declared init; every rank keeps its part
  void load_params(const std::string& path);  // --init (a file or HF directory): every rank keeps its part
  // The auxiliary loss's statistics add up over every rank with other tokens (ep's included).
  void reduce_aux(std::span<float> packed) override { env_.mesh.dp_cp().all_reduce(packed).wait(); }
  virtual void begin_step() = 0;
  virtual void begin_micro(int64_t k, bool last) {
    micro_ = k;
    last_micro_ = last;
  }
  // Evaluation (Trainer::evaluate): between these calls the runner runs forward passes only
  // (run_forward). No gradient and no optimizer state is touched, and every unit is released
  // after its forward, since no backward follows. DP brings its replicas the parameters.
  virtual void begin_eval() { eval_ = true; }
  virtual void end_eval() { eval_ = false; }
  // Global squared gradient norm, the same on every rank; waits for outstanding reductions. Under
  // tensor parallelism: of this rank's part of the model, over its data-parallel group.
  virtual double grad_norm_sq() = 0;
  // Under tensor parallelism: the share of grad_norm_sq() of the tensors every rank of the
  // tensor-parallel group holds whole (norms, row-parallel biases, wpe), the same on each of them,
  // so the trainer counts it once. 0 without tensor parallelism.
  double replicated_grad_norm_sq() {
    if (env_.units.empty() || layout(0).tp_degree == 1) return 0;
    return grad_norm_sq_of([](const TensorDecl& t) { return !t.tp.split(); });
  }
  // Under expert parallelism: the share of grad_norm_sq() of this rank's experts (which the other
  // ranks of its ep group do not hold).
  double expert_grad_norm_sq() { return grad_norm_sq_of([](const TensorDecl& t) { return t.expert; }); }
  // The share of grad_norm_sq() of the tensors `pick` selects, summed as grad_norm_sq() sums.
  using TensorPick = bool (*)(const TensorDecl&);
  virtual double grad_norm_sq_of(TensorPick pick) = 0;
  // The update of what this rank owns (and `edit`), then whatever brings every copy up to date.
  void optimizer_step(int64_t step, float lr, float grad_scale, const ParamEdit& edit = {});
  // Collective: unit u's full parameters (or reduced gradient, before the step) on every rank.
  virtual std::vector<float> gather_unit_params(size_t u) = 0;
  virtual std::vector<float> gather_unit_grads(size_t u) = 0;
  // Unit u's reduced gradient over owned_range(u), in the reduce dtype, where the optimizer reads
  // it (the host tier under offload), after outstanding reductions complete; writable: pipeline
  // parallelism sums a tied copy's gradient into it before the norm.
  virtual Tensor reduced_grad(size_t u) = 0;
  // ---- checkpoints: what this rank owns and updates ----
  // Elements [begin, end) of unit u's real parameters this rank updates (empty for DP replicas).
  virtual std::pair<int64_t, int64_t> owned_range(size_t u) const = 0;
  // The part of owned_range(u) this rank writes to a checkpoint: all of it, except where ranks
  // hold replicas of one range (DDP), which only rank 0 writes.
  virtual std::pair<int64_t, int64_t> saved_range(size_t u) const { return owned_range(u); }
  // f32 buffers whose first end - begin elements are that range: the parameters the optimizer
  // updates (the master copy under mixed precision), then each optimizer state; none for a rank
  // without an optimizer (DP's replicas).
  std::vector<Tensor> owned_state(size_t u) const;
  std::vector<std::string> owned_state_names() const;  // "param", then the optimizer's state names
  void sync_after_load();  // after owned_state was overwritten (a load): every copy of the parameters updated
  void release_state_views() const;  // after a save read owned_state(u): frees what was staged for it
  void state_views_written();        // after a load wrote owned_state(u), before the next unit's: takes it back

 protected:
  virtual void set_unit_values(size_t u, std::span<const float> full) = 0;
  // This rank's parameters of unit u in the param dtype (what the master copy is cast into), and
  // what the optimizer updates: the f32 master copy under mixed precision, else those parameters.
  virtual Tensor owned_params(size_t u) const = 0;
  virtual Tensor updated(size_t u) const = 0;
  // After the owned parameters changed (an update, a load): zero1/2 all-gather them.
  virtual void after_update() {}
  // owned_params(u) <- updated(u), where they differ (mixed precision, offload).
  virtual void params_from_master(size_t u) { mp_.params_from_master(owned_params(u), updated(u)); }

  // Views of unit u's tensors (and those it borrows) given where each unit's full buffer is.
  template <class FullOf>
  ParamSet views(size_t u, FullOf full_of) const {
    ParamSet s;
    add_unit_views(s, env_.units[u]->layout(), full_of(u));
    for (const BorrowedTensor& b : borrowed_[u])
      s.set(b.decl->name, full_of(b.owner).slice(b.decl->offset, b.decl->numel).reshape(b.decl->shape));
    return s;
  }
  // Views of the f32 compute copies of unit u's parameters held in storage(x) for each unit x. On a
  // backend with fast low-precision GEMMs the storage (bf16, gathered) goes to the GEMMs as it is
  // (ParamSet::gemm), and only what u reads in f32 is widened (f32_reads_; for its backward, none
  // where Unit::backward_reads_params says so) for the other kernels.
  ParamSet compute_views(size_t u, const std::function<Tensor(size_t)>& storage_of, bool backward = false);
  template <class StorageOf>  // unit u's own tensors claimable as zeros where its workspace is new
  ParamSet grad_views(size_t u, StorageOf storage_of) {
    const bool fresh = mp_.fresh_grads(u, storage_of(u));
    ParamSet s = views(u, [&](size_t x) { return mp_.compute_grads(x, storage_of(x), layout(x).name); });
    if (fresh) s.set_zeroed(layout(u));
    return s;
  }
  void flush_grads(size_t u, Tensor storage) { mp_.flush_grads(u, storage); }
  // Releases the f32 compute copies of unit u and of the units it borrows from.
  void release_unit_params(size_t u) {
    mp_.release_params(u);
    for (const BorrowedTensor& b : borrowed_[u]) mp_.release_params(b.owner);
  }
  const UnitLayout& layout(size_t u) const { return env_.units[u]->layout(); }
  // Under pipeline parallelism (--pp > 1) micro-batches interleave forwards and backwards: zero2/3
  // accumulate each unit's full gradient over the step and reduce-scatter it once, after the unit's
  // last micro-batch (never once per micro-batch), and zero3 keeps a unit gathered from its first
  // forward to its last backward of the step: one all-gather per unit and step (torchtitan's
  // reshard_after_forward=False under PP).
  bool pipelined() const { return env_.mesh.dims().pp > 1; }
  // Muon's GroupPlace for unit u's elements [first, ...) of a buffer of `whole`; empty for the others.
  GroupPlace optimizer_place(size_t u, int64_t first, int64_t whole, MatrixExchange* ex) const;
  // Views of the elements of the tensors `pick` selects inside `owned`, which holds unit u's flat
  // elements from `begin` on.
  std::vector<Tensor> part_of(size_t u, Tensor owned, int64_t begin, TensorPick pick) const;
  size_t num_units() const { return env_.units.size(); }
  bool mixed() const { return mp_.mixed(); }
  DType param_dtype() const { return cfg_.precision.param_dtype; }
  DType reduce_dtype() const { return cfg_.precision.reduce_dtype; }
  std::vector<float> to_host(Tensor t) const;  // any dtype, widened to f32
  // Local; any dtype; tensors in `tier` (the device pool's unless given).
  double sum_squares(const std::vector<Tensor>& tensors, Pool* tier = nullptr) const;

  StrategyConfig cfg_;
  StrategyEnv env_;
  int rank_, world_;
  std::vector<std::vector<BorrowedTensor>> borrowed_;  // per unit
  // Per unit u, each unit x (u or an owner it borrows from) but where it reads all of x in f32: the
  // ranges of x it does (Unit::gemm_only), and the names of those it does not.
  std::vector<std::map<size_t, std::vector<ElemRange>>> f32_reads_;
  std::vector<std::shared_ptr<const std::set<std::string>>> gemm_only_;
  int64_t micro_ = 0;
  bool last_micro_ = true;
  bool eval_ = false;  // between begin_eval and end_eval
  MixedPrecision mp_;
  // One group per unit, over updated(u) and its gradient; null where nothing is updated (DP's replicas).
  std::unique_ptr<Optimizer> optim_;
  std::unique_ptr<MatrixExchange> tp_exchange_;  // Muon under tensor parallelism: a matrix's parts made whole
};

std::unique_ptr<Strategy> make_strategy(const StrategyConfig& cfg, StrategyEnv env);
std::unique_ptr<Strategy> make_ddp(const StrategyConfig& cfg, StrategyEnv env);
std::unique_ptr<Strategy> make_zero(const StrategyConfig& cfg, StrategyEnv env);
std::unique_ptr<Strategy> make_dp(const StrategyConfig& cfg, StrategyEnv env);

}  // namespace shardlab
