// `shardlab export CHECKPOINT --out DIR|FILE.safetensors`: a checkpoint as an HF model directory
// (config.json and safetensors, sharded past --max-shard-size) or as one HF-named safetensors file,
// one tensor in memory at a time (rank 0).
#include <cstdio>

#include "src/core/units.hpp"
#include "src/model/hf_dir.hpp"
#include "src/checkpoint/checkpoint.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"

namespace shardlab {

ExitCode cmd_export(const Args& args, const Context& ctx) {
  std::string ckpt, out, dtype = "f32", max_shard = "5GB";
  bool overwrite = false;
  cli::Desc desc = cli::command_options("export");
  desc.add_options()("checkpoint", cli::po::value(&ckpt), "checkpoint directory (step_XXXXXXXX); also the operand")(
      "out", cli::po::value(&out)->default_value(""),
      "where to write: a path ending in .safetensors is one file (HF tensor names); any other is an HF model "
      "directory (config.json and model.safetensors, or shards and model.safetensors.index.json), created if needed: "
      "new, empty, or holding an earlier export")(
      "max-shard-size", cli::po::value(&max_shard)->default_value(max_shard),
      "a directory's largest shard file (transformers' save_pretrained convention: 5GB = 5e9 bytes; also MB, KB, "
      "GiB, plain bytes); a larger model is split into model-0000i-of-0000N.safetensors with an index");
  cli::add_dtype(desc, dtype, "stored dtype: f32, bf16 or f16");
  cli::add_switch(desc, "overwrite", overwrite, "replace the weights and config.json of a directory holding a model "
                  "shardlab did not export there (a Hugging Face download, the directory a run was initialised "
                  "from), which is refused otherwise");
  cli::po::variables_map given;
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"export", "CHECKPOINT --out DIR|FILE.safetensors", "checkpoint"},
                  nullptr, &given))
    return ExitCode::ok;
  SHARD_REQUIRE(!ckpt.empty() && !out.empty(), "usage: shardlab export CHECKPOINT --out DIR|FILE.safetensors");
  const bool file = is_safetensors_path(out);
  SHARD_REQUIRE(!file || given["max-shard-size"].defaulted(),
                "--max-shard-size {} with --out {}: a .safetensors file is never split; give a directory for shards",
                max_shard, out);
  const uint64_t max_shard_size = parse_bytes(max_shard);
  SHARD_REQUIRE(max_shard_size > 0, "--max-shard-size {}: expected a positive size", max_shard);
  const DType stored = parse_dtype(dtype);
  if (ctx.mpi.rank() != 0) return ExitCode::ok;
  const std::string note = export_checkpoint(ckpt, out, stored, max_shard_size, overwrite);
  std::printf("wrote %s%s%s\n", out.c_str(), note.empty() ? "" : "; ", note.c_str());
  return ExitCode::ok;
}

}  // namespace shardlab
