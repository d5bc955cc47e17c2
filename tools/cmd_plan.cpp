// `shardlab plan`: every strategy x shard group x checkpointing x offload x micro-batch for --world
// ranks, predicted (memory exactly, time by a stated model), fastest that fit first; --measure-top K
// runs the best K on the real ranks.
#include <algorithm>
#include <cstdio>

#include "benchmarks/calibrate.hpp"
#include "src/core/device_peaks.hpp"
#include "src/core/stats.hpp"
#include "src/train/plan.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"
#include "tools/runtime.hpp"

namespace shardlab {
namespace {

// Runs the top `k` fitting entries of the plan for a few steps each on the real ranks and fills
// their measured step time (median after the first step) and rank 0's measured peak.
void measure_plan(Backend& be, const Context& ctx, const PlanConfig& pc, const PoolConfig& pools,
                  std::vector<PlanEntry>& plan, int k, int64_t steps) {
  int done = 0;
  for (PlanEntry& e : plan) {
    if (!e.fits || done == k) break;
    ++done;
    TrainConfig t = e.config(pc);
    t.steps = steps;
    t.schedule.kind = ScheduleKind::constant;
    Pool pool(be, pools);
    auto comm = ctx.world(CommKind::mpi).connect(pool);
    Trainer trainer(be, pool, *comm, t);
    std::vector<double> ms;
    uint64_t peak = 0;
    for (int64_t s = 0; s < steps; ++s) {
      StepStats st = trainer.step(s);
      if (s > 0) ms.push_back(st.ms);
      peak = std::max(peak, st.peak_bytes);
    }
    e.measured_step_ms = median(ms);
    e.measured_peak = peak;
    if (ctx.mpi.rank() == 0) {
      std::printf("measured %d/%d: %s, checkpointing %s, micro-batch %lld x %lld: %.1f ms (predicted %.1f)\n", done, k,
                  e.strategy.label().c_str(), checkpointing_name(e.checkpointing), static_cast<long long>(e.micro_batch),
                  static_cast<long long>(e.accum), *e.measured_step_ms, e.step_ms);
      std::fflush(stdout);
    }
  }
}

}  // namespace

ExitCode cmd_plan(const Args& args, const Context& ctx) {
  cli::RunOptions run;
  cli::MemoryOptions memory;
  cli::ModelOptions model;
  cli::StrategyOptions strategy;
  cli::MeshOptions mesh;
  cli::ReportOptions reports;
  PlanConfig pc;
  strategy.param = "bf16";
  double tflops = 0, intra = 0, inter = 0, host_link = 0;
  bool calibrate = false;
  int measure_top = 0, measure_steps = 6, show = 15;
  cli::Desc desc = cli::command_options("plan");
  cli::add_world(desc, pc.world, "ranks to plan for");
  desc.add_options()("ranks-per-node", cli::po::value(&pc.ranks_per_node)->default_value(pc.ranks_per_node),
                     "ranks per node: collectives within a node use --link-intra, across nodes --link-inter; hybrid "
                     "sharding groups are one node")(
      "global-batch", cli::po::value(&pc.global_batch)->default_value(0), "sequences per step (0 = 8 per rank)")(
      "device-tflops", cli::po::value(&tflops)->default_value(0),
      fmt::format("peak dense TFLOP/s per rank; the model uses {:g}% of it (0 = an {}'s {:g})", kStepPeakShare * 100,
                  kH100.name, kH100.dense_bf16_tflops).c_str())(
      "link-intra", cli::po::value(&intra)->default_value(0),
      fmt::format("GB/s of bus bandwidth within a node (0 = NVLink's {:g})", kH100.intra_node_gbs).c_str())(
      "link-inter", cli::po::value(&inter)->default_value(0),
      fmt::format("GB/s of bus bandwidth between nodes (0 = {:g}: 400 Gb/s IB)", kH100.inter_node_gbs).c_str())(
      "host-link", cli::po::value(&host_link)->default_value(0),
      fmt::format("GB/s device <-> host (0 = {:g}: PCIe 5 x16)", kH100.host_link_gbs).c_str())(
      "measure-top", cli::po::value(&measure_top)->default_value(0),
      "run the top K configurations that fit for --measure-steps steps each (needs --nproc = --world) and print "
      "measured beside predicted")(
      "show", cli::po::value(&show)->default_value(show), "configurations that fit to list");
  cli::add_switch(desc, "calibrate", calibrate,
                  "measure the rates on this machine instead (a few training steps, an all-reduce, copies, AdamW)");
  cli::add_measure_steps(desc, measure_steps, "steps per measured configuration");
  run.add(desc);
  memory.add(desc);
  model.add(desc);
  strategy.add_dtypes(desc, nullptr);
  mesh.add(desc);
  reports.add(desc, "write every configuration as JSON (schema shardlab.plan/1)",
              "write a self-contained HTML page: the rates and the ranked configurations with their time split",
              nullptr);
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"plan"})) return ExitCode::ok;
  pc.train.spec = model.spec();
  const ParallelDims dims = mesh.resolve(pc.world, 0);  // a data-parallel degree given pins the shard group
  SHARD_REQUIRE(dims.tp == 1 && !mesh.sequence_parallel,
                "plan --tp {}: the planner ranks data-parallel layouts only so far; predict one tensor-parallel layout "
                "with profile --tp, or measure it with bench-train --tp",
                dims.tp);
  if (mesh.dims.dp_shard > 0 || mesh.dims.dp_replicate > 0 || mesh.shard_group > 0)
    pc.dp_shard = dims.dp_shard == pc.world ? 0 : dims.dp_shard;
  strategy.apply_dtypes(pc.train.strategy);
  pc.train.strategy.precision.validate();
  const PoolConfig budgets = memory.pools();
  pc.device_memory = budgets.budget;
  pc.host_memory = budgets.host_budget;
  SHARD_REQUIRE(tflops >= 0 && intra >= 0 && inter >= 0 && host_link >= 0,
                "--device-tflops, --link-intra, --link-inter and --host-link must not be negative");
  if (tflops > 0) pc.rates.flops = tflops * 1e12 * kStepPeakShare;
  if (intra > 0) pc.rates.link_intra = intra * 1e9;
  if (inter > 0) pc.rates.link_inter = inter * 1e9;
  if (host_link > 0) pc.rates.host_link = host_link * 1e9;
  if (tflops > 0 || intra > 0 || inter > 0 || host_link > 0) pc.rates.source = "given, and defaults for the rest";
  SHARD_REQUIRE(measure_top >= 0 && measure_steps >= 2,
                "--measure-top {} --measure-steps {}: expected K >= 0 and at least 2 steps", measure_top, measure_steps);
  SHARD_REQUIRE(measure_top == 0 || ctx.mpi.world() == pc.world,
                "--measure-top runs the configurations on real ranks: start --nproc {} (the --world), not {}",
                pc.world, ctx.mpi.world());
  pc.validate();
  auto backend = make_cpu(run, ctx);
  if (calibrate) {
    Pool pool(*backend);
    auto comm = ctx.world(CommKind::mpi).connect(pool);
    const int64_t per_rank = (pc.global_batch > 0 ? pc.global_batch : 8 * int64_t{pc.world}) / pc.world;
    pc.rates = calibrate_rates(*backend, *comm, pc, std::min<int64_t>(per_rank, 8),
                               ctx.mpi.rank() == 0 ? stdout : nullptr);
  }
  std::vector<PlanEntry> plan = make_plan(pc);
  if (measure_top > 0) measure_plan(*backend, ctx, pc, budgets, plan, measure_top, measure_steps);
  if (ctx.mpi.rank() != 0) return ExitCode::ok;
  print_plan(pc, plan, static_cast<size_t>(std::max(show, measure_top)), stdout);
  if (!reports.json.empty()) write_text(reports.json, plan_json(pc, plan) + "\n", "--json");
  if (!reports.html.empty()) write_text(reports.html, plan_html(pc, plan), "--html");
  return ExitCode::ok;
}

}  // namespace shardlab
