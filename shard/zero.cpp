// zero.cpp — ZeRO stages 1, 2 and 3 over per-unit FlatParams.
//
//   stage 1  full parameters and full gradients on every rank; after the last micro-step each
//            unit's gradient is reduce-scattered in place (this rank keeps its shard, inside the
//            full buffer), the optimizer updates this rank's shard of the parameters in place,
//            and an in-place all-gather brings every rank the updated whole.
//   stage 2  as stage 1, but a unit's full gradient exists only from its backward until its
//            reduce-scatter completes; the shard accumulates across micro-steps.
//   stage 3  parameters are sharded too. A unit is all-gathered before its forward and again
//            before its backward and freed after each (the last unit stays gathered from its
//            forward into its backward); the next unit's gather is issued ahead (--prefetch),
//            never holding more than --max-gathered units at once. In evaluation (forward only)
//            every unit, the last included, is freed after its forward.
// With --offload optimizer the f32 master shard, the optimizer state and the reduced gradient shard
// live on the host tier (env_.pool.host()) and the update runs on the host backend; with --offload
// params (stage 3) the parameter shards live there too and are uploaded into a device staging
// buffer as each all-gather is issued.
// Hybrid sharding (--dp-shard S, alias --shard-group; FSDP's HYBRID_SHARD): all of the above
// happens within the mesh's dp_shard group of S consecutive data-parallel ranks, whose
// communicator carries every gather and reduce-scatter; after a unit's gradient is
// reduce-scattered in the group, its shard is all-reduced over the dp_replicate group (the ranks
// holding the same shard), so every replica updates the same shard identically. dp_shard = the
// data-parallel group (the default) is plain ZeRO, with no replica group.
// ZeRO++ (--quantize-weights, --secondary-shard, --quantize-grads; shard/zeropp.hpp): stage 3's
// gathers take quantized records (qwZ) or, once a unit's forward has left this rank its slice of
// the node's copy, the node's secondary shards (hpZ, kept until the unit's backward); the gradient
// reduce-scatter becomes the two quantized all-to-alls (qgZ): the node's issued in the unit's
// after_backward, the one across nodes when the next unit's backward ends, completed as a plain
// reduction is (at most two in flight).
// A gathered unit is a buffer plus the Work that fills it, in one struct, with an explicit state
// (sharded -> gathering -> gathered -> sharded): the buffer cannot be freed while its collective
// runs, users wait on the Work, not on a global sync, and a wrong transition is a CHECK failure.
#include <deque>

#include "shard/matrix_exchange.hpp"
#include "shard/strategy.hpp"
#include "shard/zeropp.hpp"

