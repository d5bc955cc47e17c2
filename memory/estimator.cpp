#include "memory/estimator.hpp"

#include <algorithm>
#include <deque>
#include <map>

#include "src/core/check.hpp"

namespace shardlab {

uint64_t Estimate::model_state_total() const {
  uint64_t s = 0;
  for (uint64_t b : model_states) s += b;
  return s;
}

double zero_model_states(const std::string& s, double psi, int world, double k) {
  const double n = world;
  if (s == "ddp" || s == "dp") return (4 + k) * psi;
  if (s == "zero1") return 4 * psi + k * psi / n;
  if (s == "zero2") return 2 * psi + (2 + k) * psi / n;
  if (s == "zero3") return (4 + k) * psi / n;
  throw InputError(fmt::format("no ZeRO formula for strategy '{}'", s));
}

namespace {

// The replay's bookkeeping: memory::Ledger itself (peaks, composition at the peak, phases), plus
// ids so the replay can free what it allocated.
class Tally {
 public:
  using Id = int;
  Id alloc(Category c, uint64_t bytes) {
    ledger_.on_alloc(c, bytes, "");
    live_[next_] = {c, bytes};
    return next_++;
  }
  void free(Id id) {
    auto it = live_.find(id);
    if (it == live_.end()) return;
    ledger_.on_free(it->second.first, it->second.second, "");
    live_.erase(it);
  }
  void phase(std::string p) { ledger_.set_phase(std::move(p)); }
  // From here on the step is measured: peaks restart and the timeline is kept from this event.
  void start_step() {
    ledger_.reset_peaks();
    start_ = ledger_.current_by_category();
    first_event_ = ledger_.timeline().size();
  }
  CategoryBytes current() const { return ledger_.current_by_category(); }
  Estimate result() const {
    Estimate e;
    e.peak_by_category = ledger_.peak_by_category();
    e.at_peak = ledger_.composition_at_peak();
    e.peak = ledger_.peak_total();
    e.peak_phase = ledger_.phase_at_peak();
    CategoryBytes live = start_;
    const auto& tl = ledger_.timeline();
    for (size_t i = first_event_; i < tl.size(); ++i) {
      int k = static_cast<int>(tl[i].category);
      live[k] = static_cast<uint64_t>(static_cast<int64_t>(live[k]) + tl[i].delta);
      e.timeline.push_back({tl[i].phase, live});
    }
    return e;
  }

 private:
  Ledger ledger_;
  std::map<Id, std::pair<Category, uint64_t>> live_;
  Id next_ = 1;
  CategoryBytes start_{};
  size_t first_event_ = 0;
};

constexpr uint64_t kF32 = 4;

class Replay {
 public:
  Replay(const std::vector<UnitMemDesc>& units, const EstimateConfig& c)
      : u_(units), c_(c), U_(units.size()), pd_(dtype_size(c.param_dtype)), rd_(dtype_size(c.reduce_dtype)),
        mixed_(c.param_dtype != DType::f32), stage_(c.strategy.size() == 5 && c.strategy.rfind("zero", 0) == 0
                                                        ? c.strategy[4] - '0' : 0),
        k_(c.optimizer == "sgd" ? 1 : 2) {
    for (const auto& d : units) {
      padded_.push_back((d.params + c.world - 1) / c.world * c.world);
      shard_.push_back(padded_.back() / c.world);
    }
    gathered_.assign(U_, 0);
    users_.assign(U_, 0);
    grad_full_.assign(U_, 0);
    param_ws_.assign(U_, 0);
    grad_ws_.assign(U_, 0);
    replica_params_.assign(U_, 0);
    replica_grads_.assign(U_, 0);
    max_gathered_ = c.max_gathered > 0 ? c.max_gathered : c.prefetch + 2;
  }

  Estimate run() {
    setup();
    CategoryBytes states = t_.current();
    t_.start_step();
    step();
    Estimate e = t_.result();
    e.model_states = states;
    return e;
  }

 private:
  bool dp() const { return c_.strategy == "dp"; }
  bool dp_replica() const { return dp() && c_.rank != 0; }
  bool root() const { return c_.rank == 0; }

