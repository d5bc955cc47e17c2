// `shardlab plan`: every layout of tp x pp (schedule, virtual stages) x dp (strategy, shard group),
// sequence parallelism, checkpointing, offload and micro-batch for --world devices, timed by the
// model of src/plan/plan_time.hpp and walked fastest first with memory predicted exactly
// (src/plan/plan.hpp); a flag given pins its dimension. --measure-top K runs the best K here.
#include <algorithm>
#include <cstdio>

#include "src/plan/calibrate.hpp"
#include "src/core/device_peaks.hpp"
#include "src/core/stats.hpp"
#include "src/core/units.hpp"
#include "src/plan/plan.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"
#include "tools/runtime.hpp"

namespace shardlab {
namespace {

// Runs the top `k` fitting entries of the plan for a few steps each on the real ranks and fills
// their measured step time (median after the first step, the slowest rank's) and the largest
// peak of any rank (under --pp the stages differ).
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
    std::vector<double> ms;
    uint64_t peak = 0;
    {
      Trainer trainer(be, pool, *comm, t);
      for (int64_t s = 0; s < steps; ++s) {
        StepStats st = trainer.step(s);
        if (s > 0) ms.push_back(st.ms);
        peak = std::max(peak, st.peak_bytes);
      }
    }
    // Rank 0 takes the slowest rank's time (in ns) and the largest peak.
    const std::vector<uint64_t> mine = {static_cast<uint64_t>(median(ms) * 1e6), peak};
    const std::vector<uint64_t> all = comm->gather_u64(mine, 0);
    uint64_t ns = 0, most = 0;
    for (size_t i = 0; i + 1 < all.size(); i += 2) ns = std::max(ns, all[i]), most = std::max(most, all[i + 1]);
    e.measured_step_ms = double(ns) / 1e6;
    e.measured_peak = most;
    if (ctx.mpi.rank() == 0) {
      std::printf("measured %d/%d: %s, checkpointing %s, micro-batch %lld x %lld: %.1f ms (predicted %.1f), peak %s "
                  "(predicted %s)\n", done, k, e.label().c_str(), checkpointing_name(e.checkpointing),
                  static_cast<long long>(e.micro_batch), static_cast<long long>(e.accum), *e.measured_step_ms,
                  e.step_ms(), format_bytes(double(*e.measured_peak)).c_str(), format_bytes(double(e.peak)).c_str());
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
  cli::DeviceRateOptions device;
  std::string family, kind, ckpt, offload;
  bool calibrate = false;
  int measure_top = 0, measure_steps = 6, show = 15;
  int64_t micro_batch = 0;
  cli::Desc desc = cli::command_options("plan");
  cli::add_world(desc, pc.world, "devices (ranks) to plan for");
  device.add(desc, kH100_80GB.name);
  desc.add_options()(
      "ranks-per-node", cli::po::value(&pc.ranks_per_node)->default_value(pc.ranks_per_node),
      "ranks per node: tensor parallelism stays within one; collectives within it use NVLink, across nodes the "
      "network; hybrid sharding groups are one node's data-parallel ranks")(
      "family", cli::po::value(&family)->default_value(""),
      "gpt2 or llama: the family the size flags (--layers --dim --heads --vocab --seq --kv-heads --ffn-dim) describe, "
      "without --model (gpt2: from small; llama: from llama-small)")(
      "global-batch", cli::po::value(&pc.global_batch)->default_value(0), "sequences per step (0 = 8 per rank)")(
      "strategy", cli::po::value(&kind)->default_value(""), "pin the data-parallel strategy: ddp, zero1, zero2, zero3")(
      "activation-checkpointing", cli::po::value(&ckpt)->default_value(""), "pin it: none, attention, blocks")(
      "offload", cli::po::value(&offload)->default_value(""), "pin it: none, optimizer, params")(
      "micro-batch", cli::po::value(&micro_batch)->default_value(0),
      "pin the sequences per micro-batch (accumulation makes up --global-batch)")(
      "overlap", cli::po::value(&pc.rates.dp_overlap)->default_value(pc.rates.dp_overlap, "0.9"),
      "share of the overlappable data-parallel traffic hidden behind compute")(
      "measure-top", cli::po::value(&measure_top)->default_value(0),
      "run the top K configurations that fit for --measure-steps steps each (needs --nproc = --world) and print "
      "measured beside predicted")(
      "show", cli::po::value(&show)->default_value(show),
      "configurations that fit to find and list (the search ends when it has them)");
  cli::add_switch(desc, "calibrate", calibrate,
                  "measure the rates on this machine instead of --gpu (a few training steps, an all-reduce, copies, "
                  "AdamW); needs --device-memory");
  cli::add_measure_steps(desc, measure_steps, "steps per measured configuration");
  run.add(desc);
  memory.add(desc);
  model.add(desc);
  strategy.add_dtypes(desc, nullptr);
  mesh.add(desc);
  reports.add(desc, "write the configurations walked as JSON (schema shardlab.plan/2)",
              "write a self-contained HTML page: the rates and the ranked configurations with their time split as bars",
              nullptr);
  cli::po::variables_map vm;
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"plan"}, nullptr, &vm)) return ExitCode::ok;

  // The model: a preset, or the size flags over a family's small preset.
  if (!family.empty()) {
    SHARD_REQUIRE(family == "gpt2" || family == "llama", "--family {}: expected gpt2 or llama", family);
    SHARD_REQUIRE(model.preset.empty(), "--family {} with --model {}: the preset fixes the family; give one",
                  family, model.preset);
    model.preset = family == "llama" ? "llama-small" : "small";
  }
  pc.train.spec = model.spec();
  strategy.apply_dtypes(pc.train.strategy);
  pc.train.strategy.precision.validate();

  // Pins: every mesh flag given, and the levers.
  PlanPins& pins = pc.pins;
  SHARD_REQUIRE(!cli::given_flag(vm, "pp-split"), "plan --pp-split: the planner splits the stages by cost; leave it out");
  SHARD_REQUIRE(!cli::given_flag(vm, "dp-replicate") || cli::given_flag(vm, "dp-shard"),
                "plan --dp-replicate without --dp-shard: pin the shard group with --dp-shard (the replicas follow)");
  if (cli::given_flag(vm, "tp")) pins.tp = mesh.dims.tp;
  if (cli::given_flag(vm, "pp")) pins.pp = mesh.dims.pp;
  if (cli::given_flag(vm, "pp-virtual")) pins.pp_virtual = mesh.pp_virtual;
  if (cli::given_flag(vm, "pp-schedule")) pins.schedule = parse_pp_schedule(mesh.pp_schedule);
  if (cli::given_flag(vm, "dp-shard")) pins.dp_shard = mesh.dims.dp_shard;
  if (cli::given_flag(vm, "shard-group")) pins.dp_shard = mesh.shard_group;
  if (cli::given_flag(vm, "sequence-parallel")) pins.sequence_parallel = mesh.sequence_parallel;
  if (!kind.empty()) pins.strategy = parse_strategy(kind);
  if (!ckpt.empty()) pins.checkpointing = parse_checkpointing(ckpt);
  if (!offload.empty()) pins.offload = parse_offload(offload);
  if (micro_batch != 0) pins.micro_batch = micro_batch;

  const PoolConfig budgets = memory.pools();
  SHARD_REQUIRE(!calibrate || !cli::given_flag(vm, "gpu"), "--calibrate measures this machine: leave --gpu {} out",
                device.gpu);
  const DevicePeaks& preset = device_preset(device.gpu);
  if (!calibrate) {
    DeviceRates& r = pc.rates.device;
    r = device.rates();
    pc.rates.achievable = device.achievable;
    pc.rates.source = fmt::format("{} preset", preset.name);
    if (cli::given_flag(vm, "ranks-per-node")) r.ranks_per_node = pc.ranks_per_node;
    else pc.ranks_per_node = std::min(r.ranks_per_node, pc.world);
    r.ranks_per_node = pc.ranks_per_node;
  }
  pc.device_memory = budgets.budget > 0 ? budgets.budget
                     : calibrate        ? 0
                                        : static_cast<uint64_t>(preset.memory_gb * 1e9);
  pc.host_memory = budgets.host_budget;
  pc.keep = static_cast<size_t>(std::max({show, measure_top, 1}));
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
    pc.rates = calibrate_rates(*backend, *comm, pc, std::min<int64_t>(pc.batch() / pc.world, 8),
                               ctx.mpi.rank() == 0 ? stdout : nullptr);
    pc.rates.device.ranks_per_node = pc.ranks_per_node;
  }
  PlanResult plan = make_plan(pc, ctx.mpi.rank() == 0 ? stderr : nullptr);
  if (measure_top > 0) measure_plan(*backend, ctx, pc, budgets, plan.entries, measure_top, measure_steps);
  if (ctx.mpi.rank() != 0) return ExitCode::ok;
  print_plan(pc, plan, static_cast<size_t>(std::max(show, measure_top)), stdout);
  if (!reports.json.empty()) write_text(reports.json, plan_json(pc, plan) + "\n", "--json");
  if (!reports.html.empty()) write_text(reports.html, plan_html(pc, plan), "--html");
  return ExitCode::ok;
}

}  // namespace shardlab
