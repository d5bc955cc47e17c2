// `shardlab profile`: predicted (and with --measure, measured) memory per rank, per category, for
// every strategy at any world size; with --device-memory, what fits and the cheapest levers that do.
#include <cstdio>

#include "src/report/memory_report.hpp"
#include "memory/report.hpp"
#include "src/compare/profile.hpp"
#include "src/compare/profile_time.hpp"
#include "src/core/device_peaks.hpp"
#include "src/report/time_report.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"
#include "tools/runtime.hpp"

namespace shardlab {

namespace {

// --time: the step priced on the target device; nothing runs but the meta step (and, on the CPU,
// the short measurement of its rates).
ExitCode profile_time(const ProfileConfig& pc, const cli::TrainOptions& opts, const cli::ReportOptions& reports,
                      const cli::po::variables_map& given, const std::string& gpu, int top, const Context& ctx) {
  SHARD_REQUIRE(!pc.measure, "--time predicts; --measure with it is not supported yet (a GPU's per-operation "
                "timing is future work): drop one");
  SHARD_REQUIRE(reports.html.empty() && reports.trace.empty(), "--time writes --json only (no --html or --trace)");
  SHARD_REQUIRE(top >= 0, "--top {}: expected 0 (all) or more", top);
  const Device target = parse_device(opts.run.device);
  SHARD_REQUIRE(target == Device::cuda || !cli::given_flag(given, "gpu"),
                "--gpu {} prices a GPU: add --device cuda (with --device cpu the step is priced on this machine)", gpu);
  reports.check("before the profile runs");
  DeviceModel d;
  if (target == Device::cuda) {
    d = gpu_device_model(device_preset(gpu));
    if (pc.train.layout.ranks_per_node > 0) d.ranks_per_node = pc.train.layout.ranks_per_node;  // as given
  } else {
    auto be = opts.backend(ctx, pc.train);
    d = measure_cpu_model(*be);
  }
  if (ctx.mpi.rank() != 0) return ExitCode::ok;
  TimeReport r = run_time_profile(pc, target, std::move(d));
  print_time_report(r, stdout, top);
  if (!reports.json.empty()) write_text(reports.json, time_report_json(r) + "\n", "--json");
  return ExitCode::ok;
}

}  // namespace

ExitCode cmd_profile(const Args& args, const Context& ctx) {
  cli::TrainOptions opts;
  cli::ReportOptions reports;
  ProfileConfig pc;
  std::string strategies = "dp,ddp,zero1,zero2,zero3";
  cli::Desc desc = cli::command_options("profile");
  cli::add_world(desc, pc.world, "world size to profile");
  desc.add_options()("micro-batch", cli::po::value(&pc.micro_batch)->default_value(pc.micro_batch),
                     "sequences per rank per micro-step");
  cli::add_strategies(desc, strategies, "strategies to profile");
  cli::add_measure(desc, pc.measure,
                   "also run real steps and print measured beside predicted (with fewer processes than --world, one "
                   "process plays rank 0 through the sim communicator)");
  cli::add_measure_steps(desc, pc.measure_steps, "steps per measured run");
  bool time = false;
  std::string gpu = "h100-80gb";
  int top = 20;
  cli::Desc timing("step time (--time)");
  cli::add_switch(timing, "time", time,
                  "predict how long a step takes instead of its memory: the step's cost ledger (FLOPs, bytes, "
                  "launches, collectives, host waits) priced on the device --device names (cuda: the --gpu preset, "
                  "no GPU needed; cpu: this machine's rates, measured first)");
  timing.add_options()("gpu", cli::po::value(&gpu)->default_value(gpu),
                       "with --time --device cuda: the device preset (a100-80gb, h100-80gb, h200, b200)")(
      "top", cli::po::value(&top)->default_value(top), "with --time: operations listed per row (0 = all)");
  desc.add(timing);
  opts.add(desc, pc.train);
  reports.add(desc, "write the report as JSON (schema shardlab.profile/2; with --time shardlab.profile_time/1)",
              "write a self-contained HTML page with SVG charts",
              "with --measure: a Chrome trace-event file (Perfetto) of each measured step");
  cli::po::variables_map given;
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"profile"}, nullptr, &given)) return ExitCode::ok;
  opts.finish(pc.train, ctx, pc.world);
  pc.strategies = cli::strategies_for(strategies, given, pc.train.layout.dims, "profile", ctx.mpi.rank());
  cli::check_applicable(given, pc.train, pc.strategies, true, "profile", ctx.mpi.rank());
  start_watchdog(ctx, opts.run.collective_timeout);
  if (time) return profile_time(pc, opts, reports, given, gpu, top, ctx);
  SHARD_REQUIRE(pc.measure_steps >= 1, "--measure-steps {}: expected at least one step", pc.measure_steps);
  SHARD_REQUIRE(reports.trace.empty() || pc.measure, "--trace needs --measure: a trace shows a step that ran");
  reports.check("before the profile runs");  // every rank: each stops with the same message
  auto backend = opts.backend(ctx, pc.train);
  pc.pools = opts.memory.pools(backend.get());
  // The prediction is held to the budgets given (on a GPU the pools' default is the device's free
  // memory, which says nothing about the --world profiled); the host's only beside the device's.
  pc.budget = opts.memory.device_memory.empty() ? 0 : pc.pools.budget;
  pc.host_budget = pc.budget > 0 && !opts.memory.host_memory.empty() ? pc.pools.host_budget : 0;
  MemoryReport r = run_profile(*backend, ctx.world(pc.train.comm), pc);
  if (ctx.mpi.rank() != 0) return ExitCode::ok;
  print_memory_table(r, stdout);
  if (!reports.json.empty()) write_text(reports.json, memory_report_json(r) + "\n", "--json");
  if (!reports.html.empty()) write_text(reports.html, memory_report_html(r), "--html");
  if (!reports.trace.empty()) write_text(reports.trace, memory_trace_json(r), "--trace");
  return ExitCode::ok;
}

}  // namespace shardlab
