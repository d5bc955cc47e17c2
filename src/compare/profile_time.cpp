// profile_time.cpp — `profile --time`: the step's cost ledger from the meta backend, priced.
#include "src/compare/profile_time.hpp"

#include <algorithm>
#include <chrono>

#include "memory/pool.hpp"
#include "src/model/family.hpp"
#include "src/train/price_layout.hpp"

namespace shardlab {

DeviceModel measure_cpu_model(Backend& be) {
  Pool pool(be);
  using clock = std::chrono::steady_clock;
  auto best_of = [&](int runs, auto&& f) {
    double best = 1e30;
    for (int i = 0; i < runs; ++i) {
      const auto t0 = clock::now();
      f();
      be.synchronize();
      best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
    }
    return best;
  };
  constexpr int64_t n = 1024;
  Block a = pool.alloc(DType::f32, n * n, Category::workspace, "cpu rates: A");
  Block b = pool.alloc(DType::f32, n * n, Category::workspace, "cpu rates: B");
  Block c = pool.alloc(DType::f32, n * n, Category::workspace, "cpu rates: C");
  for (Block* x : {&a, &b, &c}) be.fill(x->flat(DType::f32), 0.5f);
  const GemmDesc g{.m = n, .n = n, .k = n, .lda = n, .ldb = n, .ldc = n};
  const double gemm_s = best_of(5, [&] { be.gemm(g, a.data(), b.data(), c.data()); });
  constexpr int64_t m = int64_t{16} << 20;  // 64 MiB of floats per operand
  Block x = pool.alloc(DType::f32, m, Category::workspace, "cpu rates: x");
  Block y = pool.alloc(DType::f32, m, Category::workspace, "cpu rates: y");
  be.fill(x.flat(DType::f32), 1.f);
  be.fill(y.flat(DType::f32), 1.f);
  const double axpy_s = best_of(5, [&] { be.axpy(0.5f, x.flat(DType::f32), y.flat(DType::f32)); });
  const double flops = 2.0 * n * n * n / gemm_s, bandwidth = 3.0 * 4.0 * m / axpy_s;
  return cpu_device_model(
      flops, bandwidth,
      fmt::format("measured here on {} thread(s): a {}^3 sgemm, an axpy over 64 MiB", be.threads(), n));
}

double TimeReport::peak() const {
  return device.tensor_flops.value > 0 ? device.tensor_flops.value : device.vector_flops.value;
}

double TimeReport::mfu(const TimeRow& row) const {
  return row.step_s() > 0 && peak() > 0 ? model_flops / (row.step_s() * peak()) : 0;
}

TimeReport run_time_profile(const ProfileConfig& cfg, Device target, DeviceModel d) {
  TimeReport r;
  r.model = cfg.train.spec.name;
  r.world = cfg.world;
  r.micro_batch = cfg.micro_batch;
  r.seq = cfg.train.spec.seq;
  r.accum = static_cast<int>(cfg.train.accum);
  r.target = target;
  const ParallelDims dims = cfg.train.layout.dims.resolved(cfg.world);
  r.tokens = static_cast<double>(cfg.micro_batch) * static_cast<double>(cfg.train.accum) *
             static_cast<double>(cfg.train.spec.seq) * dims.dp();
  // The job's model FLOPs over its ranks: each rank's share of the step's work.
  r.model_flops = r.tokens * family_of(cfg.train.spec).flops_per_token(cfg.train.spec) / cfg.world;
  for (StrategyKind kind : cfg.strategies) {
    TrainConfig t = cfg.train;
    t.use_strategy(kind);
    const LayoutPrice layout = price_layout(t, cfg.world, cfg.micro_batch, target, d);
    for (const StagePrice& stage : layout.stages) {
      TimeRow row;
      row.label = dims.pp > 1 ? fmt::format("{} stage {}", t.label(), stage.stage) : t.label();
      row.kind = kind;
      row.rank = stage.rank;
      row.price = stage.price;
      row.bubble_s = layout.bubble_s(stage);
      r.rows.push_back(std::move(row));
    }
  }
  r.device = std::move(d);
  return r;
}

}  // namespace shardlab
