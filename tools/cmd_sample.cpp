// `shardlab sample`: the model of an --init file or a checkpoint on one rank (a world of one under
// DDP, so the forward is the strategies' own, forward only), prompt + sampled tokens on stdout,
// each token printed as soon as it is drawn.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "src/comm/sim_comm.hpp"
#include "src/checkpoint/checkpoint.hpp"
#include "src/train/sample.hpp"
#include "src/data/tokenizer.hpp"
#include "src/train/trainer.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"
#include "tools/runtime.hpp"

namespace shardlab {

ExitCode cmd_sample(const Args& args, const Context& ctx) {
  cli::RunOptions run;
  cli::MemoryOptions memory;
  cli::ModelOptions model;
  TrainConfig cfg;
  SampleConfig sc;
  std::string prompt, tokenizer_dir;
  int64_t seed = static_cast<int64_t>(sc.seed);
  cli::Desc desc = cli::command_options("sample");
  cli::add_init(desc, cfg.init,
                "the model: an HF model directory (its config.json gives the shape) or a .safetensors file with HF "
                "names (its shape from --model and the overrides)");
  cli::add_resume(desc, cfg.resume, "the model: a checkpoint directory (its shape from the manifest)");
  desc.add_options()("prompt", cli::po::value(&prompt)->default_value(""),
                     "text for byte-level models (vocab <= 256), token ids separated by spaces or commas otherwise; "
                     "empty = a newline")(
      "tokens", cli::po::value(&sc.tokens)->default_value(sc.tokens), "tokens to generate")(
      "temperature", cli::po::value(&sc.temperature)->default_value(sc.temperature, "1.0"),
      "softmax temperature (0 = greedy)")(
      "top-k", cli::po::value(&sc.top_k)->default_value(sc.top_k),
      "sample among the K most likely tokens (0 = all, 1 = greedy)");
  cli::add_switch(desc, "kv-cache", sc.kv_cache,
                  "run the prompt once and then one new position per token against a KV cache; false: the whole "
                  "context through the model for every token (the same tokens, slower; for comparison)");
  cli::add_seed(desc, seed, "sampling seed: the same seed gives the same sample");
  cli::add_tokenizer(desc, tokenizer_dir, "the prompt and the sample (default: a checkpoint's, or the --init "
                    "directory's tokenizer.json)");
  run.add(desc);
  memory.add(desc);
  model.add(desc);
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"sample"})) return ExitCode::ok;
  SHARD_REQUIRE(ctx.mpi.world() == 1, "sample runs on one rank (started on {})", ctx.mpi.world());
  SHARD_REQUIRE(cfg.init.empty() != cfg.resume.empty(), "sample needs exactly one model: --init FILE or --resume CKPT");
  SHARD_REQUIRE(seed >= 0, "--seed {}: expected a non-negative integer", seed);
  sc.seed = static_cast<uint64_t>(seed);
  if (!cfg.resume.empty()) {  // the checkpoint says what it holds
    const Manifest m = read_manifest(cfg.resume);
    // The tokenizer the run trained with, unless --tokenizer names another (checked against the manifest).
    if (tokenizer_dir.empty() && !read_checkpoint_tokenizer(cfg.resume, m).empty()) tokenizer_dir = cfg.resume;
    cfg.spec = m.model;
    cfg.optim.kind = parse_optimizer(m.optimizer.kind);
    cfg.shuffle = m.shuffle;
    cfg.seed = m.seed;
    cfg.steps = std::max<int64_t>(m.step, 1);
  } else {
    cfg.spec = model.spec(cfg.init);
    // An HF directory's own tokenizer (an export carries the run's), unless --tokenizer names another.
    if (tokenizer_dir.empty() && std::filesystem::is_regular_file(std::filesystem::path(cfg.init) / "tokenizer.json"))
      tokenizer_dir = cfg.init;
  }
  sc.validate(cfg.spec.vocab);
  if (!tokenizer_dir.empty()) cfg.tokenizer = std::make_shared<const Tokenizer>(tokenizer_dir);
  std::vector<int32_t> tokens = encode_prompt(prompt, cfg.spec.vocab, cfg.tokenizer.get());
  SHARD_REQUIRE(static_cast<int64_t>(tokens.size()) <= cfg.spec.seq,
                "--prompt has {} tokens, more than the model's {} positions (--seq)", tokens.size(), cfg.spec.seq);
  auto backend = make_cpu(run, ctx);
  Pool pool(*backend, memory.pools());
  auto comm = make_sim_communicator(0, 1, pool);
  auto none = std::make_shared<TokenStream>(zero_stream(cfg.spec.seq + 1, "(sample: no data)"));  // no data read
  Trainer trainer(*backend, pool, *comm, cfg, none);
  // The prompt, then each token as it is drawn, flushed, so a slow model shows its progress.
  TextStream text(cfg.spec.vocab, cfg.tokenizer.get());
  auto print = [](const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  };
  for (int32_t t : tokens) print(text.push(t));  // an empty prompt's stand-in newline is not printed
  trainer.generate(tokens, sc, [&](int32_t t) { print(text.push(t)); });
  print(text.finish() + "\n");
  return ExitCode::ok;
}

}  // namespace shardlab
