// `shardlab bench-train`: training-step throughput beside the sgemm ceiling (benchmarks/train_bench.hpp),
// on one rank or over the real transport.
#include <cstdio>
#include <memory>

#include "benchmarks/train_bench.hpp"
#include "src/core/device_peaks.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"
#include "tools/runtime.hpp"

namespace shardlab {

namespace po = cli::po;

ExitCode cmd_bench_train(const Args& args, const Context& ctx) {
  cli::RunOptions run;
  cli::MemoryOptions memory;
  cli::ModelOptions model;
  cli::StrategyOptions strategy;
  cli::MeshOptions mesh;
  TrainBenchConfig cfg;
  std::string optimizer = "adamw";
  cli::Desc desc = cli::command_options("bench-train");
  cli::add_batch(desc, cfg.batch, "sequences per step");
  cli::add_steps(desc, cfg.steps, "timed steps (the median is reported)");
  cli::add_warmup(desc, cfg.warmup, "untimed steps first");
  desc.add_options()("micro-batches", po::value(&cfg.accum)->default_value(cfg.accum),
                     "accumulation micro-steps per step: under --pp the pipeline's micro-batches")("peak-tflops", po::value(&cfg.peak_tflops)
                                        ->default_value(-1, fmt::format("{:g} on cuda ({} dense bf16), none on cpu",
                                                                        kH100.dense_bf16_tflops, kH100.name)),
                     "the device's peak for the MFU line; 0 = no MFU line")(
                     "optimizer", po::value(&optimizer)->default_value(optimizer),
                     "adamw, sgd or muon (its defaults; the update's time is printed)");
  run.add(desc, true);
  memory.add(desc, true, "bench-train: with a lever, the run without it is timed too (steps interleaved) and the "
                         "ratio printed");
  model.add(desc);
  strategy.add_kind_and_dtype(desc, "bench-train: not hsdp (give --dp-shard)", "bench-train: the gradients' dtype too");
  mesh.add(desc);
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"bench-train"})) return ExitCode::ok;
  cfg.spec = model.spec();
  cfg.strategy.kind = parse_strategy(strategy.kind);
  cfg.optim.kind = parse_optimizer(optimizer);
  if (cfg.optim.kind == OptimizerKind::muon) cfg.optim.momentum = kMuonMomentum;
  cfg.layout = mesh.layout(ctx.mpi.world(), 0);
  cfg.strategy.offload = parse_offload(memory.offload);
  cfg.strategy.validate();
  cfg.checkpointing = parse_checkpointing(memory.checkpointing);
  cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = parse_dtype(strategy.param);
  cfg.strategy.precision.validate();
  const Device dev = parse_device(run.device);
  cfg.spec.activation_dtype = model.activation_dtype_on(dev, cfg.strategy.precision.param_dtype);
  cfg.spec.attention = model.attention_on(cfg.spec, dev, cfg.strategy.precision.param_dtype, cfg.layout.dims.cp > 1);
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

}  // namespace shardlab
