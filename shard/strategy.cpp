#include "shard/strategy.hpp"

#include "src/model/safetensors.hpp"

namespace shardlab {

void StrategyConfig::validate() const {
  bool known = false;
  for (const auto& n : strategy_names()) known |= n == name;
  SHARD_REQUIRE(known, "unknown strategy '{}': expected dp, ddp, zero1, zero2 or zero3", name);
  SHARD_REQUIRE(bucket_mb > 0, "--bucket-mb {}: expected a positive size", bucket_mb);
  SHARD_REQUIRE(prefetch >= 0, "--prefetch {}: expected 0 or more units", prefetch);
  SHARD_REQUIRE(max_gathered == 0 || max_gathered >= 2,
                "--max-gathered {}: at least 2 (the unit running and the one it borrows from), or 0 for automatic",
                max_gathered);
}

std::vector<std::string> strategy_names() { return {"dp", "ddp", "zero1", "zero2", "zero3"}; }

Strategy::Strategy(StrategyEnv env) : env_(std::move(env)), rank_(env_.comm.rank()), world_(env_.comm.world_size()) {
  borrowed_.resize(env_.units.size());
  for (size_t u = 0; u < env_.units.size(); ++u)
    for (const std::string& name : env_.units[u]->borrowed())
      for (size_t o = 0; o < env_.units.size(); ++o)
        for (const TensorDecl& t : env_.units[o]->layout().tensors)
          if (t.name == name) borrowed_[u].emplace_back(o, &t);
  for (size_t u = 0; u < env_.units.size(); ++u) {
    int64_t n = env_.units[u]->layout().numel;
    SHARD_REQUIRE(n >= world_, "unit {} has {} parameters, fewer than the {} ranks that would shard it",
                  env_.units[u]->name(), n, world_);
  }
}

void Strategy::load_params(const std::string& path) {
  SafetensorsReader r(path);
  for (size_t u = 0; u < num_units(); ++u) {
    std::vector<float> full(static_cast<size_t>(layout(u).numel));
    for (const TensorDecl& t : layout(u).tensors) {
      std::string name = r.has(t.name) ? t.name : "transformer." + t.name;
      SHARD_REQUIRE(r.has(name), "'{}' has no tensor '{}' (nor 'transformer.{}'): is it a GPT-2 checkpoint of {}?",
                    path, t.name, t.name, env_.spec.describe());
      r.read_f32(name, std::span<float>(full).subspan(static_cast<size_t>(t.offset), static_cast<size_t>(t.numel)),
                 &t.shape);
    }
    set_unit_values(u, full);
  }
}

std::vector<float> Strategy::to_host(Tensor t) const {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  env_.be.copy(Tensor::of(std::span<float>(v)), t);
  return v;
}

double Strategy::sum_squares(const std::vector<Tensor>& tensors) const {
  Block acc = env_.pool.alloc(DType::f32, 1, Category::workspace, "grad norm");
  Tensor a = acc.flat(DType::f32);
  env_.be.fill(a, 0.f);
  for (const Tensor& t : tensors) env_.be.sum_squares(t, a, true);
  float v = 0.f;
  env_.be.copy(Tensor::flat(&v, DType::f32, 1), a);
  return v;
}

std::unique_ptr<Strategy> make_strategy(const StrategyConfig& cfg, StrategyEnv env) {
  cfg.validate();
  if (cfg.name == "ddp") return make_ddp(cfg, std::move(env));
  if (cfg.name == "dp") return make_dp(cfg, std::move(env));
  return make_zero(cfg, std::move(env), cfg.name.back() - '0');
}

}  // namespace shardlab
