// optimizer.hpp — AdamW, SGD and Muon over flat f32 buffers, global-norm clipping, LR schedules.
//
// The optimizer sees buffers, not tensors: each registered buffer comes with its segments (ranges
// and whether weight decay applies), so the same code steps a full replica or one rank's shard of
// a padded flat parameter. State (Adam's m and v, SGD's momentum) is allocated from the pool as
// optim_state, the same size as the buffer.
//
// Muon (optim/muon.hpp) needs more than ranges: the group's place in its unit (GroupPlace: the
// whole matrices and the exchange that brings a slice's unit whole). Its matrices keep one buffer
// (the momentum); the group's other tensors are AdamW's, with their m in the same buffer and their
// v in a second one only as large as they are.
#pragma once
#include <string>
#include <vector>

#include "memory/pool.hpp"
#include "optim/muon.hpp"

namespace shardlab {

enum class OptimizerKind : uint8_t { adamw, sgd, muon };
OptimizerKind parse_optimizer(const std::string& s);  // "adamw" | "sgd" | "muon"; InputError otherwise
const char* optimizer_name(OptimizerKind k);

struct OptimConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;
  float momentum = 0.9f;  // sgd; muon (torch's default there is 0.95: the command line's)
  MuonConfig muon;        // muon: the iteration; AdamW's flags above serve its other tensors
  void validate() const;
};

struct ParamSegment {
  int64_t offset = 0, numel = 0;  // within the registered buffer
  bool decay = false;
};

// A group's place in its unit, for Muon: the group holds elements [first, first + numel) of a unit's
// flat buffer of `whole` elements (padding included); `matrices` are the unit's (offsets in it);
// `exchange` brings the unit whole from the ranks holding its other slices (null: the group is the
// whole unit); `tp`, under tensor parallelism, a split matrix whole from its parts.
struct GroupPlace {
  int64_t first = 0, whole = 0;
  std::vector<MuonMatrix> matrices;
  MatrixExchange* exchange = nullptr;
  MatrixExchange* tp = nullptr;
};

class Optimizer {
 public:
  Optimizer(Pool& pool, OptimConfig cfg) : pool_(pool), cfg_(std::move(cfg)) { cfg_.validate(); }
  // param is f32 (the master copy under mixed precision); grad may be f32, bf16 or f16.
  void add(Tensor param, Tensor grad, std::vector<ParamSegment> segments, const std::string& tag,
           GroupPlace place = {});
  // Muon: every group's matrices get their owners (assign_owners over the groups' exchange ranks);
  // called once all groups are added.
  void assign_matrix_owners();
  // One update of every buffer: step is 1-based; grads are multiplied by grad_scale first.
  void step(int64_t step, float lr, float grad_scale);
  // Under AdamW: group g's update also writes its parameters rounded into `rounded` (bf16, the
  // param's numel: the parameters a mixed-precision run computes with), in the update's own pass;
  // rounds() says whether the next step() does (false for Muon and SGD: the caller casts).
  void set_rounded_copy(size_t g, Tensor rounded) { groups_.at(g).rounded = rounded; }
  bool rounds(size_t g) const { return cfg_.kind == OptimizerKind::adamw && groups_.at(g).rounded.data() != nullptr; }
  const OptimConfig& config() const { return cfg_; }
  // Names of the state buffers each group keeps ("adam_m", "adam_v", "momentum"; Muon's
  // "momentum" holds its matrices' momentum and the AdamW tensors' m), and group g's buffer number
  // i (f32, the size of the group's parameters), for checkpoints. Muon's "adam_v" is staged at that
  // size (zero on its matrices) while a checkpoint reads or writes it, a unit at a time:
  // state_written() takes back what a load wrote, release_staging() frees it.
  std::vector<std::string> state_names() const { return state_names(cfg_.kind); }
  static std::vector<std::string> state_names(OptimizerKind kind);
  Tensor state(size_t group, size_t i) const;
  void state_written();
  void release_staging() const { staged_.clear(); }
  size_t groups() const { return groups_.size(); }

 private:
  struct Group {
    Tensor param, grad;
    std::vector<ParamSegment> segments;
    Block m, v;  // v unused by sgd; compact under muon (v_at)
    GroupPlace place;
    std::vector<int> matrix_of;     // muon: per segment, its matrix in place.matrices, or -1 (AdamW's)
    std::vector<int64_t> v_at;      // muon: per AdamW segment, its offset in v
    Tensor rounded;                 // set_rounded_copy's, or none
  };
  void step_muon(Group& g, Tensor grad, int64_t step, float lr, float grad_scale);
  void orthogonalize(const GroupPlace& place, const MuonMatrix& m, Tensor part);
  Pool& pool_;
  OptimConfig cfg_;
  std::vector<Group> groups_;
  mutable std::vector<std::pair<size_t, Block>> staged_;  // muon's adam_v at group size, per group
};

enum class ScheduleKind : uint8_t { constant, cosine };
ScheduleKind parse_schedule(const std::string& s);  // "constant" | "cosine"; InputError otherwise
const char* schedule_name(ScheduleKind k);

struct LrSchedule {
  ScheduleKind kind = ScheduleKind::cosine;
  float lr = 3e-4f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  float min_lr_frac = 0.1f;  // cosine decays to lr * min_lr_frac at the last step
  void validate() const;
  float at(int64_t step) const;  // step is 0-based
};

// The factor that scales gradients to a global norm of at most max_norm (1 when max_norm <= 0).
float clip_factor(double global_norm, float max_norm);

}  // namespace shardlab