namespace shardlab {
namespace {

class Zero final : public Strategy {
 public:
  Zero(const StrategyConfig& cfg, StrategyEnv env)
      : Strategy(cfg, std::move(env)),
        stage_(zero_stage(cfg.kind)),
        param_type_(param_dtype()),
        reduce_type_(reduce_dtype()),
        offload_(cfg.offload != Offload::none),
        offload_params_(cfg.offload == Offload::params),
        host_pool_(env_.pool.host()),
        host_mp_(cfg.precision, host_pool_, env_.units.size()) {
    open_groups();
    if (cfg.zeropp.any()) zeropp_ = std::make_unique<ZeroPPComms>(cfg.zeropp, env_.mesh, env_.pool, shard_comm());
    optim_ = std::make_unique<Optimizer>(opt_pool(), env_.optim);
    const size_t U = num_units();
    for (size_t u = 0; u < U; ++u)  // ZeRO shards every unit: each rank must own real elements
      SHARD_REQUIRE(layout(u).numel >= shard_size_,
                    "unit {} has {} parameters, fewer than the {} ranks that would shard it", layout(u).name,
                    layout(u).numel, shard_size_);
    SHARD_CHECK(cfg.prefetch >= 0, "zero3 built with an unresolved --prefetch auto");
    max_gathered_ = cfg.max_gathered > 0 ? cfg.max_gathered : cfg.prefetch + 2;
    exchange_ = std::make_unique<CommExchange>(shard_comm());
    gathered_.resize(U);
    secondary_.resize(U);
    for (size_t u = 0; u < U; ++u) {
      flat_.push_back(make_flat_param(layout(u), shard_size_, shard_rank_));
      const FlatParam& f = flat_[u];
      const std::string& n = layout(u).name;
      if (stage_ == 3) {
        param_shard_.push_back((offload_params_ ? host_pool_ : env_.pool)
                                   .alloc(param_type_, f.shard, Category::param_shard, n + " param shard"));
      } else {
        params_.push_back(env_.pool.alloc(param_type_, f.padded, Category::param_full, n + " params"));
        env_.be.fill(params_.back().flat(param_type_), 0.f);  // padding stays zero
      }
      master_.push_back(has_master() ? opt_pool().alloc(DType::f32, f.shard, Category::master_weights, n + " master shard")
                                     : Block());
      if (stage_ == 1) {
        grads_full_.push_back(env_.pool.alloc(reduce_type_, f.padded, Category::grad_full, n + " grads"));
        // Offload: the reduced shard is copied out of the full buffer to the host.
        host_grad_.push_back(offload_ ? host_pool_.alloc(reduce_type_, f.shard, Category::grad_shard, n + " grad shard")
                                      : Block());
      } else {
        grads_full_.emplace_back();  // allocated during backward
        grad_shard_.push_back(opt_pool().alloc(reduce_type_, f.shard, Category::grad_shard, n + " grad shard"));
      }
      optim_->add(updated(u), reduced_grads(u), unit_segments(layout(u), f.shard_begin(), f.shard), n,
                  optimizer_place(u, f.shard_begin(), f.padded, exchange_.get()));
      if (cfg.zeropp.error_feedback) {
        feedback_.push_back(env_.pool.alloc(DType::f32, f.padded, Category::grad_full, n + " error feedback"));
        env_.be.fill(feedback_.back().flat(DType::f32), 0.f);
      }
    }
    optim_->assign_matrix_owners();
  }

  void begin_step() override {
    for (Block& b : secondary_) b.reset();  // from before the update: stale
    for (size_t u = 0; u < num_units(); ++u) {
      if (stage_ == 1) env_.be.fill(grads_full_[u].flat(reduce_type_), 0.f);
      else opt_pool().backend().fill(grad_shard_[u].flat(reduce_type_), 0.f);
    }
  }

  // ---- hooks ----
  ParamSet forward_params(size_t u) override {
    if (stage_ != 3) return compute_views(u, [&](size_t x) { return params_[x].flat(param_type_); });
    acquire(u);
    for (int k = 1; k <= cfg_.prefetch && u + k < num_units(); ++k) prefetch(u + k);
    return compute_views(u, [&](size_t x) { return gathered_tensor(x); });
  }

  void after_forward(size_t u) override {
    release_unit_params(u);
    if (stage_ != 3) return;
    // The last unit runs backward right after its forward: keep it (and what it borrows) gathered.
    // A forward-only pass (evaluation) has no backward to keep anything for.
    bool keep = !eval_ && (!cfg_.reshard_after_forward || pipelined() || u + 1 == num_units());
    release(u, keep, /*forward=*/true);
  }

  ParamSet backward_params(size_t u) override {
    if (stage_ != 3) return compute_views(u, [&](size_t x) { return params_[x].flat(param_type_); }, true);
    acquire(u);
    for (int k = 1; k <= cfg_.prefetch && u >= static_cast<size_t>(k); ++k) prefetch(u - k);
    return compute_views(u, [&](size_t x) { return gathered_tensor(x); }, true);
  }

  ParamSet grads(size_t u) override {
    // Offload trades speed for memory: the previous unit's reduction (which overlapped this unit's
    // gather and recomputation) completes and leaves for the host before this gradient exists.
    if (offload_) drain();
    if (stage_ != 1) {
      ensure_grad_full(u);
      for (const BorrowedTensor& b : borrowed_[u]) ensure_grad_full(b.owner);
    }
    return grad_views(u, [&](size_t x) { return grads_full_[x].flat(reduce_type_); });
  }

  void after_input_grad(size_t u) override {  // a split backward's B: its part of the gradient flushed
    release_unit_params(u);
    flush_grads(u, grads_full_[u].flat(reduce_type_));
  }

