#include "src/plan/adamw_rate.hpp"
#include "src/backend/ops/optimizer.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>

namespace shardlab {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// a = b + s * c over the backend's OpenMP threads; the arrays were first touched by the same
// static schedule, so each thread streams memory it placed.
void triad(float* a, const float* b, const float* c, float s, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

void first_touch(float* x, float v, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = v;
}

}  // namespace

AdamwBenchResult run_adamw_benchmark(Pool& pool, const AdamwBenchConfig& cfg, std::FILE* out) {
  SHARD_REQUIRE(cfg.elements >= 1024 && cfg.elements <= (int64_t{1} << 32), "--elements {}: expected 1024 to 2^32",
                cfg.elements);
  SHARD_REQUIRE(cfg.repeats >= 1 && cfg.repeats <= 1000, "--repeats {}: expected 1 to 1000", cfg.repeats);
  Pool& host = pool.host();
  Backend& be = host.backend();
  const int64_t n = cfg.elements;
  std::vector<Block> blocks;
  std::vector<float*> x;
  const char* names[4] = {"param", "grad", "adam m", "adam v"};
  for (const char* name : names) {
    blocks.push_back(host.alloc(DType::f32, n, Category::workspace, std::string("bench ") + name));
    x.push_back(blocks.back().span<float>().data());
  }
  for (int i = 0; i < 4; ++i) first_touch(x[i], i == 1 ? 1e-3f : 0.5f, n);
  std::fprintf(out, "# shardlab host AdamW benchmark: %lld f32 elements per array, %s, %d OpenMP threads\n",
               static_cast<long long>(n), be.describe().c_str(), omp_get_max_threads());
  std::fprintf(out, "# best of %d; triad counts 24 bytes per element (STREAM's convention), AdamW 28 "
               "(reads p, g, m, v; writes p, m, v)\n", cfg.repeats);
  double best_triad = 1e30, best_adamw = 1e30;
  for (int r = 0; r < cfg.repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    triad(x[0], x[1], x[2], 3.f, n);
    best_triad = std::min(best_triad, seconds_since(t0));
    first_touch(x[0], 0.5f, n);  // the parameters back to sane values before the update
    AdamWArgs a;
    a.step = r + 1;
    t0 = std::chrono::steady_clock::now();
    ops::adamw_update(be, blocks[0].flat(DType::f32), blocks[1].flat(DType::f32), blocks[2].flat(DType::f32),
                      blocks[3].flat(DType::f32), a);
    be.synchronize();
    best_adamw = std::min(best_adamw, seconds_since(t0));
  }
  AdamwBenchResult res;
  res.triad_gbs = 24.0 * double(n) / best_triad / 1e9;
  res.adamw_gbs = 28.0 * double(n) / best_adamw / 1e9;
  res.adamw_elements_per_s = double(n) / best_adamw;
  std::fprintf(out, "#%-14s %12s %14s %10s\n", "kernel", "ms", "elements/s", "GB/s");
  std::fprintf(out, " %-14s %12.2f %14.3g %10.2f\n", "stream triad", best_triad * 1e3, double(n) / best_triad,
               res.triad_gbs);
  std::fprintf(out, " %-14s %12.2f %14.3g %10.2f\n", "adamw (host)", best_adamw * 1e3, res.adamw_elements_per_s,
               res.adamw_gbs);
  std::fprintf(out, "# adamw at %.1f%% of the triad bandwidth\n", 100.0 * res.adamw_gbs / res.triad_gbs);
  std::fflush(out);
  return res;
}

}  // namespace shardlab
