#include "benchmarks/train_bench.hpp"

#include <algorithm>
#include <vector>

#include "benchmarks/gemm_bench.hpp"
#include "src/comm/sim_comm.hpp"
#include "src/core/stats.hpp"
#include "src/core/units.hpp"
#include "src/model/family.hpp"
#include "src/train/predict.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {

TrainBenchResult run_train_benchmark(Pool& pool, const TrainBenchConfig& cfg, std::FILE* out, Communicator* world) {
  SHARD_REQUIRE(cfg.steps >= 1 && cfg.warmup >= 0, "--steps {} --warmup {}", cfg.steps, cfg.warmup);
  const int ranks = world ? world->world_size() : 1;
  SHARD_REQUIRE(ranks == 1 || !cfg.levers(), "bench-train times a lever against none on one rank only ({} started)",
                ranks);
  const ModelSpec& s = cfg.spec;
  const int64_t tokens = cfg.batch * s.seq;
  TrainBenchResult r;
  {
    std::FILE* sink = std::fopen("/dev/null", "w");
    GemmBenchConfig g;
    g.dim = s.dim;
    g.tokens = tokens / ranks;  // one rank's rows
    g.heads = s.heads, g.seq = s.seq, g.vocab = s.vocab, g.layers = s.layers, g.kv_heads = s.num_kv_heads();
    StepConfig step;  // the model's products as its units issue them, whatever the family (one
    step.spec = s;    // rank's micro-batch: the products do not depend on the strategy)
    g.recorded = step_gemms(step, 1, 0, std::max<int64_t>(1, cfg.batch / ranks));
    g.grid = false;
    g.seconds = 0.1;
    const GemmBenchResult gr = run_gemm_benchmark(pool, g, sink);
    r.sgemm_gflops = gr.ceiling;
    r.sgemm_picked_gflops = gr.chosen;
    std::fclose(sink);
  }
  TrainConfig tc;
  tc.spec = s;
  tc.batch = cfg.batch;
  tc.steps = cfg.warmup + cfg.steps;
  tc.schedule.kind = ScheduleKind::constant;
  tc.schedule.lr = 1e-4f;
  tc.strategy = cfg.strategy;
  // The sim stands in for the transport one rank would use: mpi on the cpu, nccl on a GPU.
  tc.comm = pool.backend().device() == Device::cuda ? CommKind::nccl : CommKind::mpi;
  tc.checkpointing = cfg.checkpointing;
  tc.sequence_parallel = cfg.sequence_parallel;
  // One trainer per configuration, each with its own pools (so each ledger is its own) and
  // communicator; steps alternate between them so that both see the same machine state.
  struct Run {
    std::string label;
    std::unique_ptr<Pool> pool;
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<Trainer> trainer;
    std::vector<double> ms;
    StepStats last;
  };
  std::vector<Run> runs;
  auto add = [&](TrainConfig c, std::string label) {
    Run run{std::move(label), std::make_unique<Pool>(pool.backend(), PoolConfig{pool.budget(), pool.host().budget()}),
            nullptr, nullptr, {}, {}};
    if (!world) run.comm = make_sim_communicator(0, 1, *run.pool, sim_transport(c.comm));
    run.trainer = std::make_unique<Trainer>(pool.backend(), *run.pool, world ? *world : *run.comm, c);
    runs.push_back(std::move(run));
  };
  add(tc, fmt::format("{}{}, checkpointing {}, offload {}", strategy_name(tc.strategy.kind),
                      ranks > 1 ? fmt::format(" x{} ranks", ranks) : std::string(), checkpointing_name(tc.checkpointing),
                      offload_name(tc.strategy.offload)));
  if (cfg.levers()) {
    TrainConfig base = tc;
    base.checkpointing = Checkpointing::none;
    base.strategy.offload = Offload::none;
    add(base, fmt::format("{}, no levers", strategy_name(tc.strategy.kind)));
  }
  const double flops_per_token = family_of(s).flops_per_token(s);
  std::fprintf(out, "# shardlab train-step benchmark: %s, batch %lld x %lld tokens%s, %s\n", s.describe().c_str(),
               static_cast<long long>(cfg.batch), static_cast<long long>(s.seq),
               ranks > 1 ? fmt::format(" over {} ranks (GFLOP/s and %sgemm per rank)", ranks).c_str() : "",
               pool.backend().describe().c_str());
  std::fprintf(out, "# FLOPs per token 6N + 6LCT = %.3g (recomputation not counted); sgemm ceiling on this step's "
               "products (the best library for each, FLOP-weighted): %.1f GFLOP/s; as picked: %.1f\n", flops_per_token,
               r.sgemm_gflops, r.sgemm_picked_gflops);
  for (int t = 0; t < cfg.warmup + cfg.steps; ++t)
    for (Run& run : runs) {
      run.last = run.trainer->step(t);
      if (t >= cfg.warmup) run.ms.push_back(run.last.ms);
    }
  std::fprintf(out, "#%-44s %6s %10s %10s %9s %7s %8s %11s %11s\n", "configuration", "steps", "ms/step", "tokens/s",
               "GFLOP/s", "%sgemm", "vs none", "peak", "host peak");
  const double base_ms = median(runs.back().ms);
  for (const Run& run : runs) {
    const double ms = median(run.ms), tps = static_cast<double>(tokens) / (ms / 1e3),
                 gf = tps * flops_per_token / 1e9 / ranks;
    std::fprintf(out, " %-44s %6d %10.1f %10.0f %9.1f %6.1f%% %7.2fx %11s %11s\n", run.label.c_str(), cfg.steps, ms, tps,
                 gf, 100.0 * gf / r.sgemm_gflops, ms / base_ms,
                 format_bytes(static_cast<double>(run.last.peak_bytes)).c_str(),
                 format_bytes(static_cast<double>(run.last.host_peak_bytes)).c_str());
  }
  r.ms_per_step = median(runs[0].ms);
  r.tokens_per_s = static_cast<double>(tokens) / (r.ms_per_step / 1e3);
  r.gflops = r.tokens_per_s * flops_per_token / 1e9 / ranks;
  if (cfg.peak_tflops > 0) {
    r.mfu = r.gflops / (cfg.peak_tflops * 1e3);
    std::fprintf(out, "# MFU %.1f%% of %.0f TFLOP/s (%s: %.1f TFLOP/s achieved, 6N + 6LCT per token)\n", 100.0 * r.mfu,
                 cfg.peak_tflops, runs[0].label.c_str(), r.gflops / 1e3);
  }
  if (cfg.levers()) r.baseline_ms_per_step = base_ms;
  // One line for scripts (benchmarks/compare_pytorch.sh): the first configuration's figures.
  std::fprintf(out, "# result ms_per_step=%.1f tokens_per_s=%.0f gflops_per_rank=%.1f ceiling=%.1f ranks=%d\n",
               r.ms_per_step, r.tokens_per_s, r.gflops, r.sgemm_gflops, ranks);
  std::fflush(out);
  return r;
}

}  // namespace shardlab
