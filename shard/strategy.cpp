#include "shard/strategy.hpp"

#include "shard/matrix_exchange.hpp"

#include <sstream>

#include "src/core/suggest.hpp"
#include "src/model/model.hpp"

namespace shardlab {

StrategyKind parse_strategy(const std::string& s, const std::vector<std::string>& aliases) {
  std::vector<std::string> names;
  for (StrategyKind k : all_strategies()) {
    if (s == strategy_name(k)) return k;
    names.push_back(strategy_name(k));
  }
  names.insert(names.end(), aliases.begin(), aliases.end());
  std::string list;
  for (size_t i = 0; i < names.size(); ++i) list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  throw InputError(fmt::format("unknown strategy '{}': expected {}{}", s, list, did_you_mean(s, names)));
}

const char* strategy_name(StrategyKind k) {
  switch (k) {
    case StrategyKind::dp: return "dp";
    case StrategyKind::ddp: return "ddp";
    case StrategyKind::zero1: return "zero1";
    case StrategyKind::zero2: return "zero2";
    case StrategyKind::zero3: return "zero3";
  }
  return "?";
}

int zero_stage(StrategyKind k) {
  switch (k) {
    case StrategyKind::zero1: return 1;
    case StrategyKind::zero2: return 2;
    case StrategyKind::zero3: return 3;
    default: return 0;
  }
}

const std::vector<StrategyKind>& all_strategies() {
  static const std::vector<StrategyKind> all = {StrategyKind::dp, StrategyKind::ddp, StrategyKind::zero1,
                                                StrategyKind::zero2, StrategyKind::zero3};
  return all;
}

std::vector<StrategyKind> parse_strategy_list(const std::string& s) {
  std::vector<StrategyKind> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(parse_strategy(item));
  SHARD_REQUIRE(!out.empty(), "--strategies '{}': name at least one strategy", s);
  return out;
}

Offload parse_offload(const std::string& s) {
  for (Offload o : {Offload::none, Offload::optimizer, Offload::params})
    if (s == offload_name(o)) return o;
  throw InputError(fmt::format("--offload '{}': expected none, optimizer or params", s));
}

const char* offload_name(Offload o) {
  switch (o) {
    case Offload::none: return "none";
    case Offload::optimizer: return "optimizer";
    case Offload::params: return "params";
  }
  return "?";
}

Offload offload_for(StrategyKind kind, Offload asked) {
  if (asked == Offload::params && kind != StrategyKind::zero3) asked = Offload::optimizer;
  if (asked == Offload::optimizer && zero_stage(kind) == 0) asked = Offload::none;
  return asked;
}

StrategyConfig StrategyConfig::under(StrategyKind k) const {
  StrategyConfig c = *this;
  c.kind = k;
  c.offload = offload_for(k, offload);
  if (k != StrategyKind::zero3) c.zeropp = ZeroPP{};
  return c;
}

std::string ZeroPP::label() const {
  std::string s;
  auto add = [&s](const std::string& w) {
    if (!s.empty()) s += ' ';
    s += w;
  };
  if (weight_bits) add("qwZ");
  if (secondary) add("hpZ");
  if (grad_bits) add(fmt::format("qgZ{}{}", grad_bits, error_feedback ? "+ef" : ""));
  return s;
}

std::string StrategyConfig::label(const ParallelDims& dims) const {
  std::string s = strategy_name(kind);
  if (dims.hybrid()) s += fmt::format(" S={}", dims.dp_shard);
  if (offload != Offload::none) s += fmt::format(" off:{}", offload_name(offload));
  if (zeropp.any()) s += fmt::format(" {}", zeropp.label());
  return s;
}

void StrategyConfig::validate() const {
  SHARD_REQUIRE(bucket_mb > 0 && bucket_mb <= (1 << 20), "--bucket-mb {}: expected a size in (0, 1048576] MiB",
                bucket_mb);
  SHARD_REQUIRE(prefetch == kPrefetchAuto || (prefetch >= 0 && prefetch <= 1024),
                "--prefetch {}: expected auto or 0 to 1024 units", prefetch);
  precision.validate();
  SHARD_REQUIRE(max_gathered <= (1 << 20), "--max-gathered {}: too large", max_gathered);
  SHARD_REQUIRE(max_gathered == 0 || max_gathered >= 2,
                "--max-gathered {}: at least 2 (the unit running and the one it borrows from), or 0 for automatic",
                max_gathered);
  SHARD_REQUIRE(offload != Offload::params || kind == StrategyKind::zero3,
                "--offload params with --strategy {}: only zero3 shards the parameters, so only zero3 can keep them on "
                "the host; use --strategy zero3, or --offload optimizer", strategy_name(kind));
  SHARD_REQUIRE(!zeropp.any() || kind == StrategyKind::zero3,
                "ZeRO++ ({}) with --strategy {}: its levers work on zero3's parameter all-gathers and gradient "
                "reduce-scatter; use --strategy zero3 (or hsdp)", zeropp.label(), strategy_name(kind));
  SHARD_REQUIRE(zeropp.weight_bits == 0 || zeropp.weight_bits == 8, "--quantize-weights: {} bits; int8 only",
                zeropp.weight_bits);
  SHARD_REQUIRE(zeropp.grad_bits == 0 || zeropp.grad_bits == 4 || zeropp.grad_bits == 8,
                "--quantize-grads: {} bits; int4 or int8", zeropp.grad_bits);
  SHARD_REQUIRE(!zeropp.error_feedback || (zeropp.grad_bits > 0 && precision.reduce_dtype == DType::f32),
                "--error-feedback carries qgZ's quantization error in f32 gradients: it needs --quantize-grads int4|int8 "
                "and --reduce-dtype f32 (got --quantize-grads {}, --reduce-dtype {})",
                zeropp.grad_bits ? fmt::format("int{}", zeropp.grad_bits) : "none", dtype_name(precision.reduce_dtype));
  SHARD_REQUIRE(zeropp.block > 0 && zeropp.block % 8 == 0 && zeropp.block <= (1 << 20),
                "--quantize-block {}: expected a positive multiple of 8 elements, at most 1048576", zeropp.block);
  SHARD_REQUIRE(offload != Offload::optimizer || zero_stage(kind) > 0,
                "--offload optimizer with --strategy {}: offload moves a rank's shard of the optimizer state to the "
                "host; use zero1, zero2 or zero3", strategy_name(kind));
}

Strategy::Strategy(const StrategyConfig& cfg, StrategyEnv env)
    : cfg_(cfg), env_(std::move(env)), rank_(env_.comm.rank()), world_(env_.comm.world_size()),
      mp_(cfg.precision, env_.pool, env_.units.size()) {
  for (size_t u = 0; u < env_.units.size(); ++u) borrowed_.push_back(borrowed_tensors(env_.units, u));
  for (size_t u = 0; u < env_.units.size(); ++u) {
    const Unit& unit = *env_.units[u];
    auto names = std::make_shared<std::set<std::string>>();
    std::map<size_t, std::vector<ElemRange>> reads;
    std::map<size_t, bool> partial;  // whether u leaves some of x's tensors unwidened
    auto add = [&](size_t x, const TensorDecl& t) {
      std::vector<ElemRange>& r = reads[x];
      if (unit.gemm_only(t.name)) {
        names->insert(t.name);
        partial[x] = true;
      } else if (!r.empty() && r.back().offset + r.back().count == t.offset) {
        r.back().count += t.numel;  // adjacent: one range
      } else {
        r.push_back({t.offset, t.numel});
      }
    };
    for (const TensorDecl& t : layout(u).tensors) add(u, t);
    for (const BorrowedTensor& b : borrowed_[u]) add(b.owner, *b.decl), partial[b.owner] = true;  // a part of it
    std::erase_if(reads, [&](const auto& kv) { return !partial[kv.first]; });  // all of x: widened whole
    f32_reads_.push_back(std::move(reads));
    gemm_only_.push_back(std::move(names));
  }
  if (env_.optim.kind == OptimizerKind::muon && env_.mesh.size(CommAxis::tp) > 1)
    tp_exchange_ = std::make_unique<CommExchange>(env_.mesh.comm(CommAxis::tp));
}


ParamSet Strategy::compute_views(size_t u, const std::function<Tensor(size_t)>& storage_of, bool backward) {
  const bool lean = mixed() && env_.be.low_precision_gemm();
  const bool none = lean && backward && !env_.units[u]->backward_reads_params();
  static const std::vector<ElemRange> nothing;
  ParamSet s = views(u, [&](size_t x) {
    const auto it = f32_reads_[u].find(x);
    const std::vector<ElemRange>* only =
        none ? &nothing : (lean && it != f32_reads_[u].end() ? &it->second : nullptr);
    return mp_.compute_params(x, storage_of(x), layout(x).name, only);
  });
  if (!lean) return s;
  std::shared_ptr<const std::set<std::string>> unwidened = gemm_only_[u];
  if (none) {  // every tensor of its view
    auto all = std::make_shared<std::set<std::string>>();
    for (const TensorDecl& t : layout(u).tensors) all->insert(t.name);
    for (const BorrowedTensor& b : borrowed_[u]) all->insert(b.decl->name);
    unwidened = std::move(all);
  }
  s.set_low(views(u, storage_of), std::move(unwidened));
  return s;
}

void Strategy::init_params(uint64_t seed) {
  for (size_t u = 0; u < num_units(); ++u) {
    std::vector<float> v(static_cast<size_t>(layout(u).numel));
    init_flat_range(layout(u), seed, 0, v);
    set_unit_values(u, v);
  }
}

void Strategy::load_params(const std::string& path) {
  HfWeights r(path);
  for (size_t u = 0; u < num_units(); ++u) {
    std::vector<float> full(static_cast<size_t>(layout(u).numel));
    read_unit(r, layout(u), full, env_.spec);
    set_unit_values(u, full);
  }
}

void Strategy::optimizer_step(int64_t step, float lr, float grad_scale, const ParamEdit& edit) {
  if (!optim_) return;
  // On a GPU under mixed precision AdamW writes the bf16 parameters itself, where they share a tier
  // with the master copy (not under --offload optimizer: the master is on the host, the parameters
  // on the device, which a prediction's one meta device would not tell) and no edit follows the
  // update (one group per unit).
  std::vector<bool> rounded(num_units(), false);
  const bool fuse = mixed() && env_.be.low_precision_gemm() && !edit.fn && cfg_.offload != Offload::optimizer;
  for (size_t u = 0; optim_->groups() == num_units() && u < num_units(); ++u) {
    const Tensor p = owned_params(u), m = updated(u);
    const bool here = fuse && p.device() == m.device() && p.numel() == m.numel() && p.dtype() == DType::bf16;
    optim_->set_rounded_copy(u, here ? p : Tensor());
    rounded[u] = optim_->rounds(u);
  }
  optim_->step(step, lr, grad_scale);
  if (edit.fn && env_.be.device() != Device::meta) {  // no values to edit in a prediction
    for (size_t u = 0; u < num_units(); ++u) {
      const Tensor owned = updated(u);
      const int64_t begin = owned_range(u).first, end = owned_range(u).second;
      for (const TensorDecl& t : layout(u).tensors) {
        const int64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
        if (!edit.pick(t) || lo >= hi) continue;
        const Tensor part = owned.slice(lo - begin, hi - lo);
        std::vector<float> values = to_host(part);
        edit.fn(layout(u), t, lo - t.offset, values);
        env_.be.copy(part, Tensor::of(std::span<const float>(values)));
      }
    }
  }
  for (size_t u = 0; u < num_units(); ++u)
    if (!rounded[u]) params_from_master(u);
  after_update();
}

void Strategy::sync_after_load() {
  if (!optim_) return;
  for (size_t u = 0; u < num_units(); ++u) params_from_master(u);
  after_update();
}

void Strategy::release_state_views() const {
  if (optim_) optim_->release_staging();
}

void Strategy::state_views_written() {
  if (optim_) optim_->state_written();
}

GroupPlace Strategy::optimizer_place(size_t u, int64_t first, int64_t whole, MatrixExchange* ex) const {
  if (env_.optim.kind != OptimizerKind::muon) return {};
  return {first, whole, muon_matrices(layout(u), env_.optim.muon.adjust_lr), ex, tp_exchange_.get()};
}

std::vector<Tensor> Strategy::owned_state(size_t u) const {
  if (!optim_) return {};
  std::vector<Tensor> t = {updated(u)};
  for (size_t i = 0; i < optim_->state_names().size(); ++i) t.push_back(optim_->state(u, i));
  return t;
}

std::vector<std::string> Strategy::owned_state_names() const {
  std::vector<std::string> names = Optimizer::state_names(env_.optim.kind);
  names.insert(names.begin(), "param");
  return names;
}

std::vector<float> Strategy::to_host(Tensor t) const {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::f32) {
    env_.be.copy(Tensor::of(std::span<float>(v)), t);
  } else {
    Block wide;
    env_.be.copy(Tensor::of(std::span<float>(v)), env_.pool.widen(t, wide, "widen for host copy"));
  }
  return v;
}

