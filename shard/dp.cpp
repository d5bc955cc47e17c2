// dp.cpp — the torch.nn.DataParallel pattern with rank 0 as the primary device.
//
// Rank 0 holds the parameters, the gradients and the optimizer. Each step it broadcasts the
// parameters to the replicas; every rank runs forward on its slice of the batch; the logits are
// gathered to rank 0, which computes the loss of the whole batch and scatters d(loss)/d(logits)
// back; every rank runs backward; gradients are summed onto rank 0 (a reduce); rank 0 steps.
// Replicas free their parameter and gradient copies once backward is done. Rank 0 also holds
// every rank's logits at once, so its memory is lopsided, as DataParallel's is on device 0.
// (The token batch itself is not scattered: every rank reads its own slice from the
// deterministic loader, which moves no bytes over the network; the loss hook reads every rank's
// targets from the Batch, which the trainer fills for any strategy.)
#include "shard/strategy.hpp"

namespace shardlab {
namespace {

class Dp final : public Strategy {
 public:
  Dp(const StrategyConfig& cfg, StrategyEnv env) : Strategy(cfg, std::move(env)) {
    const size_t U = num_units();
    params_.resize(U);
    grads_.resize(U);
    master_.resize(U);
    if (rank_ != 0) return;
    optim_ = std::make_unique<Optimizer>(env_.pool, env_.optim);
    for (size_t u = 0; u < U; ++u) {
      const std::string& n = layout(u).name;
      params_[u] = env_.pool.alloc(param_dtype(), layout(u).numel, Category::param_full, n + " params");
      grads_[u] = env_.pool.alloc(reduce_dtype(), layout(u).numel, Category::grad_full, n + " grads");
      if (mixed()) master_[u] = env_.pool.alloc(DType::f32, layout(u).numel, Category::master_weights, n + " master");
      optim_->add(updated(u), grads_[u].flat(reduce_dtype()), unit_segments(layout(u), 0, layout(u).numel), n,
                  optimizer_place(u, 0, layout(u).numel, nullptr));
    }
  }

  void begin_step() override {
    if (rank_ == 0)
      for (size_t u = 0; u < num_units(); ++u) env_.be.fill(grads_[u].flat(reduce_dtype()), 0.f);
    broadcast_params();
  }

  // Evaluation: the replicas receive the parameters once for the whole pass, and drop them after.
  void begin_eval() override {
    Strategy::begin_eval();
    broadcast_params();
  }
  void end_eval() override {
    Strategy::end_eval();
    if (rank_ != 0)
      for (Block& p : params_) p.reset();
  }

  void begin_micro(int64_t k, bool last) override {
    Strategy::begin_micro(k, last);
    if (rank_ == 0) return;
    for (size_t u = 0; u < num_units(); ++u) {
      grads_[u] = env_.pool.alloc(reduce_dtype(), layout(u).numel, Category::grad_full, layout(u).name + " replica grads");
      env_.be.fill(grads_[u].flat(reduce_dtype()), 0.f);
    }
  }

  ParamSet forward_params(size_t u) override {
    return compute_views(u, [&](size_t x) { return params_[x].flat(param_dtype()); });
  }
  void after_forward(size_t u) override { release_unit_params(u); }
  ParamSet backward_params(size_t u) override {
    return compute_views(u, [&](size_t x) { return params_[x].flat(param_dtype()); }, true);
  }
  ParamSet grads(size_t u) override {
    return grad_views(u, [&](size_t x) { return grads_[x].flat(reduce_dtype()); });
  }

  // The gradient comes back over the logits (f32, as rank 0 computed it), then, grad_dtype not f32,
  // into a block of its own allocated once the gathered logits are gone (rounded once, as the
  // head's products would round it).
  double loss(Backend& be, Pool& pool, Tensor logits, const Batch& batch, float dlogit_scale, DType grad_dtype,
              Block& dlogits) override {
    double sum = 0;
    {
      Block all;
      Tensor all_t = gather_logits(pool, logits, batch, all);
      Block in_place;
      if (rank_ == 0) sum = UnitHooks::loss(be, pool, all_t, global_batch(batch), dlogit_scale, DType::f32, in_place);
      env_.comm.scatter(all_t, logits, 0).wait();
    }
    if (grad_dtype != DType::f32) {
      dlogits = logits_grad_block(pool, grad_dtype, logits.numel());
      be.cast(dlogits.flat(grad_dtype), logits);
    }
    return sum;
  }

  // Forward only: rank 0 takes the loss of the whole batch (its sum); the others contribute 0.
  double forward_loss(Backend& be, Pool& pool, Tensor logits, const Batch& batch) override {
    Block all;
    Tensor all_t = gather_logits(pool, logits, batch, all);
    return rank_ == 0 ? UnitHooks::forward_loss(be, pool, all_t, global_batch(batch)) : 0.0;
  }

  // The chunked loss head: each rank holds its own positions' losses; rank 0 takes the whole batch's
  // sum (the others contribute 0), and every rank's positions weigh dloss_scale.
  double loss_rows(Backend& be, Pool& pool, Tensor losses, const Batch& batch, float dloss_scale,
                   bool backward) override {
    Block hold;
    const Tensor all = gather_rows(pool, losses, losses.numel(), 1, hold, "dp gathered losses");
    const double sum = rank_ == 0 ? UnitHooks::loss_rows(be, pool, all, batch, 0.f, false) : 0.0;
    if (backward) be.fill(losses, dloss_scale);
    return sum;
  }

