// `shardlab export CHECKPOINT --out FILE`: a checkpoint as one HF-named safetensors file, one tensor
// in memory at a time (rank 0).
#include <cstdio>

#include "src/train/checkpoint.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"

namespace shardlab {

ExitCode cmd_export(const Args& args, const Context& ctx) {
  std::string ckpt, out, dtype = "f32";
  cli::Desc desc = cli::command_options("export");
  desc.add_options()("checkpoint", cli::po::value(&ckpt), "checkpoint directory (step_XXXXXXXX); also the operand")(
      "out", cli::po::value(&out)->default_value(""), "safetensors file to write (HF GPT-2 names)");
  cli::add_dtype(desc, dtype, "stored dtype: f32, bf16 or f16");
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"export", "CHECKPOINT --out FILE.safetensors", "checkpoint"}))
    return ExitCode::ok;
  SHARD_REQUIRE(!ckpt.empty() && !out.empty(), "usage: shardlab export CHECKPOINT --out FILE.safetensors");
  if (ctx.mpi.rank() != 0) return ExitCode::ok;
  export_checkpoint(ckpt, out, parse_dtype(dtype));
  std::printf("wrote %s\n", out.c_str());
  return ExitCode::ok;
}

}  // namespace shardlab
