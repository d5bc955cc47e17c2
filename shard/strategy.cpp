#include "shard/strategy.hpp"

#include "src/model/model.hpp"

namespace shardlab {

void StrategyConfig::validate() const {
  bool known = false;
  for (const auto& n : strategy_names()) known |= n == name;
  SHARD_REQUIRE(known, "unknown strategy '{}': expected dp, ddp, zero1, zero2 or zero3", name);
  SHARD_REQUIRE(bucket_mb > 0 && bucket_mb <= (1 << 20), "--bucket-mb {}: expected a size in (0, 1048576] MiB",
                bucket_mb);
  SHARD_REQUIRE(prefetch >= 0 && prefetch <= 1024, "--prefetch {}: expected 0 to 1024 units", prefetch);
  SHARD_REQUIRE(param_dtype != DType::f16 && reduce_dtype != DType::f16,
                "f16 storage needs loss scaling, which shardlab does not do: use --param-dtype and --reduce-dtype "
                "f32 or bf16");
  SHARD_REQUIRE(max_gathered <= (1 << 20), "--max-gathered {}: too large", max_gathered);
  SHARD_REQUIRE(max_gathered == 0 || max_gathered >= 2,
                "--max-gathered {}: at least 2 (the unit running and the one it borrows from), or 0 for automatic",
                max_gathered);
}

std::vector<std::string> strategy_names() { return {"dp", "ddp", "zero1", "zero2", "zero3"}; }

Strategy::Strategy(const StrategyConfig& cfg, StrategyEnv env)
    : cfg_(cfg), env_(std::move(env)), rank_(env_.comm.rank()), world_(env_.comm.world_size()) {
  param_ws_.resize(env_.units.size());
  grad_ws_.resize(env_.units.size());
  for (size_t u = 0; u < env_.units.size(); ++u) borrowed_.push_back(borrowed_tensors(env_.units, u));
}

void Strategy::load_params(const std::string& path) {
  SafetensorsReader r(path);
  for (size_t u = 0; u < num_units(); ++u) {
    std::vector<float> full(static_cast<size_t>(layout(u).numel));
    read_unit(r, layout(u), full, env_.spec);
    set_unit_values(u, full);
  }
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

double Strategy::sum_squares(const std::vector<Tensor>& tensors) const {
  Block acc = env_.pool.alloc(DType::f32, 1, Category::workspace, "grad norm");
  Tensor a = acc.flat(DType::f32);
  env_.be.fill(a, 0.f);
  for (const Tensor& t : tensors) {
    if (t.dtype() == DType::f32) {
      env_.be.sum_squares(t, a, true);
      continue;
    }
    Block wide;
    env_.be.sum_squares(env_.pool.widen(t, wide, "grad norm f32"), a, true);
  }
  float v = 0.f;
  env_.be.copy(Tensor::flat(&v, DType::f32, 1), a);
  return v;
}

Tensor Strategy::compute_params(size_t u, Tensor storage) {
  if (storage.dtype() == DType::f32) return storage;
  Block& ws = param_ws_[u];
  if (!ws) return env_.pool.widen(storage, ws, layout(u).name + " params (f32 compute)");
  return ws.flat(DType::f32).slice(0, storage.numel());
}

void Strategy::release_compute_params(size_t u) { param_ws_[u].reset(); }

Tensor Strategy::compute_grads(size_t u, Tensor storage) {
  if (storage.dtype() == DType::f32) return storage;
  Block& ws = grad_ws_[u];
  if (!ws) {
    ws = env_.pool.alloc(DType::f32, storage.numel(), Category::workspace, layout(u).name + " grads (f32 compute)");
    env_.be.fill(ws.flat(DType::f32), 0.f);
  }
  return ws.flat(DType::f32).slice(0, storage.numel());
}

void Strategy::flush_grads(size_t u, Tensor storage) {
  Block& ws = grad_ws_[u];
  if (!ws) return;
  Tensor w = ws.flat(DType::f32).slice(0, storage.numel());
  Block sum;
  Tensor acc = env_.pool.widen(storage, sum, layout(u).name + " grads accumulate");
  env_.be.add(acc, w, acc);
  env_.be.cast(storage, acc);  // one rounding to the reduce dtype
  ws.reset();
}

void Strategy::write_values(Tensor storage, Tensor master, std::span<const float> values) {
  Tensor src = Tensor::of(values);
  if (master.data()) env_.be.copy(master, src);
  if (storage.dtype() == DType::f32) {
    env_.be.copy(storage, src);
  } else {
    Block host = env_.pool.alloc(DType::f32, storage.numel(), Category::workspace, "values to store");
    Tensor h = host.flat(DType::f32).slice(0, storage.numel());
    env_.be.copy(h, src);
    env_.be.cast(storage, h);
  }
}

void Strategy::accumulate(Tensor dst, Tensor src) {
  if (dst.dtype() == DType::f32 && src.dtype() == DType::f32) {
    env_.be.add(dst, src, dst);
    return;
  }
  Block a, b;
  Tensor ta = env_.pool.widen(dst, a, "accumulate f32");
  Tensor tb = env_.pool.widen(src, b, "accumulate f32");
  env_.be.add(ta, tb, ta);
  env_.be.cast(dst, ta);
}

std::unique_ptr<Strategy> make_strategy(const StrategyConfig& cfg, StrategyEnv env) {
  cfg.validate();
  if (cfg.name == "ddp") return make_ddp(cfg, std::move(env));
  if (cfg.name == "dp") return make_dp(cfg, std::move(env));
  return make_zero(cfg, std::move(env), cfg.name.back() - '0');
}

}  // namespace shardlab
