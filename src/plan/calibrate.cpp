#include "src/plan/calibrate.hpp"

#include <algorithm>
#include <chrono>

#include "src/plan/adamw_rate.hpp"
#include "src/comm/sim_comm.hpp"
#include "src/core/stats.hpp"
#include "src/model/family.hpp"
#include "src/model/model.hpp"

namespace shardlab {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Model FLOPs per second of single-rank steps (ddp on a world of one) of the planned model, the
// optimizer's update (every parameter at `adamw_per_s` elements/s) taken out: the time model adds
// each layout's own update apart (its shard of the parameters). 0 where the update alone took
// longer than the step (measurements that disagree; the caller refuses them on every rank).
double step_flops(Backend& be, const PlanConfig& cfg, int64_t micro_batch, double adamw_per_s) {
  Pool pool(be);
  auto one = make_sim_communicator(0, 1, pool);
  TrainConfig t = cfg.train;
  t.checkpointing = Checkpointing::none;
  t.use_strategy(StrategyKind::ddp);
  t.batch = micro_batch;
  t.accum = 1;
  t.steps = 11;  // the first warms up; the median of 10
  t.schedule.kind = ScheduleKind::constant;
  Trainer trainer(be, pool, *one, t);
  std::vector<double> ms;
  for (int64_t s = 0; s < t.steps; ++s) {
    StepStats st = trainer.step(s);
    if (s > 0) ms.push_back(st.ms);
  }
  // FLOPs as the time model counts them (plan_time.hpp), so the model gives back the measured time.
  const double update_s = double(num_params(family_of(t.spec).layout(t.spec))) / adamw_per_s;
  const double step_s = median(ms) / 1e3;
  if (update_s >= step_s) return 0;
  return megatron_flops(t.spec, micro_batch, Checkpointing::none) / (step_s - update_s);
}

double allreduce_busbw(Backend& be, Communicator& comm, const PlanConfig& cfg) {
  if (comm.world_size() == 1) return 1e12;  // nothing crosses a link
  const auto layout = family_of(cfg.train.spec).layout(cfg.train.spec);
  const int64_t n = std::max<int64_t>(1024, num_params(layout) / static_cast<int64_t>(layout.size()));
  Pool pool(be);
  Block b = pool.alloc(DType::f32, n, Category::comm_buffer, "calibrate all_reduce");
  be.fill(b.flat(DType::f32), 1.f);
  std::vector<double> s;
  for (int i = 0; i < 12; ++i) {
    comm.barrier().wait();
    const double t0 = now_s();
    comm.all_reduce(b.flat(DType::f32)).wait();
    if (i >= 2) s.push_back(now_s() - t0);
  }
  return bus_bytes(CommOp::all_reduce, 4.0 * double(n), comm.world_size()) / median(s);
}

// Seconds a rank loses at a collective it waits for between two pieces of compute (dp_waits in
// plan_time.cpp): rounds of `chunk_s` of GEMMs (the MLP's first product at the planned
// micro-batch, about a unit's forward) each ended by a barrier, against the same rounds without
// one; this rank's excess per round. Blocks of each kind alternate, so a change of the machine's
// load falls on both.
double sync_seconds(Backend& be, Communicator& comm, const PlanConfig& cfg, int64_t micro_batch, double chunk_s) {
  if (comm.world_size() == 1) return 0;
  const ModelSpec& s = cfg.train.spec;
  GemmDesc d;
  d.m = micro_batch * s.seq, d.n = s.ffn_hidden(), d.k = s.dim;
  d.lda = d.k, d.ldb = d.n, d.ldc = d.n;
  Pool pool(be);
  Block a = pool.alloc(DType::f32, d.m * d.k, Category::workspace, "calibrate sync A");
  Block b = pool.alloc(DType::f32, d.k * d.n, Category::workspace, "calibrate sync B");
  Block c = pool.alloc(DType::f32, d.m * d.n, Category::workspace, "calibrate sync C");
  be.fill(a.flat(DType::f32), 0.5f);
  be.fill(b.flat(DType::f32), 0.5f);
  auto gemm = [&] { be.gemm(d, a.data(), b.data(), c.data()); };
  gemm();  // warm
  be.synchronize();
  double t0 = now_s();
  for (int i = 0; i < 3; ++i) gemm();
  be.synchronize();
  const double one = (now_s() - t0) / 3;
  // Every rank runs as many as rank 0 (the ranks must agree on the rounds).
  std::vector<float> reps{static_cast<float>(std::clamp(std::round(chunk_s / std::max(one, 1e-6)), 1.0, 64.0))};
  comm.broadcast(std::span<float>(reps), 0).wait();
  const int n = static_cast<int>(reps[0]), rounds = 8, blocks = 3;
  double with = 0, without = 0;
  for (int k = 0; k < blocks; ++k)
    for (bool wait : {true, false}) {
      comm.barrier().wait();
      t0 = now_s();
      for (int i = 0; i < rounds; ++i) {
        for (int j = 0; j < n; ++j) gemm();
        be.synchronize();
        if (wait) comm.barrier().wait();
      }
      (wait ? with : without) += now_s() - t0;
    }
  return (with - without) / (blocks * rounds);
}

double host_link(Backend& be) {
  Pool pool(be);
  const int64_t n = int64_t{16} << 20;  // 64 MiB of f32
  Block d = pool.alloc(DType::f32, n, Category::workspace, "calibrate device");
  Block h = pool.host().alloc(DType::f32, n, Category::workspace, "calibrate host");
  be.fill(d.flat(DType::f32), 1.f);
  pool.host().backend().fill(h.flat(DType::f32), 1.f);
  std::vector<double> s;
  for (int i = 0; i < 6; ++i) {
    const double t0 = now_s();
    be.copy(h.flat(DType::f32), d.flat(DType::f32));
    be.copy(d.flat(DType::f32), h.flat(DType::f32));
    be.synchronize();
    s.push_back((now_s() - t0) / 2);
  }
  return 4.0 * double(n) / median(s);
}

}  // namespace

