#include "optim/optimizer.hpp"
#include "src/backend/ops/muon.hpp"
#include "src/backend/ops/optimizer.hpp"

#include <cmath>

namespace shardlab {

OptimizerKind parse_optimizer(const std::string& s) {
  if (s == "adamw") return OptimizerKind::adamw;
  if (s == "sgd") return OptimizerKind::sgd;
  if (s == "muon") return OptimizerKind::muon;
  throw InputError(fmt::format("--optimizer '{}': expected adamw, sgd or muon", s));
}

const char* optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::adamw: return "adamw";
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::muon: return "muon";
  }
  return "?";
}

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
  if (kind == OptimizerKind::muon) muon.validate();
}

void Optimizer::add(Tensor param, Tensor grad, std::vector<ParamSegment> segments, const std::string& tag,
                    GroupPlace place) {
  SHARD_CHECK(param.numel() == grad.numel(), "optimizer buffer {}: {} params, {} grads", tag, param.numel(),
              grad.numel());
  const int64_t n = param.numel();
  Group g{param, grad, std::move(segments), {}, {}, std::move(place), {}, {}, {}};
  Backend& be = pool_.backend();
  const char* m_name = cfg_.kind == OptimizerKind::adamw ? " adam m" : " momentum";
  g.m = pool_.alloc(DType::f32, n, Category::optim_state, tag + m_name);
  be.fill(g.m.flat(DType::f32).slice(0, n), 0.f);
  int64_t v_numel = cfg_.kind == OptimizerKind::adamw ? n : 0;
  if (cfg_.kind == OptimizerKind::muon) {
    // Each segment lies in one tensor: a matrix's part, or an AdamW tensor's.
    for (const ParamSegment& s : g.segments) {
      const int64_t at = g.place.first + s.offset;
      int which = -1;
      for (size_t i = 0; i < g.place.matrices.size(); ++i) {
        const MuonMatrix& mx = g.place.matrices[i];
        if (at >= mx.offset && at < mx.offset + mx.numel()) which = static_cast<int>(i);
      }
      SHARD_CHECK(which < 0 || at + s.numel <= g.place.matrices[which].offset + g.place.matrices[which].numel(),
                  "optimizer buffer {}: a segment at {} crosses the end of a matrix", tag, at);
      g.matrix_of.push_back(which);
      g.v_at.push_back(which < 0 ? v_numel : -1);
      if (which < 0) v_numel += s.numel;
    }
    SHARD_CHECK(g.place.exchange != nullptr || g.place.matrices.empty() || (g.place.first == 0 && g.place.whole == n),
                "optimizer buffer {}: a slice of its unit ({} of {} from {}) without an exchange", tag, n,
                g.place.whole, g.place.first);
  }
  if (v_numel > 0) {
    g.v = pool_.alloc(DType::f32, v_numel, Category::optim_state, tag + " adam v");
    be.fill(g.v.flat(DType::f32).slice(0, v_numel), 0.f);
  }
  groups_.push_back(std::move(g));
}

void Optimizer::assign_matrix_owners() {
  std::vector<std::vector<MuonMatrix>*> all;
  int ranks = 1;
  for (Group& g : groups_) {
    all.push_back(&g.place.matrices);
    if (g.place.exchange) ranks = std::max(ranks, g.place.exchange->ranks());
  }
  assign_owners(all, ranks, cfg_.muon.ns_steps);
}