  void after_backward(size_t u) override {
    release_unit_params(u);
    flush_grads(u, grads_[u].flat(reduce_dtype()));
    // Sum this micro-step's gradients onto rank 0 (in place there, accumulating over micro-steps).
    works_.push_back(env_.comm.reduce(grads_[u].flat(reduce_dtype()), grads_[u].flat(reduce_dtype()), 0));
    if (u != 0) return;
    for (Work& w : works_) w.wait();
    works_.clear();
    if (rank_ == 0) return;
    for (Block& g : grads_) g.reset();
    if (last_micro_)
      for (Block& p : params_) p.reset();  // replicas drop their copies after backward
  }

  double grad_norm_sq() override {
    float v = 0.f;
    if (rank_ == 0) {
      std::vector<Tensor> g;
      for (const Block& b : grads_) g.push_back(b.flat(reduce_dtype()));
      v = static_cast<float>(sum_squares(g));
    }
    env_.comm.broadcast(std::span<float>(&v, 1), 0).wait();
    return v;
  }
  // Parts of the norm matter under --tp and --ep, which dp never runs under (ParallelLayout).
  double grad_norm_sq_of(TensorPick) override {
    throw InternalError("dp: a part of the gradient norm asked for, but dp runs under neither --tp nor --ep");
  }

  std::vector<float> gather_unit_params(size_t u) override { return from_root(u, [&] { return updated(u); }); }
  std::vector<float> gather_unit_grads(size_t u) override {
    return from_root(u, [&] { return grads_[u].flat(reduce_dtype()); });
  }
  // Pipeline parallelism refuses dp (StrategyConfig::validate): nothing asks for it.
  Tensor reduced_grad(size_t u) override {
    SHARD_CHECK(false, "dp has no per-rank reduced gradient (unit {})", layout(u).name);
    return {};
  }
  std::pair<int64_t, int64_t> owned_range(size_t u) const override {
    return rank_ == 0 ? std::pair<int64_t, int64_t>{0, layout(u).numel} : std::pair<int64_t, int64_t>{0, 0};
  }

 protected:
  void set_unit_values(size_t u, std::span<const float> full) override {
    if (rank_ == 0)
      mp_.write_values(params_[u].flat(param_dtype()), mixed() ? master_[u].flat(DType::f32) : Tensor(), full);
  }
  Tensor owned_params(size_t u) const override { return params_[u].flat(param_dtype()); }
  Tensor updated(size_t u) const override { return mixed() ? master_[u].flat(DType::f32) : owned_params(u); }

 private:
  // Rank 0's parameters to every replica, into copies the replicas allocate now.
  void broadcast_params() {
    std::vector<Work> works;
    for (size_t u = 0; u < num_units(); ++u) {
      if (rank_ != 0)
        params_[u] = env_.pool.alloc(param_dtype(), layout(u).numel, Category::param_full, layout(u).name + " replica");
      works.push_back(env_.comm.broadcast(params_[u].flat(param_dtype()), 0));
    }
    for (Work& w : works) w.wait();
  }

  // Every rank's logits on rank 0, in `hold` (an empty tensor elsewhere).
  Tensor gather_logits(Pool& pool, Tensor logits, const Batch& batch, Block& hold) {
    SHARD_CHECK(batch.global_targets && batch.world == world_, "dp: the batch carries targets of {} ranks, not {}",
                batch.global_targets ? batch.world : 0, world_);
    return gather_rows(pool, logits, batch.B * batch.T, env_.spec.vocab, hold, "dp gathered logits");
  }
  // Every rank's (rows, cols) local on rank 0 as (world rows, cols), in `hold` (an empty tensor elsewhere).
  Tensor gather_rows(Pool& pool, Tensor local, int64_t rows, int64_t cols, Block& hold, const char* name) {
    Tensor all;
    if (rank_ == 0) {
      hold = pool.alloc(DType::f32, rows * world_ * cols, Category::activations, name);
      all = hold.view(DType::f32, {rows * world_, cols});
    }
    env_.comm.gather(local, all, 0).wait();
    return all;
  }
  // The whole batch, every rank's targets in rank order (what rank 0 takes the loss of).
  Batch global_batch(const Batch& batch) const {
    return Batch{nullptr, batch.global_targets, batch.B * world_, batch.T};
  }

  // Rank 0's f32 values of a unit buffer, broadcast to every rank.
  template <class Source>
  std::vector<float> from_root(size_t u, Source source) {
    std::vector<float> v(static_cast<size_t>(layout(u).numel));
    if (rank_ == 0) v = to_host(source());
    env_.comm.broadcast(std::span<float>(v), 0).wait();
    return v;
  }

  std::vector<Block> params_, grads_, master_;
  std::vector<Work> works_;
};

}  // namespace

std::unique_ptr<Strategy> make_dp(const StrategyConfig& cfg, StrategyEnv env) {
  return std::make_unique<Dp>(cfg, std::move(env));
}

}  // namespace shardlab
