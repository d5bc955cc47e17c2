// ddp.cpp — DistributedDataParallel: every rank holds the whole model, its gradients and the
// optimizer. Gradients live in one buffer laid out in backward order (head, h.L-1 .. h.0,
// embedding), cut into buckets of --bucket-mb; a bucket is all-reduced as soon as backward has
// produced every unit in it, so its communication overlaps the rest of backward. With gradient
// accumulation, only the last micro-step communicates.
#include "shard/strategy.hpp"

namespace shardlab {
namespace {

class Ddp final : public Strategy {
 public:
  Ddp(const StrategyConfig& cfg, StrategyEnv env) : Strategy(cfg, std::move(env)) {
    const size_t U = num_units();
    grad_offset_.resize(U);
    int64_t total = 0;
    const int64_t bucket_elems =
        std::max<int64_t>(1, static_cast<int64_t>(cfg.bucket_mb * (1 << 20) / dtype_size(reduce_dtype())));
    bucket_of_.resize(U);
    for (size_t i = 0; i < U; ++i) {  // backward order
      size_t u = U - 1 - i;
      if (buckets_.empty() || buckets_.back().numel >= bucket_elems) buckets_.push_back({total, 0, 0});
      grad_offset_[u] = total;
      total += layout(u).numel;
      buckets_.back().numel += layout(u).numel;
      buckets_.back().units += 1;
      bucket_of_[u] = buckets_.size() - 1;
    }
    master_.resize(U);
    for (size_t u = 0; u < U; ++u) {
      const std::string& n = layout(u).name;
      params_.push_back(env_.pool.alloc(param_dtype(), layout(u).numel, Category::param_full, n + " params"));
      if (mixed()) master_[u] = env_.pool.alloc(DType::f32, layout(u).numel, Category::master_weights, n + " master");
    }
    grads_ = env_.pool.alloc(reduce_dtype(), total, Category::grad_full, "gradients (all buckets)");
    optim_ = std::make_unique<Optimizer>(env_.pool, env_.optim);
    for (size_t u = 0; u < U; ++u)
      optim_->add(updated(u), grad(u), unit_segments(layout(u), 0, layout(u).numel), layout(u).name,
                  optimizer_place(u, 0, layout(u).numel, nullptr));
  }

  void begin_step() override {
    env_.be.fill(grads_.flat(reduce_dtype()), 0.f);
    for (auto& b : buckets_) b.ready = 0;
  }

  ParamSet forward_params(size_t u) override {
    return compute_views(u, [&](size_t x) { return params_[x].flat(param_dtype()); });
  }
  void after_forward(size_t u) override { release_unit_params(u); }
  ParamSet backward_params(size_t u) override {
    return compute_views(u, [&](size_t x) { return params_[x].flat(param_dtype()); }, true);
  }
  ParamSet grads(size_t u) override { return grad_views(u, [&](size_t x) { return grad(x); }); }

  // A split backward's B (its part of the gradient flushed), and how every after_backward begins.
  void after_input_grad(size_t u) override {
    release_unit_params(u);
    flush_grads(u, grad(u));
  }
  void after_backward(size_t u) override {
    after_input_grad(u);
    if (!last_micro_ || world_ == 1) return;
    Bucket& b = buckets_[bucket_of_[u]];
    if (++b.ready == b.units)
      works_.push_back(env_.comm.all_reduce(grads_.flat(reduce_dtype()).slice(b.offset, b.numel)));
  }

  double grad_norm_sq() override {
    wait_all();
    return sum_squares({grads_.flat(reduce_dtype())});
  }
  double grad_norm_sq_of(TensorPick pick) override {
    wait_all();
    std::vector<Tensor> parts;
    for (size_t u = 0; u < num_units(); ++u)
      for (const Tensor& t : part_of(u, grad(u), 0, pick)) parts.push_back(t);
    return parts.empty() ? 0.0 : sum_squares(parts);
  }

  std::vector<float> gather_unit_params(size_t u) override { return to_host(updated(u)); }
  std::pair<int64_t, int64_t> owned_range(size_t u) const override { return {0, layout(u).numel}; }
  std::pair<int64_t, int64_t> saved_range(size_t u) const override {
    return rank_ == 0 ? owned_range(u) : std::pair<int64_t, int64_t>{0, 0};
  }
  std::vector<float> gather_unit_grads(size_t u) override {
    wait_all();
    return to_host(grad(u));
  }
  Tensor reduced_grad(size_t u) override {
    wait_all();
    return grad(u);
  }

 protected:
  void set_unit_values(size_t u, std::span<const float> full) override {
    mp_.write_values(params_[u].flat(param_dtype()), mixed() ? master_[u].flat(DType::f32) : Tensor(), full);
  }
  Tensor owned_params(size_t u) const override { return params_[u].flat(param_dtype()); }
  Tensor updated(size_t u) const override { return mixed() ? master_[u].flat(DType::f32) : owned_params(u); }

 private:
  struct Bucket {
    int64_t offset, numel;
    int units;
    int ready = 0;
  };
  Tensor grad(size_t u) const { return grads_.flat(reduce_dtype()).slice(grad_offset_[u], layout(u).numel); }
  void wait_all() {
    for (Work& w : works_) w.wait();
    works_.clear();
  }

  std::vector<Block> params_, master_;
  Block grads_;
  std::vector<int64_t> grad_offset_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<Work> works_;
};

}  // namespace

std::unique_ptr<Strategy> make_ddp(const StrategyConfig& cfg, StrategyEnv env) {
  return std::make_unique<Ddp>(cfg, std::move(env));
}

}  // namespace shardlab
