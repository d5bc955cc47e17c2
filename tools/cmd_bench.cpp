// The benchmarks: bench-collectives, bench-gemm, bench-train, bench-adamw, bench-plan-validation (benchmarks/ holds what
// they run; this file reads their options and picks their backend and transport).
#include <algorithm>
#include <cstdio>
#include <utility>

#include "benchmarks/adamw_bench.hpp"
#include "benchmarks/collectives.hpp"
#include "src/train/sgemm_ceiling.hpp"
#include "benchmarks/plan_validation.hpp"
#include "benchmarks/train_bench.hpp"
#include "src/comm/sim_comm.hpp"
#include "src/core/device_peaks.hpp"
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

ExitCode cmd_bench_gemm(const Args& args, const Context& ctx) {
  cli::RunOptions run;
  cli::MemoryOptions memory;
  cli::ModelOptions shape;
  GemmBenchConfig cfg;
  shape.layers = cfg.layers, shape.dim = cfg.dim, shape.heads = 0, shape.seq = 0, shape.vocab = cfg.vocab;
  cli::Desc desc = cli::command_options("bench-gemm");
  desc.add_options()("rows", po::value(&cfg.tokens)->default_value(cfg.tokens),
                     "rows B*T of the step's products (tokens per step)")(
      "seconds", po::value(&cfg.seconds)->default_value(cfg.seconds), "minimum timing per product and candidate");
  shape.add_shape(desc, {nullptr, nullptr, "C/64", "min(rows, 1024)", nullptr},
                  {nullptr, nullptr, "C/64", "min(rows, 1024)", "leave the LM head's products out"});
  run.add(desc);
  memory.add(desc);
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"bench-gemm"})) return ExitCode::ok;
  cfg.layers = shape.layers, cfg.dim = shape.dim, cfg.heads = shape.heads, cfg.seq = shape.seq, cfg.vocab = shape.vocab;
  SHARD_REQUIRE(cfg.dim > 0 && cfg.tokens > 0 && cfg.heads >= 0 && cfg.seq >= 0 && cfg.vocab >= 0 && cfg.layers > 0,
                "--dim {} --rows {} --heads {} --seq {} --vocab {} --layers {}: expected positive sizes (0 where a "
                "default is named)", cfg.dim, cfg.tokens, cfg.heads, cfg.seq, cfg.vocab, cfg.layers);
  if (cfg.heads == 0) cfg.heads = std::max<int64_t>(1, cfg.dim / 64);
  if (cfg.seq == 0) cfg.seq = std::min<int64_t>(cfg.tokens, 1024);
  auto backend = make_cpu(run, ctx);
  Pool pool(*backend, memory.pools());
  if (ctx.mpi.rank() == 0) run_gemm_benchmark(pool, cfg, stdout);
  return ExitCode::ok;
}

ExitCode cmd_bench_train(const Args& args, const Context& ctx) {
  cli::RunOptions run;
  cli::MemoryOptions memory;
  cli::ModelOptions model;
  cli::StrategyOptions strategy;
  cli::MeshOptions mesh;
  TrainBenchConfig cfg;
  cli::Desc desc = cli::command_options("bench-train");
  cli::add_batch(desc, cfg.batch, "sequences per step");
  cli::add_steps(desc, cfg.steps, "timed steps (the median is reported)");
  cli::add_warmup(desc, cfg.warmup, "untimed steps first");
  desc.add_options()("micro-batches", po::value(&cfg.accum)->default_value(cfg.accum),
                     "accumulation micro-steps per step: under --pp the pipeline's micro-batches")("peak-tflops", po::value(&cfg.peak_tflops)
                                        ->default_value(-1, fmt::format("{:g} on cuda ({} dense bf16), none on cpu",
                                                                        kH100.dense_bf16_tflops, kH100.name)),
                     "the device's peak for the MFU line; 0 = no MFU line");
  run.add(desc, true);
  memory.add(desc, true, "bench-train: with a lever, the run without it is timed too (steps interleaved) and the "
                         "ratio printed");
  model.add(desc);
  strategy.add_kind_and_dtype(desc, "bench-train: not hsdp (give --dp-shard)", "bench-train: the gradients' dtype too");
  mesh.add(desc);
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"bench-train"})) return ExitCode::ok;
  cfg.spec = model.spec();
  cfg.strategy.kind = parse_strategy(strategy.kind);
  cfg.strategy.dims = mesh.resolve(ctx.mpi.world(), 0);
  cfg.sequence_parallel = mesh.sequence_parallel;
  cfg.pipeline = mesh.pipeline();
  cfg.strategy.offload = parse_offload(memory.offload);
  cfg.strategy.validate();
  cfg.checkpointing = parse_checkpointing(memory.checkpointing);
  cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = parse_dtype(strategy.param);
  cfg.strategy.precision.validate();
  const Device dev = parse_device(run.device);
  if (cfg.peak_tflops < 0) cfg.peak_tflops = dev == Device::cuda ? kH100.dense_bf16_tflops : 0;
  std::unique_ptr<Backend> backend = make_device_backend(dev, run, ctx);
  Pool pool(*backend, memory.pools(backend.get()));
  if (ctx.mpi.world() == 1) {
    run_train_benchmark(pool, cfg, stdout);
    return ExitCode::ok;
  }
  // Several ranks: the strategy over the real transport; rank 0 prints.
  auto comm = ctx.world(comm_for("auto", dev, ctx)).connect(pool);
  std::FILE* sink = ctx.mpi.rank() == 0 ? stdout : std::fopen("/dev/null", "w");
  run_train_benchmark(pool, cfg, sink, comm.get());
  if (sink != stdout) std::fclose(sink);
  return ExitCode::ok;
}

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

ExitCode cmd_bench_plan_validation(const Args& args, const Context& ctx) {
  cli::ReportOptions reports;
  cli::DeviceRateOptions device;
  bool search = false;
  cli::Desc desc = cli::command_options("bench-plan-validation");
  device.add(desc, kA100_80GB.name);
  cli::add_switch(desc, "search", search,
                  "also run plan's free search for each row's model, GPUs and global batch (80 GB devices) beside the "
                  "published layout pinned: does it find that layout, or a faster one that fits?");
  reports.add(desc, "write the rows, the rates and the errors as JSON (schema shardlab.plan-validation/1)", nullptr,
              nullptr);
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"bench-plan-validation"})) return ExitCode::ok;
  const DeviceRates rates = device.rates();
  const Achievable& ach = device.achievable;
  if (ctx.mpi.rank() != 0) return ExitCode::ok;
  const ValidationResult res = run_plan_validation(rates, ach, stdout);
  if (search) run_plan_search(rates, ach, stdout);
  if (!reports.json.empty()) write_text(reports.json, plan_validation_json(rates, ach, res) + "\n", "--json");
  return ExitCode::ok;
}

}  // namespace shardlab
