// `shardlab bench-adamw`: the host optimizer of --offload against STREAM's triad (src/plan/adamw_rate.hpp).
#include "src/plan/adamw_rate.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"
#include "tools/runtime.hpp"

namespace shardlab {

namespace po = cli::po;

ExitCode cmd_bench_adamw(const Args& args, const Context& ctx) {
  cli::RunOptions run;
  cli::MemoryOptions memory;
  AdamwBenchConfig cfg;
  cli::Desc desc = cli::command_options("bench-adamw");
  desc.add_options()("elements", po::value(&cfg.elements)->default_value(cfg.elements), "f32 elements per array")(
      "repeats", po::value(&cfg.repeats)->default_value(cfg.repeats), "runs of each kernel (the best is reported)");
  run.add(desc);
  memory.add(desc);
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"bench-adamw"})) return ExitCode::ok;
  SHARD_REQUIRE(ctx.mpi.world() == 1, "bench-adamw runs on one rank, {} started", ctx.mpi.world());
  auto backend = make_cpu(run, ctx);
  Pool pool(*backend, memory.pools());
  run_adamw_benchmark(pool, cfg, stdout);
  return ExitCode::ok;
}

}  // namespace shardlab
