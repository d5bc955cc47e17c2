#include "benchmarks/train_bench.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "src/train/sgemm_ceiling.hpp"
#include "src/comm/sim_comm.hpp"
#include "src/core/stats.hpp"
#include "src/core/units.hpp"
#include "src/model/family.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {
namespace {

// Seconds per all-reduce of `full_bytes` (f32) over `comm`: the slowest rank's best of three windows
// of 10 calls, after 2 untimed. Collective over comm: every rank uses the same size (the group's
// largest).
double all_reduce_seconds(Communicator& comm, Pool& pool, double full_bytes) {
  Block one = pool.alloc(DType::f32, 1, Category::comm_buffer, "bench size");
  Tensor n = one.flat(DType::f32).slice(0, 1);
  const float mine = static_cast<float>(std::max(1.0, full_bytes / sizeof(float)));
  pool.backend().copy(n, Tensor::flat(const_cast<float*>(&mine), DType::f32, 1));
  comm.all_reduce(n, ReduceOp::max).wait();
  float count = 0;
  pool.backend().copy(Tensor::flat(&count, DType::f32, 1), n);
  const auto elems = static_cast<int64_t>(count);
  Block buf = pool.alloc(DType::f32, elems, Category::comm_buffer, "bench all-reduce");
  Tensor t = buf.flat(DType::f32).slice(0, elems);
  pool.backend().fill(t, 1.f);
  for (int i = 0; i < 2; ++i) comm.all_reduce(t).wait();
  float secs = 0;
  for (int window = 0; window < 3; ++window) {  // the best window: a neighbour's burst only slows one down
    comm.barrier().wait();
    const auto t0 = std::chrono::steady_clock::now();
    constexpr int kIters = 10;
    for (int i = 0; i < kIters; ++i) comm.all_reduce(t).wait();
    pool.backend().synchronize();
    const double e = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto s = static_cast<float>(e / kIters);
    secs = window == 0 ? s : std::min(secs, s);
  }
  pool.backend().copy(n, Tensor::flat(&secs, DType::f32, 1));
  comm.all_reduce(n, ReduceOp::max).wait();
  pool.backend().copy(Tensor::flat(&secs, DType::f32, 1), n);
  return secs;
}

// Mean full bytes per collective call over comm so far (its own stats: a split counts only its group's).
double mean_call_bytes(const Communicator& comm) {
  double bus = 0;
  uint64_t calls = 0;
  for (const OpCounter& c : comm.stats().total) bus += c.bytes, calls += c.calls;
  const double f = bus_factor(CommOp::all_reduce, comm.world_size());
  return calls && f > 0 ? bus / static_cast<double>(calls) / f : 0;
}

// The last step's bus bytes on the tensor-parallel axis and on the data-parallel ones (the world's
// own traffic included: at tp 1 the data-parallel group is the world), and an estimate of their
// time. The communicators keep no clock, so the time share is not measured: it is each axis's bytes
// over the bus bandwidth of an all-reduce of its mean call size on the same group, timed alone
// after the steps (no overlap with compute, no waiting on a slower rank, all-gathers and
// reduce-scatters priced as all-reduces of the same bus bytes).
TrainBenchResult::Comm comm_share(Trainer& trainer, Pool& pool, double ms_per_step, std::FILE* out) {
  Mesh& mesh = trainer.mesh();
  const auto bytes = mesh.last_step_bytes();  // a copy: the timing below counts bytes too
  TrainBenchResult::Comm c;
  c.tp_bytes = bytes[static_cast<int>(CommAxis::tp)];
  for (CommAxis a : {CommAxis::world, CommAxis::dp, CommAxis::dp_shard, CommAxis::dp_replicate})
    c.dp_bytes += bytes[static_cast<int>(a)];
  auto estimate = [&](Communicator& comm, double axis_bytes) {
    if (comm.world_size() <= 1) return 0.0;  // no traffic; every rank decides alike (a mesh size)
    const double full = mean_call_bytes(comm);
    const double s = all_reduce_seconds(comm, pool, full);
    const double busbw = bus_bytes(CommOp::all_reduce, std::max(1.0, full), comm.world_size()) / s;
    return axis_bytes / busbw * 1e3;
  };
  c.tp_est_ms = estimate(mesh.comm(CommAxis::tp), c.tp_bytes);
  c.dp_est_ms = estimate(mesh.dp(), c.dp_bytes);
  std::string axes;
  for (int a = 0; a < kNumCommAxes; ++a)
    if (bytes[a] > 0)
      axes += fmt::format("{}{} {}", axes.empty() ? "" : ", ", comm_axis_name(static_cast<CommAxis>(a)),
                          format_bytes(bytes[a]));
  std::fprintf(out, "# comm per step, bus bytes of rank 0 by axis: %s\n", axes.empty() ? "none" : axes.c_str());
  std::fprintf(out, "# comm time share not measured (the communicators keep no clock); estimated from an isolated "
               "all-reduce of each axis's mean call size: tp %.1f ms (%.1f%% of the step), data-parallel %.1f ms "
               "(%.1f%%)\n", c.tp_est_ms, 100.0 * c.tp_est_ms / ms_per_step, c.dp_est_ms,
               100.0 * c.dp_est_ms / ms_per_step);
  return c;
}

// "0.1234,0.0567" (per stage), "-" without a pipeline.
std::string bubble_list(const std::vector<double>& b) {
  std::string s;
  for (double v : b) s += fmt::format("{}{:.4f}", s.empty() ? "" : ",", v);
  return s.empty() ? "-" : s;
}

// One rank's pipelined steps, medians over the timed ones (ms).
struct StageTimes {
  std::vector<double> step, wall, busy, forward, backward, weight, bubble;
  void add(const StepStats& s, const PipelineTiming& p) {
    step.push_back(s.ms);
    wall.push_back(p.wall_ms());
    busy.push_back(p.busy_ms());
    forward.push_back(p.forward_ms());
    backward.push_back(p.backward_ms());
    weight.push_back(p.weight_ms());
    bubble.push_back(p.bubble());
  }
};

// Under --pp: every rank's stage times, gathered (collective over world), printed as one row per
// rank beside the theory and beside the schedule simulated with the measured pass times (the
// stages' mean forward, backward and weight time per chunk and micro-batch: the theory's equal
// passes replaced by this machine's); returns each stage's bubble (its first data-parallel rank's).
std::vector<double> print_bubbles(Communicator& world, const Trainer& trainer, const StageTimes& mine,
                                  const TrainBenchConfig& cfg, double theory, std::FILE* out) {
  constexpr int kFields = 8;
  const int n = world.world_size(), me = world.rank();
  std::vector<float> all(static_cast<size_t>(n * kFields), 0.f);
  const double row[kFields] = {static_cast<double>(trainer.pipeline_rank()), median(mine.step), median(mine.wall),
                               median(mine.busy), median(mine.forward), median(mine.backward), median(mine.weight),
                               median(mine.bubble)};
  for (int k = 0; k < kFields; ++k) all[static_cast<size_t>(me * kFields + k)] = static_cast<float>(row[k]);
  world.all_reduce(std::span<float>(all)).wait();
  const ParallelDims dims = cfg.layout.dims.resolved(n);
  const PpSchedule kind = cfg.layout.pipeline.schedule;
  const int V = cfg.layout.pipeline.virtual_stages, M = static_cast<int>(cfg.accum);
  PassTimes pass{0, 0, 0};  // per chunk and micro-batch, the ranks' mean
  for (int r = 0; r < n; ++r) {
    const float* f = &all[static_cast<size_t>(r * kFields)];
    pass.forward += f[4] / (n * M * V), pass.input += f[5] / (n * M * V), pass.weight += f[6] / (n * M * V);
  }
  const double modelled = simulated_bubble(build_schedule(kind, dims.pp, V, M), pass);
  std::fprintf(out, "# pipeline: pp %d, %s%s, %lld micro-batches of %lld sequences; bubble = 1 - a stage's compute / the "
               "pipelined part (the stages enter it together: a barrier; to the last stage's last send), medians over the timed steps; theory %s = %.1f%%\n",
               dims.pp, kind.name(), V > 1 ? fmt::format(" V {}", V).c_str() : "", static_cast<long long>(cfg.accum),
               static_cast<long long>(cfg.batch / dims.dp() / cfg.accum), kind->bubble_formula, 100 * theory);
  std::fprintf(out, "# measured passes per chunk and micro-batch: F %.3f ms, B %.3f ms, W %.3f ms%s; the schedule "
               "simulated with them (no message time): bubble %.1f%% (model)\n", pass.forward, pass.input, pass.weight,
               kind->splits_backward ? "" : " (B is the whole backward)", 100 * modelled);
  std::fprintf(out, "#%-5s %5s %9s %9s %9s %9s %9s %9s %8s %8s %8s %8s\n", "rank", "stage", "step ms", "pipe ms",
               "busy ms", "fwd ms", "bwd ms", "W ms", "bubble", "theory", "diff", "model");
  // The theory's span is the whole pipeline's (the first stage's first forward to its last
  // backward): a later stage that finishes early is idle to that end too. The stages start together
  // (the barrier), so the longest stage's span is the pipeline's.
  double span = 0;
  for (int r = 0; r < n; ++r) span = std::max(span, static_cast<double>(all[static_cast<size_t>(r * kFields + 2)]));
  std::vector<double> bubble(static_cast<size_t>(dims.pp), -1);
  for (int r = 0; r < n; ++r) {
    const float* f = &all[static_cast<size_t>(r * kFields)];
    const int stage = static_cast<int>(f[0]);
    const double b = span > 0 ? 1 - f[3] / span : 0;
    if (bubble[static_cast<size_t>(stage)] < 0) bubble[static_cast<size_t>(stage)] = b;
    std::fprintf(out, " %-5d %5d %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %7.1f%% %7.1f%% %+7.1f %7.1f%%\n", r, stage, f[1],
                 f[2], f[3], f[4], f[5], f[6], 100.0 * b, 100 * theory, 100.0 * (b - theory), 100 * modelled);
  }
  return bubble;
}

// The sgemm ceiling on this step's products: this rank's part under --tp, its rows per micro-step.
void measure_ceiling(Pool& pool, const TrainBenchConfig& cfg, int ranks, const ParallelDims& dims,
                     TrainBenchResult& r) {
  const ModelSpec& s = cfg.spec;
  const bool tp = dims.tp > 1;
  std::FILE* sink = std::fopen("/dev/null", "w");
  GemmBenchConfig g;
  if (tp) {  // this rank's part: linears 1/tp as wide, heads/tp heads, its data-parallel group's rows
    StepConfig step;
    step.spec = s;
    step.layout.dims = dims;
    step.layout.sequence_parallel = cfg.layout.sequence_parallel;
    g = step_gemm_config(step, ranks, std::max<int64_t>(1, cfg.batch / dims.dp()));
  } else {
    // One rank's rows per micro-step (the whole model's products, also under --pp).
    g = step_gemm_config(s, std::max<int64_t>(1, cfg.batch / dims.dp() / cfg.accum));
  }
  g.seconds = 0.1;
  const GemmBenchResult gr = run_gemm_benchmark(pool, g, sink);
  r.sgemm_gflops = gr.ceiling;
  r.sgemm_picked_gflops = gr.chosen;
  std::fclose(sink);
}

// The run each configuration trains: a constant small LR, the transport one rank would use, the
// stages aligned at each step (the bubble measured is the schedule's, step_config.hpp).
TrainConfig bench_train_config(Pool& pool, const TrainBenchConfig& cfg) {
  TrainConfig tc;
  tc.spec = cfg.spec;
  tc.batch = cfg.batch;
  tc.steps = cfg.warmup + cfg.steps;
  tc.schedule.kind = ScheduleKind::constant;
  tc.schedule.lr = 1e-4f;
  tc.strategy = cfg.strategy;
  tc.optim = cfg.optim;
  // The sim stands in for the transport one rank would use: mpi on the cpu, nccl on a GPU.
  tc.comm = pool.backend().device() == Device::cuda ? CommKind::nccl : CommKind::mpi;
  tc.checkpointing = cfg.checkpointing;
  tc.accum = cfg.accum;
  tc.layout = cfg.layout;
  tc.layout.pipeline.align_steps = true;  // the bubble measured is the schedule's (step_config.hpp)
  return tc;
}

void print_bench_header(Pool& pool, const TrainBenchConfig& cfg, int ranks, const ParallelDims& dims,
                        const TrainBenchResult& r, double flops_per_token, std::FILE* out) {
  const ModelSpec& s = cfg.spec;
  const bool tp = dims.tp > 1;
  std::fprintf(out, "# shardlab train-step benchmark: %s, batch %lld x %lld tokens%s, %s\n", s.describe().c_str(),
               static_cast<long long>(cfg.batch), static_cast<long long>(s.seq),
               ranks > 1 ? fmt::format(" over {} ranks (GFLOP/s and %sgemm per rank)", ranks).c_str() : "",
               pool.backend().describe().c_str());
  std::fprintf(out, "# FLOPs per token 6N + 6LCT = %.3g (recomputation not counted); sgemm ceiling on this step's "
               "products (the best library for each, FLOP-weighted): %.1f GFLOP/s; as picked: %.1f\n", flops_per_token,
               r.sgemm_gflops, r.sgemm_picked_gflops);
  if (ranks > 1)
    std::fprintf(out, "# mesh %s%s; the sgemm ceiling is measured on %s, %lld sequences per micro-step\n",
                 dims.describe().c_str(),
                 tp ? (cfg.layout.sequence_parallel ? ", sequence parallel" : ", no sequence parallelism") : "",
                 tp ? fmt::format("the products of rank 0's part (linears 1/{} as wide, {} of {} heads)", dims.tp,
                                  s.heads / dims.tp, s.heads).c_str()
                    : "the whole model's products",
                 static_cast<long long>(std::max<int64_t>(1, cfg.batch / dims.dp() / cfg.accum)));
}

// MFU where the device's peak is known, and one line for scripts (benchmarks/compare_pytorch.sh):
// the first configuration's figures.
void print_result(const TrainBenchConfig& cfg, int ranks, const ParallelDims& dims, const std::string& label,
                  TrainBenchResult& r, std::FILE* out) {
  if (r.update_ms > 0)  // Muon: its update (momentum, exchanges, the iterations this rank owns)
    std::fprintf(out, "# %s update: %.1f ms per step (median, rank 0), %.1f%% of the step\n",
                 optimizer_name(cfg.optim.kind), r.update_ms, 100.0 * r.update_ms / r.ms_per_step);
  if (cfg.peak_tflops > 0) {
    r.mfu = r.gflops / (cfg.peak_tflops * 1e3);
    std::fprintf(out, "# MFU %.1f%% of %.0f TFLOP/s (%s: %.1f TFLOP/s achieved, 6N + 6LCT per token)\n", 100.0 * r.mfu,
                 cfg.peak_tflops, label.c_str(), r.gflops / 1e3);
  }
  // One line for scripts (benchmarks/compare_pytorch.sh): the first configuration's figures.
  // Fields are only ever added at the end: a script may read them by position.
  std::fprintf(out, "# result ms_per_step=%.1f tokens_per_s=%.0f gflops_per_rank=%.1f ceiling=%.1f ranks=%d tp=%d "
               "sp=%d tp_bytes=%.0f dp_bytes=%.0f tp_est_ms=%.2f dp_est_ms=%.2f pp=%d micro=%lld bubble_theory=%.4f "
               "bubble=%s\n",
               r.ms_per_step, r.tokens_per_s, r.gflops, r.sgemm_gflops, ranks, dims.tp, cfg.layout.sequence_parallel ? 1 : 0,
               r.comm.tp_bytes, r.comm.dp_bytes, r.comm.tp_est_ms, r.comm.dp_est_ms, dims.pp,
               static_cast<long long>(cfg.accum), r.bubble_theory, bubble_list(r.bubble).c_str());
}

}  // namespace