void Optimizer::step(int64_t step, float lr, float grad_scale) {
  Backend& be = pool_.backend();
  for (Group& g : groups_) {
    Tensor m = g.m.flat(DType::f32), v = g.v ? g.v.flat(DType::f32) : Tensor();
    // Gradients kept in bf16 (mixed precision): AdamW reads them as they are (widened as read);
    // Muon and SGD get an f32 copy, one buffer at a time.
    Block wide;
    const bool as_stored =
        g.grad.dtype() == DType::f32 || (cfg_.kind == OptimizerKind::adamw && g.grad.dtype() == DType::bf16);
    Tensor grad = as_stored ? g.grad : pool_.widen(g.grad, wide, "optimizer f32 gradient");
    if (cfg_.kind == OptimizerKind::muon) {
      step_muon(g, grad, step, lr, grad_scale);
      continue;
    }
    if (cfg_.kind == OptimizerKind::adamw) {  // the group's tensors in one call (one launch on CUDA)
      std::vector<AdamWSegment> segments;
      for (const ParamSegment& s : g.segments)
        segments.push_back({s.offset, s.numel, s.decay ? cfg_.weight_decay : 0.f});
      const AdamWArgs a{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, 0.f, step, grad_scale};
      const int64_t n = g.param.numel();
      ops::adamw_update_segments(be, g.param, grad, m.slice(0, n), v.slice(0, n), segments, a, g.rounded);
      continue;
    }
    for (const ParamSegment& s : g.segments) {
      const SgdArgs a{lr, cfg_.momentum, s.decay ? cfg_.weight_decay : 0.f, grad_scale};
      ops::sgd_update(be, g.param.slice(s.offset, s.numel), grad.slice(s.offset, s.numel), m.slice(s.offset, s.numel),
                      a);
    }
  }
}

// AdamW on the group's other tensors; the momentum pass on its matrices' parts into an update
// buffer; the unit brought whole where the group is a slice of it; each matrix this rank owns
// orthogonalized in place (the others zeroed); the results back to the slice; the update.
void Optimizer::step_muon(Group& g, Tensor grad, int64_t step, float lr, float grad_scale) {
  Backend& be = pool_.backend();
  const int64_t n = g.param.numel();
  Tensor m = g.m.flat(DType::f32), v = g.v ? g.v.flat(DType::f32) : Tensor();
  bool any_matrix = false;
  for (size_t i = 0; i < g.segments.size(); ++i) {
    const ParamSegment& s = g.segments[i];
    if (g.matrix_of[i] >= 0) {
      any_matrix = true;
      continue;
    }
    AdamWArgs a{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, s.decay ? cfg_.weight_decay : 0.f, step, grad_scale};
    ops::adamw_update(be, g.param.slice(s.offset, s.numel), grad.slice(s.offset, s.numel), m.slice(s.offset, s.numel),
                      v.slice(g.v_at[i], s.numel), a);
  }
  // A rank whose slice holds no matrix still takes part in its group's collectives.
  if (!any_matrix && (g.place.exchange == nullptr || g.place.matrices.empty())) return;
  Block ub = pool_.alloc(DType::f32, n, Category::workspace, "muon update slice");
  Tensor U = ub.flat(DType::f32).slice(0, n);
  be.fill(U, 0.f);
  const MuonMomentumArgs ma{cfg_.momentum, cfg_.muon.nesterov, grad_scale};
  for (size_t i = 0; i < g.segments.size(); ++i) {
    const ParamSegment& s = g.segments[i];
    if (g.matrix_of[i] >= 0)
      ops::muon_momentum(be, grad.slice(s.offset, s.numel), m.slice(s.offset, s.numel), U.slice(s.offset, s.numel), ma);
  }
  MatrixExchange* ex = g.place.exchange;
  Block wb;
  Tensor W = U;
  if (ex) {
    wb = pool_.alloc(DType::f32, g.place.whole, Category::workspace, "muon update (whole unit)");
    W = wb.flat(DType::f32).slice(0, g.place.whole);
    ex->gather(U, W);
  }
  const int rank = ex ? ex->rank() : 0;
  for (const MuonMatrix& mx : g.place.matrices) {
    Tensor part = W.slice(mx.offset, mx.numel());
    if (!ex || mx.owner == rank) orthogonalize(g.place, mx, part);
    else be.fill(part, 0.f);
  }
  if (ex) ex->scatter(W, U);
  for (size_t i = 0; i < g.segments.size(); ++i) {
    const ParamSegment& s = g.segments[i];
    if (g.matrix_of[i] < 0) continue;
    const MuonMatrix& mx = g.place.matrices[g.matrix_of[i]];
    const float keep = 1.f - lr * (s.decay ? cfg_.weight_decay : 0.f);
    const float step_lr = static_cast<float>(lr * mx.lr_ratio);
    ops::muon_apply(be, g.param.slice(s.offset, s.numel), U.slice(s.offset, s.numel), keep, step_lr);
  }
}

