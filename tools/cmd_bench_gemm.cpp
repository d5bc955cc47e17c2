// `shardlab bench-gemm`: sgemm GFLOP/s of each CPU library on a step's products, and the one the
// backend picks (src/train/sgemm_ceiling.hpp, which train's --sgemm-ceiling measures with too).
#include <algorithm>

#include "src/train/sgemm_ceiling.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"
#include "tools/runtime.hpp"

namespace shardlab {

namespace po = cli::po;

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

}  // namespace shardlab