  void after_backward(size_t u) override {
    release_unit_params(u);
    if (stage_ == 3) release(u, pipelined() && !last_micro_);
    if (stage_ == 3) secondary_[u].reset();  // whoever borrows it ran its backward before
    flush_grads(u, grads_full_[u].flat(reduce_type_));
    // Pipelined: the full gradient accumulates until the unit's last micro-batch (stage 1's way).
    if (pipelined() && !last_micro_) return;
    // A unit's gradient is complete after its own backward: whoever borrows from it runs earlier.
    if (stage_ == 1) {
      if (last_micro_)
        inflight_.push_back(
            {u, {}, {}, {}, shard_comm().reduce_scatter(grads_full_[u].flat(reduce_type_), owned_grads(u))});
      return;
    }
    Block tmp = env_.pool.alloc(reduce_type_, flat_[u].shard, Category::comm_buffer, layout(u).name + " reduced shard");
    if (zeropp_ && zeropp_->cfg().grad_bits) {  // qgZ: the full gradient is quantized (and free) once started
      Reduction r{u, std::move(tmp), Block(), {}, Work()};
      r.qg = zeropp_->start_reduction(grads_full_[u].flat(reduce_type_).slice(0, flat_[u].padded), flat_[u].shard,
                                      layout(u).name, feedback(u));
      grads_full_[u].reset();
      for (Reduction& older : inflight_)
        if (older.qg.stage == 1) zeropp_->advance(older.qg, layout(older.unit).name);
      inflight_.push_back(std::move(r));
      while (inflight_.size() > 2) finish_oldest();
      return;
    }
    Work w = shard_comm().reduce_scatter(grads_full_[u].flat(reduce_type_), tmp.flat(reduce_type_));
    // The full gradient now belongs to its reduction: the next micro-step starts a fresh one.
    inflight_.push_back({u, std::move(tmp), std::move(grads_full_[u]), {}, std::move(w)});
    while (inflight_.size() > 2) finish_oldest();
  }

  double grad_norm_sq() override {
    drain();
    std::vector<Tensor> shards;
    for (size_t u = 0; u < num_units(); ++u) shards.push_back(reduced_grads(u));
    float local = static_cast<float>(sum_squares(shards, &opt_pool()));
    shard_comm().all_reduce(std::span<float>(&local, 1)).wait();  // replicas hold the same shards: one group's sum
    return local;
  }
  double grad_norm_sq_of(TensorPick pick) override {
    drain();
    std::vector<Tensor> parts;
    for (size_t u = 0; u < num_units(); ++u) {
      const auto [begin, end] = owned_range(u);
      if (end > begin)
        for (const Tensor& t : part_of(u, reduced_grads(u).slice(0, end - begin), begin, pick)) parts.push_back(t);
    }
    float local = parts.empty() ? 0.f : static_cast<float>(sum_squares(parts, &opt_pool()));
    shard_comm().all_reduce(std::span<float>(&local, 1)).wait();
    return local;
  }

  std::vector<float> gather_unit_params(size_t u) override {
    std::vector<float> v;
    if (stage_ == 3 || has_master()) {  // from the shards of what the optimizer updates (f32)
      Block b = env_.pool.alloc(DType::f32, flat_[u].padded, Category::workspace, "gather params");
      Block staged;
      shard_comm().all_gather(on_device(updated(u), staged), b.flat(DType::f32)).wait();
      v = to_host(b.flat(DType::f32));
    } else {
      v = to_host(params_[u].flat(DType::f32));
    }
    v.resize(static_cast<size_t>(flat_[u].numel));
    return v;
  }

  Tensor reduced_grad(size_t u) override {
    drain();
    const auto [begin, end] = owned_range(u);
    return reduced_grads(u).slice(0, end - begin);
  }

  // Replicas of a shard (hybrid sharding): only the first shard group writes it.
  std::pair<int64_t, int64_t> saved_range(size_t u) const override {
    if (env_.mesh.rank(CommAxis::dp_replicate) > 0) return {0, 0};
    return owned_range(u);
  }

  std::pair<int64_t, int64_t> owned_range(size_t u) const override {
    const FlatParam& f = flat_[u];
    int64_t b = std::min(f.shard_begin(), f.numel), e = std::min(f.shard_begin() + f.shard, f.numel);
    return {b, e};
  }

  std::vector<float> gather_unit_grads(size_t u) override {
    drain();
    Block b = env_.pool.alloc(reduce_type_, flat_[u].padded, Category::workspace, "gather grads");
    Block staged;
    shard_comm().all_gather(on_device(reduced_grads(u), staged), b.flat(reduce_type_)).wait();
    std::vector<float> v = to_host(b.flat(reduce_type_));
    v.resize(static_cast<size_t>(flat_[u].numel));
    return v;
  }