PlanRates calibrate_rates(Backend& be, Communicator& comm, const PlanConfig& cfg, int64_t micro_batch, std::FILE* log) {
  // The whole-step rate at every power of two up to the planned micro-batch, and at it.
  std::vector<int64_t> mbs;
  for (int64_t b = 1; b < micro_batch; b *= 2) mbs.push_back(b);
  mbs.push_back(micro_batch);
  // The ranks' means: [0] all-reduce bus bytes/s, [1] host link bytes/s, [2] AdamW elements/s; [3]
  // counts the (rank, micro-batch) pairs whose update measured longer than the step; [4] seconds
  // lost per wait (sync_seconds).
  std::vector<float> r(5);
  {
    Pool pool(be);
    std::FILE* sink = std::fopen("/dev/null", "w");
    AdamwBenchConfig a;
    a.elements = int64_t{1} << 22;
    a.repeats = 5;
    r[2] = static_cast<float>(run_adamw_benchmark(pool, a, sink).adamw_elements_per_s);
    std::fclose(sink);
  }
  // A step goes at its slowest rank's pace (and --measure-top takes the slowest rank's time): the
  // whole-step rates are the slowest rank's, as seconds per FLOP (the largest over the ranks).
  std::vector<float> s_per_flop(mbs.size());
  for (size_t i = 0; i < mbs.size(); ++i) {
    const double f = step_flops(be, cfg, mbs[i], r[2]);
    r[3] += f <= 0;
    s_per_flop[i] = f > 0 ? static_cast<float>(1 / f) : 0.f;
  }
  // The sync probe's compute between waits: about one unit's forward at the planned micro-batch.
  const ModelSpec& spec = cfg.train.spec;
  const double unit_s = s_per_flop.back() * megatron_flops(spec, micro_batch, Checkpointing::none) / 3 /
                        double(spec.layers + 2);
  r[4] = static_cast<float>(sync_seconds(be, comm, cfg, micro_batch, unit_s));
  r[0] = static_cast<float>(allreduce_busbw(be, comm, cfg));
  r[1] = static_cast<float>(host_link(be));
  comm.all_reduce(std::span<float>(s_per_flop), ReduceOp::max).wait();
  comm.all_reduce(std::span<float>(r)).wait();
  SHARD_REQUIRE(r[3] == 0, "--calibrate: on {:g} rank(s) x micro-batch(es) the optimizer's update alone (bench-adamw's "
                "rate) took longer than a whole training step: the measurements disagree (a machine busy during one "
                "of them?); run it again", r[3]);
  const double n = comm.world_size();
  PlanRates rates;
  const std::string from = fmt::format("measured here by {} rank{}", comm.world_size(), comm.world_size() == 1 ? "" : "s");
  DeviceRates& d = rates.device;
  for (size_t i = 0; i < mbs.size(); ++i) d.flops_by_micro_batch.emplace_back(mbs[i], 1 / double(s_per_flop[i]));
  d.flops = {d.flops_by_micro_batch.back().second,
             from + fmt::format(": model FLOP/s of whole training steps, the slowest rank's, less the update, at "
                                "micro-batch {} (and {} smaller)", micro_batch, mbs.size() - 1)};
  d.hbm = {1e12, "unused: element-wise work is inside the whole-step rate"};
  d.intra = d.inter = {r[0] / n, from + ": an all-reduce's bus bandwidth"};
  d.host = {r[1] / n, from + ": host-tier copies"};
  d.adamw = d.host_adamw = {r[2] / n, from + ": bench-adamw's kernel"};
  d.sync = {std::max(0.0, double(r[4]) / n), from + ": GEMM rounds with a barrier after each, less without"};
  d.ranks_per_node = cfg.ranks_per_node;
  rates.achievable.whole_step = true;
  rates.achievable.intra = rates.achievable.inter = 1;
  rates.dp_overlap = 0;           // MPI's collectives progress only inside MPI calls on the CPU backend
  // The attention as this runtime runs it: the fused kernel keeps no s x s scores, the naive one does.
  rates.flash_attention = cfg.train.spec.attention == AttentionKernel::flash;
  rates.source = fmt::format("calibrated on this machine by {} rank{}, {}", comm.world_size(),
                             comm.world_size() == 1 ? "" : "s", be.describe());
  if (log)  // the whole-step rates by micro-batch: the plan's header prints them with the rest
    std::fprintf(log, "calibrated: all-reduce %.2f GB/s, host link %.2f GB/s, AdamW %.3g elements/s, %.2f ms per "
                 "data-parallel wait\n", d.intra.value / 1e9, d.host.value / 1e9, d.adamw.value, d.sync.value * 1e3);
  return rates;
}

}  // namespace shardlab
