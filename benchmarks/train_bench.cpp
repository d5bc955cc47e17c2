#include "benchmarks/train_bench.hpp"

#include <algorithm>
#include <vector>

#include "benchmarks/gemm_bench.hpp"
#include "src/comm/sim_comm.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {

TrainBenchResult run_train_benchmark(Pool& pool, const TrainBenchConfig& cfg, std::FILE* out) {
  SHARD_REQUIRE(cfg.steps >= 1 && cfg.warmup >= 0, "--steps {} --warmup {}", cfg.steps, cfg.warmup);
  const ModelSpec& s = cfg.spec;
  const int64_t tokens = cfg.batch * s.seq;
  TrainBenchResult r;
  {
    std::FILE* sink = std::fopen("/dev/null", "w");
    GemmBenchConfig g;
    g.dim = s.dim;
    g.tokens = tokens;
    g.seconds = 0.2;
    r.sgemm_gflops = run_gemm_benchmark(pool, g, sink);
    std::fclose(sink);
  }
  TrainConfig tc;
  tc.spec = s;
  tc.batch = cfg.batch;
  tc.steps = cfg.warmup + cfg.steps;
  tc.schedule.kind = ScheduleKind::constant;
  tc.schedule.lr = 1e-4f;
  auto comm = make_sim_communicator(0, 1, pool);
  Trainer trainer(pool.backend(), pool, *comm, tc);
  const double n_params = static_cast<double>(trainer.num_params());
  const double flops_per_token = 6.0 * n_params + 6.0 * s.layers * s.dim * s.seq;
  std::fprintf(out, "# shardlab train-step benchmark: %s, batch %lld x %lld tokens, %s\n", s.describe().c_str(),
               static_cast<long long>(cfg.batch), static_cast<long long>(s.seq), pool.backend().describe().c_str());
  std::fprintf(out, "# FLOPs per token 6N + 6LCT = %.3g; sgemm on this model's shapes: %.1f GFLOP/s\n",
               flops_per_token, r.sgemm_gflops);
  std::vector<double> ms;
  for (int t = 0; t < cfg.warmup + cfg.steps; ++t) {
    StepStats st = trainer.step(t);
    if (t >= cfg.warmup) ms.push_back(st.ms);
  }
  std::sort(ms.begin(), ms.end());
  r.ms_per_step = ms[ms.size() / 2];  // median
  r.tokens_per_s = static_cast<double>(tokens) / (r.ms_per_step / 1e3);
  r.gflops = r.tokens_per_s * flops_per_token / 1e9;
  std::fprintf(out, "#%9s %12s %12s %12s %10s\n", "steps", "ms/step", "tokens/s", "GFLOP/s", "%sgemm");
  std::fprintf(out, " %9d %12.1f %12.0f %12.1f %9.1f%%\n", cfg.steps, r.ms_per_step, r.tokens_per_s, r.gflops,
               100.0 * r.gflops / r.sgemm_gflops);
  std::fflush(out);
  return r;
}

}  // namespace shardlab
