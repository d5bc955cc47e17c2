#include "optim/optimizer.hpp"
#include "src/backend/ops/optimizer.hpp"

#include <cmath>

namespace shardlab {

OptimizerKind parse_optimizer(const std::string& s) {
  if (s == "adamw") return OptimizerKind::adamw;
  if (s == "sgd") return OptimizerKind::sgd;
  throw InputError(fmt::format("--optimizer '{}': expected adamw or sgd", s));
}

const char* optimizer_name(OptimizerKind k) { return k == OptimizerKind::adamw ? "adamw" : "sgd"; }

ScheduleKind parse_schedule(const std::string& s) {
  if (s == "constant") return ScheduleKind::constant;
  if (s == "cosine") return ScheduleKind::cosine;
  throw InputError(fmt::format("--schedule '{}': expected constant or cosine", s));
}

const char* schedule_name(ScheduleKind k) { return k == ScheduleKind::constant ? "constant" : "cosine"; }

void OptimConfig::validate() const {
  SHARD_REQUIRE(beta1 >= 0.f && beta1 < 1.f, "--beta1 {}: expected 0 <= beta1 < 1", beta1);
  SHARD_REQUIRE(beta2 >= 0.f && beta2 < 1.f, "--beta2 {}: expected 0 <= beta2 < 1", beta2);
  SHARD_REQUIRE(eps > 0.f, "--eps {}: expected a positive value", eps);
  SHARD_REQUIRE(weight_decay >= 0.f, "--weight-decay {}: expected a non-negative value", weight_decay);
  SHARD_REQUIRE(momentum >= 0.f && momentum < 1.f, "--momentum {}: expected 0 <= momentum < 1", momentum);
}

void Optimizer::add(Tensor param, Tensor grad, std::vector<ParamSegment> segments, const std::string& tag) {
  SHARD_CHECK(param.numel() == grad.numel(), "optimizer buffer {}: {} params, {} grads", tag, param.numel(),
              grad.numel());
  Group g{param, grad, std::move(segments), {}, {}};
  g.m = pool_.alloc(DType::f32, param.numel(), Category::optim_state, tag + (cfg_.kind == OptimizerKind::sgd ? " momentum" : " adam m"));
  pool_.backend().fill(g.m.flat(DType::f32).slice(0, param.numel()), 0.f);
  if (cfg_.kind == OptimizerKind::adamw) {
    g.v = pool_.alloc(DType::f32, param.numel(), Category::optim_state, tag + " adam v");
    pool_.backend().fill(g.v.flat(DType::f32).slice(0, param.numel()), 0.f);
  }
  groups_.push_back(std::move(g));
}

void Optimizer::step(int64_t step, float lr, float grad_scale) {
  Backend& be = pool_.backend();
  for (Group& g : groups_) {
    Tensor m = g.m.flat(DType::f32), v = g.v ? g.v.flat(DType::f32) : Tensor();
    // Gradients kept in bf16/f16 (mixed precision) are widened for the update, one buffer at a time.
    Block wide;
    Tensor grad = g.grad.dtype() == DType::f32 ? g.grad : pool_.widen(g.grad, wide, "optimizer f32 gradient");
    for (const ParamSegment& s : g.segments) {
      float wd = s.decay ? cfg_.weight_decay : 0.f;
      Tensor p = g.param.slice(s.offset, s.numel), gr = grad.slice(s.offset, s.numel);
      if (cfg_.kind == OptimizerKind::adamw) {
        AdamWArgs a{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, wd, step, grad_scale};
        ops::adamw_update(be, p, gr, m.slice(s.offset, s.numel), v.slice(s.offset, s.numel), a);
      } else {
        SgdArgs a{lr, cfg_.momentum, wd, grad_scale};
        ops::sgd_update(be, p, gr, m.slice(s.offset, s.numel), a);
      }
    }
  }
}

std::vector<std::string> Optimizer::state_names(OptimizerKind kind) {
  if (kind == OptimizerKind::sgd) return {"momentum"};
  return {"adam_m", "adam_v"};
}

Tensor Optimizer::state(size_t group, size_t i) const {
  SHARD_CHECK(group < groups_.size() && i < state_names().size(), "optimizer state {} of group {} ({} groups)", i,
              group, groups_.size());
  const Group& g = groups_[group];
  return (i == 0 ? g.m : g.v).flat(DType::f32).slice(0, g.param.numel());
}

void LrSchedule::validate() const {
  SHARD_REQUIRE(lr > 0.f && std::isfinite(lr), "--lr {}: expected a positive learning rate", lr);
  SHARD_REQUIRE(warmup_steps >= 0, "--warmup-steps {}: expected a non-negative count", warmup_steps);
  SHARD_REQUIRE(min_lr_frac >= 0.f && min_lr_frac <= 1.f, "--min-lr-frac {}: expected a value in [0, 1]", min_lr_frac);
}

float LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  if (kind == ScheduleKind::constant) return lr;
  int64_t span = std::max<int64_t>(1, total_steps - 1 - warmup_steps);
  double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(span));
  double min_lr = lr * min_lr_frac;
  return static_cast<float>(min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress)));
}

float clip_factor(double global_norm, float max_norm) {
  if (max_norm <= 0.f || !(global_norm > max_norm)) return 1.f;
  return static_cast<float>(max_norm / global_norm);
}

}  // namespace shardlab