 protected:
  // Stages 1 and 2: every rank's updated shard, all-gathered into the full parameters.
  void after_update() override {
    if (stage_ == 3) return;
    std::vector<Work> works;
    for (size_t u = 0; u < num_units(); ++u)
      works.push_back(shard_comm().all_gather(owned_params(u), params_[u].flat(param_type_)));
    for (Work& w : works) w.wait();
  }
  Tensor owned_params(size_t u) const override {
    return stage_ == 3 ? param_shard_[u].flat(param_type_) : own(params_[u], param_type_, u);
  }
  // What the optimizer updates: the f32 master shard under mixed precision or when the optimizer
  // runs on the host away from the parameters, else the parameter shard.
  Tensor updated(size_t u) const override { return has_master() ? master_[u].flat(DType::f32) : owned_params(u); }

  void params_from_master(size_t u) override {
    if (!offload_ || offload_params_) {  // both in one tier
      (offload_params_ ? host_mp_ : mp_).params_from_master(owned_params(u), updated(u));
      return;
    }
    Tensor p = owned_params(u), m = updated(u);
    if (param_type_ == DType::f32) {
      env_.be.copy(p, m);  // upload
      return;
    }
    // Rounded on the host, so what crosses to the device is already in the parameter dtype.
    Block staged =
        host_pool_.alloc(param_type_, p.numel(), Category::comm_buffer, layout(u).name + " updated params (host)");
    Tensor t = staged.flat(param_type_).slice(0, p.numel());
    host_pool_.backend().cast(t, m);
    env_.be.copy(p, t);
  }

  void set_unit_values(size_t u, std::span<const float> full) override {
    std::vector<float> padded(full.begin(), full.end());
    padded.resize(static_cast<size_t>(flat_[u].padded), 0.f);
    store(u, padded);
  }

  // Keeps this rank's part of a unit's padded values: the shard (and its master copy), or the
  // whole buffer for stages 1 and 2.
  void store(size_t u, std::span<const float> padded) {
    const FlatParam& f = flat_[u];
    auto shard = padded.subspan(static_cast<size_t>(f.shard_begin()), static_cast<size_t>(f.shard));
    Tensor master = has_master() ? master_[u].flat(DType::f32) : Tensor();
    if (stage_ == 3) {
      (offload_params_ ? host_mp_ : mp_).write_values(param_shard_[u].flat(param_type_), master, shard);
    } else {
      mp_.write_values(params_[u].flat(param_type_), Tensor(), padded);
      if (has_master()) env_.be.copy(master, Tensor::of(shard));
    }
  }

 private:
  enum class GatherState : uint8_t { sharded, gathering, gathered };
  struct Gathered {
    GatherState state = GatherState::sharded;
    Block buf;     // the full unit, in the param dtype, while not sharded
    Block upload;  // --offload params: the shard on the device while its all-gather runs
    ZeroPPComms::QuantizedGather quantized;  // qwZ: the records in flight (buf is filled on acquire)
    Work work;     // after the buffers: destroyed (and waited on) first
    int users = 0;  // hooks between acquire and release
  };
  struct Reduction {
    size_t unit;
    Block shard;  // stage 2/3: the reduced shard, added to the accumulated gradient on completion
    Block full;   // stage 2/3: the full gradient being reduced, freed with the reduction
    ZeroPPComms::QuantizedReduction qg;  // qgZ: its all-to-alls instead of `work` (stage 0: none)
    Work work;    // declared last: destroyed (and so waited on) before the buffers it uses
  };

