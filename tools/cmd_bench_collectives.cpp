// `shardlab bench-collectives`: the collective benchmark (benchmarks/collectives.hpp, nccl-tests style)
// over the transport asked, or the sim communicator playing rank 0 of --sim-world ranks.
#include <memory>

#include "benchmarks/collectives.hpp"
#include "src/comm/sim_comm.hpp"
#include "src/core/units.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"
#include "tools/runtime.hpp"

namespace shardlab {

namespace po = cli::po;

ExitCode cmd_bench_collectives(const Args& args, const Context& ctx) {
  cli::RunOptions run;
  cli::MemoryOptions memory;
  CollectiveBenchConfig cfg;
  std::string ops = "all_reduce,reduce_scatter,all_gather,broadcast,reduce,gather,scatter", dtype = "f32",
              min_b = "1KiB", max_b = "64MiB";
  int sim_world = 0;
  run.comm = "mpi";
  cli::Desc desc = cli::command_options("bench-collectives");
  desc.add_options()("ops", po::value(&ops)->default_value(ops), "collectives to time, comma-separated")(
      "min-bytes", po::value(&min_b)->default_value(min_b), "smallest size")(
      "max-bytes", po::value(&max_b)->default_value(max_b), "largest size")(
      "step-factor", po::value(&cfg.step_factor)->default_value(cfg.step_factor), "size multiplier between lines")(
      "iters", po::value(&cfg.iters)->default_value(cfg.iters), "timed calls per size")(
      "sim-world", po::value(&sim_world)->default_value(0), "world size the sim communicator pretends");
  cli::add_dtype(desc, dtype, "element type: f32, bf16 or f16");
  cli::add_warmup(desc, cfg.warmup, "untimed calls per size");
  run.add(desc, true, true, "sim (this process plays rank 0 of --sim-world ranks)");
  memory.add(desc);
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"bench-collectives"})) return ExitCode::ok;
  start_watchdog(ctx, run.collective_timeout);
  cfg.ops = parse_comm_ops(ops);
  cfg.dtype = parse_dtype(dtype);
  cfg.min_bytes = parse_bytes(min_b);
  cfg.max_bytes = parse_bytes(max_b);
  const Device dev = parse_device(run.device);
  std::unique_ptr<Backend> backend = make_device_backend(dev, run, ctx);
  Pool pool(*backend, memory.pools());
  std::unique_ptr<Communicator> comm, alone;
  if (run.comm == "sim") {
    SHARD_REQUIRE(ctx.mpi.world() == 1, "--comm sim runs in one process; started with {} ranks", ctx.mpi.world());
    SHARD_REQUIRE(sim_world >= 1, "--comm sim needs --sim-world N (N >= 1)");
    comm = make_sim_communicator(0, sim_world, pool);
    alone = make_sim_communicator(0, 1, pool);  // the processes that run: this one
  } else {
    SHARD_REQUIRE(sim_world == 0, "--sim-world is for --comm sim");
    comm = ctx.world(comm_for(run.comm, dev, ctx)).connect(pool);
  }
  uint64_t wrong = run_collective_benchmark(*comm, alone ? *alone : *comm, pool, cfg, stdout);
  comm.reset();
  return wrong == 0 ? ExitCode::ok : ExitCode::wrong_results;
}

}  // namespace shardlab