  // ---- what a strategy holds once set up ----
  void setup() {
    for (size_t u = 0; u < U_; ++u) {
      const uint64_t p = static_cast<uint64_t>(u_[u].params), pad = static_cast<uint64_t>(padded_[u]),
                     sh = static_cast<uint64_t>(shard_[u]);
      if (c_.strategy == "ddp" || (dp() && root())) {
        t_.alloc(Category::param_full, p * pd_);
        if (mixed_) t_.alloc(Category::master_weights, p * kF32);
        t_.alloc(Category::grad_full, p * rd_);
        t_.alloc(Category::optim_state, p * kF32 * k_);
      } else if (stage_ > 0) {
        t_.alloc(stage_ == 3 ? Category::param_shard : Category::param_full, (stage_ == 3 ? sh : pad) * pd_);
        if (mixed_) t_.alloc(Category::master_weights, sh * kF32);
        if (stage_ == 1) t_.alloc(Category::grad_full, pad * rd_);
        else t_.alloc(Category::grad_shard, sh * rd_);
        t_.alloc(Category::optim_state, sh * kF32 * k_);
      }
    }
  }

  // ---- the step, in the order Trainer::step and the runner allocate ----
  void step() {
    t_.phase("begin step");
    if (dp_replica())
      for (size_t u = 0; u < U_; ++u) replica_params_[u] = t_.alloc(Category::param_full, u_[u].params * pd_);
    for (int64_t k = 0; k < c_.accum; ++k) {
      last_micro_ = k + 1 == c_.accum;
      if (dp_replica())
        for (size_t u = 0; u < U_; ++u) replica_grads_[u] = t_.alloc(Category::grad_full, u_[u].params * rd_);
      micro();
    }
    t_.phase("optimizer step");
    finish_all_reductions();
    grad_norm();
    optimizer();
    t_.phase("");
  }

  void micro() {
    std::vector<Tally::Id> out(U_), saved(U_);
    for (size_t u = 0; u < U_; ++u) {
      t_.phase("forward " + u_[u].name);
      // The output, then forward_params (gather for zero3, f32 compute copies), then what it saves.
      out[u] = t_.alloc(Category::activations, u_[u].out_elems * kF32);
      if (stage_ == 3) {
        acquire(u);
        for (int j = 1; j <= c_.prefetch && u + j < U_; ++j) prefetch(u + j);
      }
      compute_params(u);
      saved[u] = t_.alloc(Category::activations, u_[u].saved_elems * kF32);
      release_compute_params(u);
      if (stage_ == 3) release(u, u + 1 == U_ || !c_.reshard_after_forward);
    }
    t_.phase("loss");
    if (!dp()) {
      t_.free(t_.alloc(Category::activations, (c_.positions + 1) * kF32));
    } else if (root()) {  // rank 0 holds every rank's logits while it computes the loss of all
      const uint64_t n = static_cast<uint64_t>(c_.positions) * c_.world;
      Tally::Id all = t_.alloc(Category::activations, n * c_.vocab * kF32);
      t_.free(t_.alloc(Category::activations, (n + 1) * kF32));
      t_.free(all);
    }
    Tally::Id dnext = 0;
    for (size_t u = U_; u-- > 0;) {
      t_.phase("backward " + u_[u].name);
      Tally::Id din = u > 0 ? t_.alloc(Category::activations, u_[u - 1].out_elems * kF32) : 0;
      if (stage_ == 3) {
        acquire(u);
        for (int j = 1; j <= c_.prefetch && u >= static_cast<size_t>(j); ++j) prefetch(u - j);
      }
      compute_params(u);
      grads(u);
      Tally::Id ws = t_.alloc(Category::workspace, u_[u].backward_workspace_elems * kF32);
      t_.free(ws);
      t_.free(saved[u]);
      t_.free(out[u]);
      if (dnext) t_.free(dnext);
      dnext = din;
      after_backward(u);
    }
  }

  // ---- zero3 gathers ----
  void issue_gather(size_t u) {
    if (gathered_[u]) return;
    gathered_[u] = t_.alloc(Category::param_full, padded_[u] * pd_);
  }
  void prefetch(size_t u) {
    int live = 0;
    for (auto g : gathered_) live += g != 0;
    if (!gathered_[u] && live < max_gathered_) issue_gather(u);
  }
  void acquire(size_t u) {
    issue_gather(u);
    users_[u]++;
    for (size_t o : u_[u].borrows) issue_gather(o), users_[o]++;
  }
  void release_one(size_t u, bool keep) {
    if (--users_[u] == 0 && !keep) {
      t_.free(gathered_[u]);
      gathered_[u] = 0;
    }
  }
  void release(size_t u, bool keep) {
    release_one(u, keep);
    for (size_t o : u_[u].borrows) release_one(o, keep);
  }