  // This rank's shard of a full (padded) buffer of dtype t.
  Tensor own(const Block& full, DType t, size_t u) const {
    return full.flat(t).slice(flat_[u].shard_begin(), flat_[u].shard);
  }
  Tensor owned_grads(size_t u) const {
    return stage_ == 1 ? own(grads_full_[u], reduce_type_, u) : grad_shard_[u].flat(reduce_type_);
  }
  // The reduced gradient shard the optimizer and the norm read (on the host under offload).
  Tensor reduced_grads(size_t u) const {
    return stage_ == 1 && offload_ ? host_grad_[u].flat(reduce_type_) : owned_grads(u);
  }
  bool has_master() const { return mixed() || (offload_ && !offload_params_); }
  // Where the optimizer state, the master shard and the reduced gradient shards live: the host
  // tier under offload.
  Pool& opt_pool() { return offload_ ? host_pool_ : env_.pool; }
  // A host-tier tensor's copy on the device (for a collective), kept alive by `hold`; device
  // tensors pass through.
  Tensor on_device(Tensor t, Block& hold) const {
    if (!offload_) return t;
    hold = env_.pool.alloc(t.dtype(), t.numel(), Category::comm_buffer, "host shard on the device");
    Tensor d = hold.flat(t.dtype()).slice(0, t.numel());
    env_.be.copy(d, t);
    return d;
  }

  void ensure_grad_full(size_t u) {
    if (grads_full_[u]) return;
    grads_full_[u] = env_.pool.alloc(reduce_type_, flat_[u].padded, Category::grad_full, layout(u).name + " grads");
    env_.be.fill(grads_full_[u].flat(reduce_type_), 0.f);
  }

  void drain() {
    while (!inflight_.empty()) finish_oldest();
  }
  void finish_oldest() {
    Reduction r = std::move(inflight_.front());
    inflight_.pop_front();
    r.work.wait();
    const size_t u = r.unit;
    if (r.qg.stage > 0)
      zeropp_->finish_reduction(r.qg, r.shard.flat(reduce_type_).slice(0, flat_[u].shard), layout(u).name);
    // Hybrid sharding: the group's reduced shard, summed over the replica groups.
    if (replica_comm_) replica_comm_->all_reduce(stage_ == 1 ? owned_grads(u) : r.shard.flat(reduce_type_)).wait();
    if (!offload_) {
      if (stage_ != 1) mp_.accumulate(grad_shard_[u].flat(reduce_type_), r.shard.flat(reduce_type_));
      return;
    }
    if (stage_ == 1) {  // the reduced shard, out of the full buffer, to the host
      env_.be.copy(host_grad_[u].flat(reduce_type_), owned_grads(u));
      return;
    }
    // Stages 2 and 3: to the host as soon as the reduction is done, accumulated there.
    Block host =
        host_pool_.alloc(reduce_type_, flat_[u].shard, Category::comm_buffer, layout(u).name + " reduced shard (host)");
    env_.be.copy(host.flat(reduce_type_), r.shard.flat(reduce_type_));
    r.shard.reset();
    r.full.reset();
    host_mp_.accumulate(grad_shard_[u].flat(reduce_type_), host.flat(reduce_type_));
  }