// One matrix, in place: under tensor parallelism its parts are gathered from the group, the whole is
// iterated (the same on every rank of the group), and this rank's part is taken back.
void Optimizer::orthogonalize(const GroupPlace& place, const MuonMatrix& m, Tensor part) {
  if (m.tp_dim < 0 || place.tp == nullptr) return newton_schulz(pool_, part, part, m.rows, m.cols, cfg_.muon);
  const int T = place.tp->ranks();
  Block pb = pool_.alloc(DType::f32, m.numel() * T, Category::workspace, "muon tp parts");
  Block wb = pool_.alloc(DType::f32, m.numel() * T, Category::workspace, "muon tp whole");
  const Tensor parts = pb.flat(DType::f32).slice(0, m.numel() * T), whole = wb.flat(DType::f32).slice(0, m.numel() * T);
  place.tp->gather(part, parts);
  Backend& be = pool_.backend();
  tp_pieces(be, parts, whole, m, T, place.tp->rank(), true);
  newton_schulz(pool_, whole, whole, m.tp_dim == 0 ? m.rows * T : m.rows, m.tp_dim == 1 ? m.cols * T : m.cols,
                cfg_.muon);
  tp_pieces(be, parts, whole, m, T, place.tp->rank(), false);
  be.copy(part, parts.slice(0, m.numel()));
}

std::vector<std::string> Optimizer::state_names(OptimizerKind kind) {
  if (kind == OptimizerKind::sgd) return {"momentum"};
  if (kind == OptimizerKind::muon) return {"momentum", "adam_v"};
  return {"adam_m", "adam_v"};
}

Tensor Optimizer::state(size_t group, size_t i) const {
  SHARD_CHECK(group < groups_.size() && i < state_names().size(), "optimizer state {} of group {} ({} groups)", i,
              group, groups_.size());
  const Group& g = groups_[group];
  const int64_t n = g.param.numel();
  if (i == 0 || cfg_.kind != OptimizerKind::muon) return (i == 0 ? g.m : g.v).flat(DType::f32).slice(0, n);
  // Muon's v at the group's size, zero on the matrices, while a checkpoint reads or writes it;
  // filled from the compact buffer at every call (a save that failed leaves nothing stale).
  Backend& be = pool_.backend();
  Block* held = nullptr;
  for (auto& [at, block] : staged_)
    if (at == group) held = &block;
  if (held == nullptr) {
    staged_.emplace_back(group, pool_.alloc(DType::f32, n, Category::workspace, "adam v staged for a checkpoint"));
    held = &staged_.back().second;
  }
  Tensor full = held->flat(DType::f32).slice(0, n);
  be.fill(full, 0.f);
  for (size_t k = 0; k < g.segments.size(); ++k)
    if (g.matrix_of[k] < 0)
      be.copy(full.slice(g.segments[k].offset, g.segments[k].numel),
              g.v.flat(DType::f32).slice(g.v_at[k], g.segments[k].numel));
  return full;
}

void Optimizer::state_written() {
  Backend& be = pool_.backend();
  for (auto& [at, block] : staged_) {
    const Group& g = groups_[at];
    for (size_t k = 0; k < g.segments.size(); ++k)
      if (g.matrix_of[k] < 0)
        be.copy(g.v.flat(DType::f32).slice(g.v_at[k], g.segments[k].numel),
                block.flat(DType::f32).slice(g.segments[k].offset, g.segments[k].numel));
  }
  staged_.clear();
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