TrainBenchResult run_train_benchmark(Pool& pool, const TrainBenchConfig& cfg, std::FILE* out, Communicator* world) {
  SHARD_REQUIRE(cfg.steps >= 1 && cfg.warmup >= 0, "--steps {} --warmup {}", cfg.steps, cfg.warmup);
  const int ranks = world ? world->world_size() : 1;
  SHARD_REQUIRE(ranks == 1 || !cfg.levers(), "bench-train times a lever against none on one rank only ({} started)",
                ranks);
  const ModelSpec& s = cfg.spec;
  const int64_t tokens = cfg.batch * s.seq;
  const ParallelDims dims = cfg.layout.dims.resolved(ranks);
  TrainBenchResult r;
  measure_ceiling(pool, cfg, ranks, dims, r);
  const TrainConfig tc = bench_train_config(pool, cfg);
  const bool piped = dims.pp > 1;
  // One trainer per configuration, each with its own pools (so each ledger is its own) and
  // communicator; steps alternate between them so that both see the same machine state.
  struct Run {
    std::string label;
    std::unique_ptr<Pool> pool;
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<Trainer> trainer;
    std::vector<double> ms, update_ms;
    StepStats last;
  };
  std::vector<Run> runs;
  auto add = [&](TrainConfig c, std::string label) {
    Run run{std::move(label), std::make_unique<Pool>(pool.backend(), PoolConfig{pool.budget(), pool.host().budget()}),
            nullptr, nullptr, {}, {}, {}};
    if (!world) run.comm = make_sim_communicator(0, 1, *run.pool, sim_transport(c.comm));
    run.trainer = std::make_unique<Trainer>(pool.backend(), *run.pool, world ? *world : *run.comm, c);
    runs.push_back(std::move(run));
  };
  add(tc, piped ? fmt::format("{} x{} ranks, pp {} {}, M {}", strategy_name(tc.strategy.kind), ranks, dims.pp,
                              cfg.layout.pipeline.schedule.name(), cfg.accum)
                : fmt::format("{}{}, checkpointing {}, offload {}", strategy_name(tc.strategy.kind),
                              ranks > 1 ? fmt::format(" x{} ranks", ranks) : std::string(),
                              checkpointing_name(tc.checkpointing), offload_name(tc.strategy.offload)));
  if (cfg.levers()) {
    TrainConfig base = tc;
    base.checkpointing = Checkpointing::none;
    base.strategy.offload = Offload::none;
    add(base, fmt::format("{}, no levers", strategy_name(tc.strategy.kind)));
  }
  const double flops_per_token = family_of(s).flops_per_token(s);
  print_bench_header(pool, cfg, ranks, dims, r, flops_per_token, out);
  StageTimes stage;  // under --pp, the first (only) configuration's
  for (int t = 0; t < cfg.warmup + cfg.steps; ++t)
    for (Run& run : runs) {
      run.last = run.trainer->step(t);
      if (t < cfg.warmup) continue;
      run.ms.push_back(run.last.ms);
      if (run.last.optimizer_ms) run.update_ms.push_back(*run.last.optimizer_ms);
      if (piped && &run == &runs[0]) stage.add(run.last, run.trainer->pipeline_timing());
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
  if (!runs[0].update_ms.empty()) r.update_ms = median(runs[0].update_ms);
  if (piped) {
    r.bubble_theory = bubble_fraction(cfg.layout.pipeline.schedule, dims.pp, cfg.layout.pipeline.virtual_stages,
                                      static_cast<int>(cfg.accum));
    r.bubble = print_bubbles(*world, *runs[0].trainer, stage, cfg, r.bubble_theory, out);
  }
  if (world) r.comm = comm_share(*runs[0].trainer, *runs[0].pool, r.ms_per_step, out);
  r.tokens_per_s = static_cast<double>(tokens) / (r.ms_per_step / 1e3);
  r.gflops = r.tokens_per_s * flops_per_token / 1e9 / ranks;
  if (cfg.levers()) r.baseline_ms_per_step = base_ms;
  print_result(cfg, ranks, dims, runs[0].label, r, out);
  std::fflush(out);
  return r;
}

}  // namespace shardlab
