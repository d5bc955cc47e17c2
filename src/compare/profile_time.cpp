// profile_time.cpp — `profile --time`: the step's cost ledger from the meta backend, priced.
#include "src/compare/profile_time.hpp"

#include <algorithm>
#include <chrono>

#include "memory/pool.hpp"
#include "src/comm/mesh.hpp"
#include "src/model/family.hpp"
#include "src/train/predict.hpp"

namespace shardlab {
namespace {

// The world rank of pipeline stage k's first rank.
int first_rank_of_stage(const ParallelDims& dims, int k) {
  MeshCoord c;
  c.pp = k;
  return mesh_rank(dims, c);
}

// Each axis's link as seen from `rank`: across nodes at `inter`, else the device's own link.
void set_links(DeviceModel& d, const ParallelDims& dims, int rank, int ranks_per_node, double inter) {
  d.links.clear();
  const MeshCoord me = mesh_coord(dims, rank);
  for (const CommAxisRow& row : kCommAxes) {
    const bool across = row.axis == CommAxis::dp_shard_cross || group_crosses_nodes(dims, me, row.axis, ranks_per_node);
    d.links[row.name] = across ? inter : d.link.value;
  }
}

}  // namespace

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

double TimeRow::mfu() const { return price.total > 0 && peak > 0 ? model_flops / (price.total * peak) : 0; }

TimeReport run_time_profile(const ProfileConfig& cfg, Device target, DeviceModel d, int ranks_per_node, double inter) {
  TimeReport r;
  r.model = cfg.train.spec.name;
  r.world = cfg.world;
  r.micro_batch = cfg.micro_batch;
  r.seq = cfg.train.spec.seq;
  r.accum = static_cast<int>(cfg.train.accum);
  r.target = target;
  const ParallelDims dims = cfg.train.layout.dims.resolved(cfg.world);
  const double tokens = static_cast<double>(cfg.micro_batch) * static_cast<double>(cfg.train.accum) *
                        static_cast<double>(cfg.train.spec.seq) * dims.dp();
  const double per_token = family_of(cfg.train.spec).flops_per_token(cfg.train.spec);
  const double peak = d.tensor_flops.value > 0 ? d.tensor_flops.value : d.vector_flops.value;
  for (StrategyKind kind : cfg.strategies) {
    TrainConfig t = cfg.train;
    t.use_strategy(kind);
    for (int k = 0; k < dims.pp; ++k) {
      const int rank = first_rank_of_stage(dims, k);
      set_links(d, dims, rank, ranks_per_node, inter);
      TimeRow row;
      row.label = dims.pp > 1 ? fmt::format("{} stage {}", t.label(), k) : t.label();
      row.kind = kind;
      row.rank = rank;
      row.price = price_step(step_costs(t, cfg.world, rank, cfg.micro_batch, target), d);
      row.tokens = tokens;
      // The job's model FLOPs over its ranks: each rank's share of the step's work.
      row.model_flops = tokens * per_token / cfg.world;
      row.peak = peak;
      r.rows.push_back(std::move(row));
    }
  }
  d.links.clear();
  r.device = std::move(d);
  return r;
}

}  // namespace shardlab
