// `shardlab bench-attention`: attention forward + backward alone, fused against naive
// (benchmarks/attention_bench.hpp); benchmarks/compare_attention.sh races it against PyTorch.
#include <sstream>

#include "benchmarks/attention_bench.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"
#include "tools/runtime.hpp"

namespace shardlab {

namespace po = cli::po;

namespace {
// "512,2048" -> {512, 2048}, each at least 1.
std::vector<int64_t> int_list(const std::string& s, const char* flag) {
  std::vector<int64_t> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SHARD_REQUIRE(used == item.size() && x >= 1 && x <= (1LL << 24), "--{} '{}': expected positive integers separated "
                  "by commas, got '{}'", flag, s, item);
    v.push_back(x);
  }
  SHARD_REQUIRE(!v.empty(), "--{} '{}': expected at least one value", flag, s);
  return v;
}
}  // namespace

ExitCode cmd_bench_attention(const Args& args, const Context& ctx) {
  cli::RunOptions run;
  AttentionBenchConfig cfg;
  std::string seqs = "512,2048", heads = "8", dims = "64", kernels = "flash,naive";
  bool full = false;
  double naive_max_gib = 4;
  cli::Desc desc = cli::command_options("bench-attention");
  desc.add_options()("seqs", po::value(&seqs)->default_value(seqs), "sequence lengths T, comma-separated")(
      "heads", po::value(&heads)->default_value(heads), "head counts H, comma-separated")(
      "head-dims", po::value(&dims)->default_value(dims), "head dimensions hd, comma-separated")(
      "kv-group", po::value(&cfg.group)->default_value(cfg.group),
      "query heads per K/V head: grouped-query attention (1 = multi-head; every --heads a multiple of it)")(
      "kernels", po::value(&kernels)->default_value(kernels),
      "flash, naive or cudnn (CUDA only: cuDNN's fused attention, bf16 inside), comma-separated")(
      "not-causal", po::bool_switch(&full), "every key for every query (default causal)")(
      "repeats", po::value(&cfg.repeats)->default_value(cfg.repeats), "timed runs of each point (the best is printed)")(
      "warmup", po::value(&cfg.warmup)->default_value(cfg.warmup), "untimed runs first")(
      "naive-max", po::value(&naive_max_gib)->default_value(naive_max_gib),
      "GiB: naive points whose two (H, T, T) f32 buffers exceed this are skipped");
  run.add(desc, true);
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"bench-attention"})) return ExitCode::ok;
  SHARD_REQUIRE(ctx.mpi.world() == 1, "bench-attention runs on one rank, {} started", ctx.mpi.world());
  SHARD_REQUIRE(cfg.repeats >= 1 && cfg.warmup >= 0, "--repeats {} --warmup {}: expected at least 1 and 0",
                cfg.repeats, cfg.warmup);
  SHARD_REQUIRE(naive_max_gib > 0, "--naive-max {}: expected a positive number of GiB", naive_max_gib);
  cfg.seqs = int_list(seqs, "seqs");
  cfg.heads = int_list(heads, "heads");
  SHARD_REQUIRE(cfg.group >= 1, "--kv-group {}: expected at least 1 query head per K/V head", cfg.group);
  for (int64_t h : cfg.heads)
    SHARD_REQUIRE(h % cfg.group == 0, "--heads {} --kv-group {}: the heads must be a multiple of the group", h,
                  cfg.group);
  cfg.head_dims = int_list(dims, "head-dims");
  cfg.causal = !full;
  cfg.naive_max_bytes = static_cast<int64_t>(naive_max_gib * double(int64_t{1} << 30));
  cfg.kernels.clear();
  std::stringstream in(kernels);
  for (std::string k; std::getline(in, k, ',');) cfg.kernels.push_back(parse_attention_kernel(k));
  for (AttentionKernel k : cfg.kernels)
    SHARD_REQUIRE(k != AttentionKernel::cudnn || parse_device(run.device) == Device::cuda,
                  "--kernels cudnn runs on CUDA devices (cuDNN's fused attention): add --device cuda");
  SHARD_REQUIRE(cfg.causal || cfg.kernels == std::vector<AttentionKernel>{AttentionKernel::flash},
                "--not-causal: only the flash kernel computes non-causal attention (give --kernels flash)");
  std::unique_ptr<Backend> backend = make_device_backend(parse_device(run.device), run, ctx);
  run_attention_benchmark(*backend, cfg, stdout);
  return ExitCode::ok;
}

}  // namespace shardlab