  // ---- stage 3: gathered units ----
  size_t live_gathers() const {
    size_t n = 0;
    for (const auto& g : gathered_) n += g.state != GatherState::sharded;
    return n;
  }
  // sharded -> gathering: the buffer and the all-gather that fills it.
  void issue_gather(size_t u) {
    Gathered& g = gathered_[u];
    if (g.state != GatherState::sharded) return;
    g.buf = env_.pool.alloc(param_type_, flat_[u].padded, Category::param_full, layout(u).name + " gathered");
    g.state = GatherState::gathering;
    if (secondary_[u]) {  // hpZ: inside the node, from the secondary shards this forward left
      g.work =
          zeropp_->gather_secondary(secondary_[u].flat(param_type_), g.buf.flat(param_type_).slice(0, flat_[u].padded));
      return;
    }
    Tensor shard = param_shard_[u].flat(param_type_);
    if (offload_params_) {
      g.upload = env_.pool.alloc(param_type_, flat_[u].shard, Category::comm_buffer, layout(u).name + " shard upload");
      env_.be.copy(g.upload.flat(param_type_), shard);
      shard = g.upload.flat(param_type_);
    }
    if (zeropp_ && zeropp_->cfg().weight_bits) {
      g.quantized = zeropp_->gather_quantized(shard.slice(0, flat_[u].shard), layout(u).name);
      return;
    }
    g.work = shard_comm().all_gather(shard, g.buf.flat(param_type_));
  }
  void prefetch(size_t u) {
    if (gathered_[u].state == GatherState::sharded && live_gathers() < static_cast<size_t>(max_gathered_))
      issue_gather(u);
  }
  // -> gathered, with one more user.
  void acquire_one(size_t u) {
    Gathered& g = gathered_[u];
    issue_gather(u);
    g.work.wait();
    if (g.quantized) zeropp_->finish_gather(g.quantized, g.buf.flat(param_type_), flat_[u].shard);
    g.upload.reset();
    g.state = GatherState::gathered;
    g.users += 1;
  }
  void acquire(size_t u) {
    acquire_one(u);
    for (const BorrowedTensor& b : borrowed_[u]) acquire_one(b.owner);
  }
  // One user fewer; the last one frees the buffer (gathered -> sharded) unless the unit is kept.
  // hpZ: a unit freed after its forward leaves this rank its slice of the node's copy first.
  void release_one(size_t u, bool keep, bool forward) {
    Gathered& g = gathered_[u];
    SHARD_CHECK(g.state == GatherState::gathered && g.users > 0, "releasing unit {} ({}) in state {} with {} users",
                u, layout(u).name, static_cast<int>(g.state), g.users);
    g.users -= 1;
    if (g.users == 0 && !keep) {
      if (forward && !eval_ && zeropp_ && zeropp_->cfg().secondary && !secondary_[u])
        secondary_[u] = zeropp_->keep_secondary(g.buf.flat(param_type_).slice(0, flat_[u].padded), layout(u).name);
      g.buf.reset();
      g.state = GatherState::sharded;
    }
  }
  void release(size_t u, bool keep, bool forward = false) {
    release_one(u, keep, forward);
    for (const BorrowedTensor& b : borrowed_[u]) release_one(b.owner, keep, forward);
  }
  // qgZ's error feedback: unit u's (zeros at first, held across steps like the model states), or none.
  Tensor feedback(size_t u) {
    if (feedback_.empty()) return Tensor();
    return feedback_[u].flat(DType::f32).slice(0, flat_[u].padded);
  }
  Tensor gathered_tensor(size_t u) const {
    SHARD_CHECK(gathered_[u].state == GatherState::gathered, "unit {} used while not gathered", layout(u).name);
    return gathered_[u].buf.flat(param_type_);
  }

  // The shard group's communicator (the whole data-parallel group's without hybrid sharding; with
  // context parallelism its ranks too: they hold other tokens of the same sequences).
  Communicator& shard_comm() { return *shard_comm_; }
  // Muon's whole matrices (optim/muon.hpp): the unit's momentum-updated gradient all-gathered over
  // the shard group, the owners' results reduce-scattered back (f32, the optimizer's buffers).
  std::unique_ptr<CommExchange> exchange_;
  void open_groups() {
    shard_comm_ = &env_.mesh.comm(CommAxis::dp_shard_cp);  // dp_shard itself at cp 1
    shard_size_ = shard_comm_->world_size();
    shard_rank_ = shard_comm_->rank();
    if (env_.mesh.size(CommAxis::dp_replicate) > 1) replica_comm_ = &env_.mesh.comm(CommAxis::dp_replicate);
  }

  int stage_;
  int shard_size_ = 1, shard_rank_ = 0;     // the shard group's size and this rank's place in it
  Communicator* shard_comm_ = nullptr;      // the mesh's dp_shard group
  Communicator* replica_comm_ = nullptr;    // hybrid sharding only: the mesh's dp_replicate group
  DType param_type_, reduce_type_;          // the parameters' and the gradients' dtypes as stored
  bool offload_, offload_params_;           // --offload optimizer (or params), --offload params
  Pool& host_pool_;                         // the host tier
  MixedPrecision host_mp_;                  // casts and accumulations on the host tier
  int max_gathered_ = 3;
  std::vector<FlatParam> flat_;
  std::vector<Block> params_, param_shard_, master_, grads_full_, grad_shard_, host_grad_;
  std::vector<Gathered> gathered_;
  std::vector<Block> secondary_;            // hpZ: per unit, from its forward to its backward
  std::vector<Block> feedback_;             // qgZ --error-feedback: per unit, from its first reduction on
  std::unique_ptr<ZeroPPComms> zeropp_;     // ZeRO++'s collectives, when a lever is on
  std::deque<Reduction> inflight_;
};

}  // namespace

std::unique_ptr<Strategy> make_zero(const StrategyConfig& cfg, StrategyEnv env) {
  return std::make_unique<Zero>(cfg, std::move(env));
}

}  // namespace shardlab