  // ---- mixed precision workspaces ----
  int64_t storage_elems(size_t u) const {
    if (c_.strategy == "ddp" || dp()) return u_[u].params;
    return padded_[u];
  }
  void compute_params(size_t u) {
    if (!mixed_) return;
    auto one = [&](size_t x) {
      if (!param_ws_[x]) param_ws_[x] = t_.alloc(Category::workspace, storage_elems(x) * kF32);
    };
    one(u);
    for (size_t o : u_[u].borrows) one(o);
  }
  void release_compute_params(size_t u) {
    auto one = [&](size_t x) {
      t_.free(param_ws_[x]);
      param_ws_[x] = 0;
    };
    one(u);
    for (size_t o : u_[u].borrows) one(o);
  }
  void grads(size_t u) {
    auto one = [&](size_t x) {
      if (stage_ >= 2 && !grad_full_[x]) grad_full_[x] = t_.alloc(Category::grad_full, padded_[x] * rd_);
      if (c_.reduce_dtype != DType::f32 && !grad_ws_[x]) grad_ws_[x] = t_.alloc(Category::workspace, storage_elems(x) * kF32);
    };
    one(u);
    for (size_t o : u_[u].borrows) one(o);
  }

  void after_backward(size_t u) {
    release_compute_params(u);
    if (stage_ == 3) release(u, false);
    if (grad_ws_[u]) {  // flush: widen the stored gradient, add, round back
      Tally::Id sum = t_.alloc(Category::workspace, storage_elems(u) * kF32);
      t_.free(sum);
      t_.free(grad_ws_[u]);
      grad_ws_[u] = 0;
    }
    // MPI widens bf16/f16 reductions at any world size, one rank included.
    if (dp()) {
      if (c_.reduce_dtype != DType::f32) reduce_staging_dp(u);
      if (u == 0 && dp_replica()) {
        for (auto& g : replica_grads_) t_.free(g), g = 0;
        if (last_micro_)
          for (auto& p : replica_params_) t_.free(p), p = 0;
      }
      return;
    }
    if (c_.strategy == "ddp") {
      if (last_micro_ && c_.world > 1 && c_.reduce_dtype != DType::f32) ddp_bucket_staging(u);  // ddp skips N = 1
      return;
    }
    if (stage_ == 1) {
      if (last_micro_) inflight_.push_back(rs_staging(u, 0));
      return;
    }
    // zero2/3: the full gradient is reduce-scattered into a fresh shard; at most two in flight.
    Reduction r = rs_staging(u, t_.alloc(Category::comm_buffer, shard_[u] * rd_));
    r.full = grad_full_[u];
    grad_full_[u] = 0;
    inflight_.push_back(r);
    while (inflight_.size() > 2) finish_oldest();
  }