std::vector<Tensor> Strategy::part_of(size_t u, Tensor owned, int64_t begin, TensorPick pick) const {
  std::vector<Tensor> parts;
  const int64_t end = begin + owned.numel();
  for (const TensorDecl& t : layout(u).tensors) {
    if (!pick(t)) continue;
    const int64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    if (lo < hi) parts.push_back(owned.slice(lo - begin, hi - lo));
  }
  return parts;
}

double Strategy::sum_squares(const std::vector<Tensor>& tensors, Pool* tier) const {
  Pool& pool = tier ? *tier : env_.pool;
  Backend& be = pool.backend();
  Block acc = pool.alloc(DType::f32, 1, Category::workspace, "grad norm");
  Tensor a = acc.flat(DType::f32);
  be.fill(a, 0.f);
  for (const Tensor& t : tensors) {
    // A GPU reads bf16 gradients as they are: no f32 copy of them (the host tier's, under
    // --offload, is the CPU's, which takes f32 only).
    if (t.dtype() == DType::f32 || (t.dtype() == DType::bf16 && be.reduces_bf16() && pool.tier() == Tier::device)) {
      be.sum_squares(t, a, true);
      continue;
    }
    Block wide;
    be.sum_squares(pool.widen(t, wide, "grad norm f32"), a, true);
  }
  float v = 0.f;
  be.copy(Tensor::flat(&v, DType::f32, 1), a);
  return v;
}

std::unique_ptr<Strategy> make_strategy(const StrategyConfig& cfg, StrategyEnv env) {
  cfg.validate();
  switch (cfg.kind) {
    case StrategyKind::dp: return make_dp(cfg, std::move(env));
    case StrategyKind::ddp: return make_ddp(cfg, std::move(env));
    default: return make_zero(cfg, std::move(env));
  }
}

}  // namespace shardlab