  struct Reduction {
    Tally::Id shard = 0, full = 0, send = 0, recv = 0;
    size_t unit = 0;
  };
  // MPI widens bf16/f16 reductions: an f32 copy of the whole send buffer and of the received shard.
  Reduction rs_staging(size_t u, Tally::Id shard) {
    Reduction r;
    r.unit = u;
    r.shard = shard;
    if (c_.reduce_dtype != DType::f32) {
      r.send = t_.alloc(Category::comm_buffer, padded_[u] * kF32);
      r.recv = t_.alloc(Category::comm_buffer, shard_[u] * kF32);
    }
    return r;
  }
  void finish_oldest() {
    Reduction r = inflight_.front();
    inflight_.pop_front();
    t_.free(r.send);
    t_.free(r.recv);
    if (r.shard) {  // accumulate into the gradient shard (computed in f32 when it is not f32)
      if (c_.reduce_dtype != DType::f32) {
        Tally::Id a = t_.alloc(Category::workspace, shard_[r.unit] * kF32);
        Tally::Id b = t_.alloc(Category::workspace, shard_[r.unit] * kF32);
        t_.free(b);
        t_.free(a);
      }
      t_.free(r.shard);
    }
    t_.free(r.full);
  }
  void finish_all_reductions() {
    while (!inflight_.empty()) finish_oldest();
    for (auto id : ddp_staging_) t_.free(id);
    ddp_staging_.clear();
  }
  void ddp_bucket_staging(size_t u) {
    // Buckets complete in backward order; each widened bucket stays staged until the norm waits.
    if (bucket_units_.empty()) build_buckets();
    size_t b = bucket_of_[u];
    if (++bucket_ready_[b] == bucket_units_[b]) ddp_staging_.push_back(t_.alloc(Category::comm_buffer, bucket_elems_[b] * kF32));
  }
  void build_buckets() {
    const int64_t limit = std::max<int64_t>(1, static_cast<int64_t>(c_.bucket_mb * (1 << 20) / rd_));
    bucket_of_.assign(U_, 0);
    for (size_t i = 0; i < U_; ++i) {
      size_t u = U_ - 1 - i;
      if (bucket_elems_.empty() || bucket_elems_.back() >= limit) {
        bucket_elems_.push_back(0);
        bucket_units_.push_back(0);
        bucket_ready_.push_back(0);
      }
      bucket_elems_.back() += u_[u].params;
      bucket_units_.back() += 1;
      bucket_of_[u] = bucket_elems_.size() - 1;
    }
  }
  void reduce_staging_dp(size_t u) {
    Tally::Id send = t_.alloc(Category::comm_buffer, u_[u].params * kF32);
    Tally::Id recv = root() ? t_.alloc(Category::comm_buffer, u_[u].params * kF32) : 0;
    dp_staging_.push_back(send);
    if (recv) dp_staging_.push_back(recv);
    if (u == 0) {
      for (auto id : dp_staging_) t_.free(id);
      dp_staging_.clear();
    }
  }

  void grad_norm() {
    if (dp_replica()) return;  // DP: rank 0 computes the norm and broadcasts it
    Tally::Id n = t_.alloc(Category::workspace, kF32);
    if (c_.reduce_dtype != DType::f32) {
      // The norm widens each gradient buffer in turn: the largest one bounds the peak.
      int64_t largest = 0;
      if (c_.strategy == "ddp") {
        for (const auto& d : u_) largest += d.params;  // one buffer for every bucket
      } else {
        for (size_t u = 0; u < U_; ++u)
          largest = std::max(largest, dp() ? u_[u].params : shard_[u]);
      }
      Tally::Id w = t_.alloc(Category::workspace, largest * kF32);
      t_.free(w);
    }
    t_.free(n);
  }

  void optimizer() {
    if (dp_replica() || c_.reduce_dtype == DType::f32) return;
    // Gradients stored in bf16 are widened one optimizer buffer at a time.
    int64_t largest = 0;
    for (size_t u = 0; u < U_; ++u)
      largest = std::max(largest, (c_.strategy == "ddp" || dp()) ? u_[u].params : shard_[u]);
    Tally::Id w = t_.alloc(Category::workspace, largest * kF32);
    t_.free(w);
  }

  const std::vector<UnitMemDesc>& u_;
  const EstimateConfig& c_;
  size_t U_;
  uint64_t pd_, rd_;
  bool mixed_;
  int stage_;
  uint64_t k_;
  bool last_micro_ = true;
  int max_gathered_ = 3;
  Tally t_;
  std::vector<int64_t> padded_, shard_;
  std::vector<Tally::Id> gathered_, grad_full_, param_ws_, grad_ws_, replica_params_, replica_grads_;
  std::vector<int> users_;
  std::deque<Reduction> inflight_;
  std::vector<Tally::Id> ddp_staging_, dp_staging_;
  std::vector<int64_t> bucket_elems_;
  std::vector<int> bucket_units_, bucket_ready_;
  std::vector<size_t> bucket_of_;
};

}  // namespace

Estimate estimate_step(const std::vector<UnitMemDesc>& units, const EstimateConfig& cfg) {
  SHARD_REQUIRE(cfg.world >= 1 && cfg.rank >= 0 && cfg.rank < cfg.world, "estimate: rank {} of world {}", cfg.rank,
                cfg.world);
  SHARD_REQUIRE(!units.empty(), "estimate: no units");
  return Replay(units, cfg).run();
}

}  // namespace shardlab
