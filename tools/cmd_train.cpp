// `shardlab train`: one training run under any strategy on any number of ranks.
#include <cstdio>

#include "src/core/outputs.hpp"
#include "src/data/data.hpp"
#include "src/data/tokenizer.hpp"
#include "src/train/sgemm_ceiling.hpp"
#include "src/train/trainer.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"
#include "tools/runtime.hpp"
#include "tools/train_reports.hpp"

namespace shardlab {
namespace {

// train's own options: outputs, checkpoints, samples, resume.
void add_run_options(cli::Desc& desc, TrainConfig& cfg, std::string& tokenizer_dir, std::string& sgemm_ceiling,
                     double& save_timeout) {
  desc.add_options()("save", cli::po::value(&cfg.save_path)->default_value(""),
                     "write the final weights: to FILE.safetensors, or as an HF model directory (config.json and "
                     "safetensors, sharded past 5GB) for any other path")(

      "log", cli::po::value(&cfg.log_path)->default_value(""), "write one JSON object per step to this file")(
      "print-every", cli::po::value(&cfg.print_every)->default_value(1), "progress line every k steps")(
      "save-dir", cli::po::value(&cfg.save_dir)->default_value(""),
      "write checkpoints under this directory (step_XXXXXXXX, atomically), at least at the end")(
      "save-every", cli::po::value(&cfg.save_every)->default_value(0), "also checkpoint every K steps")(
      "save-timeout", cli::po::value(&save_timeout)->default_value(save_timeout),
      "seconds a rank may wait in one collective inside a checkpoint save (where rank 0 writing or committing "
      "keeps the others waiting) before the job ends (exit 5), as --collective-timeout does elsewhere; 0 = "
      "unwatched. Off with --collective-timeout 0")(
      "check-links-every", cli::po::value(&cfg.check_links_every)->default_value(0), "with ranks on several hosts: "
      "time the links between them at the start and every K steps, naming a straggler (0 = only at the start, -1 = "
      "never)")(
      "term-grace", cli::po::value(&cfg.term_grace_s)->default_value(cfg.term_grace_s, "30"),
      "seconds a stop (SIGTERM, SIGUSR1, Ctrl-C with a --save-dir) may wait for the step to end: past them the "
      "process exits at once (143), the newest complete checkpoint intact, as a scheduler's SIGKILL after its "
      "grace would end it anyway (0 = wait for the step however long)")(
      "save-keep", cli::po::value(&cfg.save_keep)->default_value(0),
      "keep only the newest K complete checkpoints, deleting older ones after a newer one is complete (0 = all; "
      "the --save-best checkpoint is always kept)")(
      "sample-every", cli::po::value(&cfg.sample_every)->default_value(0),
      "print a sample from rank 0 every K steps and at the end (0 = never; parameters gathered as in a forward)")(
      "sample-prompt", cli::po::value(&cfg.sample_prompt)->default_value(""), "the samples' prompt (as sample --prompt)")(
      "sample-tokens", cli::po::value(&cfg.sample.tokens)->default_value(cfg.sample.tokens), "tokens per sample")(
      "sample-temperature", cli::po::value(&cfg.sample.temperature)->default_value(cfg.sample.temperature, "1.0"),
      "the samples' temperature (0 = greedy); their seed is --seed, drawn afresh each step")(
      "sgemm-ceiling", cli::po::value(&sgemm_ceiling)->default_value(sgemm_ceiling),
      "the CPU's sgemm GFLOP/s per rank that the progress line's model FLOP/s is a share of: auto (this step's "
      "products timed before the first step, a fraction of a second; skipped for large models), off, or a figure "
      "(bench-train's ceiling)");
  cli::add_tokenizer(desc, tokenizer_dir, "a text --data or --val-data, prompts and samples");
  cli::add_switch(desc, "save-overwrite", cfg.save_overwrite,
                  "let --save replace weights no shardlab export wrote (a Hugging Face download, an --init directory, "
                  "a .safetensors file from elsewhere); refused without it");
  cli::add_switch(desc, "save-async", cfg.save_async, "write --save-dir's checkpoints in the background (the step "
                  "waits for one copy into host buffers; the next save, a stop or the end wait for the one in flight)");
  cli::add_switch(desc, "save-best", cfg.save_best,
                  "also checkpoint each step whose validation loss is the lowest so far, and point DIR/best at it");
  cli::add_switch(desc, "skip-nonfinite", cfg.skip_nonfinite,
                  "skip the update of a step whose loss or gradient norm is not finite (default: stop, naming it)");
  cli::add_resume(desc, cfg.resume,
                  "resume from a checkpoint directory, or 'auto' for the newest complete one under --save-dir; any "
                  "world size and strategy can resume any checkpoint");
  desc.add_options()("max-skipped-steps", cli::po::value(&cfg.max_skipped_steps)->default_value(cfg.max_skipped_steps),
                     "with --skip-nonfinite: stop (exit 1, naming the steps) after this many skipped steps in a row")(
      "run-id", cli::po::value(&cfg.run_id), "the run's name, recorded in its checkpoints and log (default: a resumed "
      "checkpoint's, or a new one from the time); a resume from another run's checkpoint is refused");
  cli::add_switch(desc, "allow-schedule-change", cfg.allow_schedule_change, "let a resume change the learning-rate "
                  "schedule, --grad-clip or the optimizer's hyper-parameters (noted; refused otherwise)");
  cli::add_switch(desc, "allow-data-growth", cfg.allow_data_growth, "let a resume read a --data list or pattern that "
                  "gained files after the checkpoint's (theirs unchanged and first; noted; refused otherwise)");
}

}  // namespace

ExitCode cmd_train(const Args& args, const Context& ctx) {
  cli::TrainOptions opts;
  cli::ReportOptions reports;
  TrainConfig cfg;
  std::string tokenizer_dir, sgemm_ceiling = "auto";
  double save_timeout = 1800;
  cli::Desc desc = cli::command_options("train");
  add_run_options(desc, cfg, tokenizer_dir, sgemm_ceiling, save_timeout);
  opts.add(desc, cfg);
  reports.add(desc, "write rank 0's memory report as JSON (schema shardlab.profile/2)",
              "write the run report (rank 0): a self-contained HTML page with SVG charts of the loss and validation "
              "curves, tokens/s, communication and peak memory per step, and the last step's memory by category",
              "write a Chrome trace-event file (Perfetto) of the last step: phases, collectives, memory per category");
  cli::po::variables_map given;
  cli::OptionSources sources;
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"train"}, &sources, &given)) return ExitCode::ok;
  opts.finish(cfg, ctx, ctx.mpi.world());
  cfg.options_origin = cli::describe(sources);
  cli::check_applicable(given, cfg, {cfg.strategy.kind}, false, "train", ctx.mpi.rank());
  if (!tokenizer_dir.empty()) {  // prompts, samples and a text --data / --val-data (a .bin is tokens already)
    cfg.tokenizer = std::make_shared<const Tokenizer>(tokenizer_dir);
    SHARD_REQUIRE(static_cast<int64_t>(cfg.tokenizer->size()) <= cfg.spec.vocab,
                  "--tokenizer '{}' has {} tokens, more than the model's vocabulary of {}: pass --vocab {} or a model "
                  "whose vocabulary holds them", tokenizer_dir, cfg.tokenizer->size(), cfg.spec.vocab,
                  cfg.tokenizer->size());
  }
  cfg.record_step = reports.any();
  cfg.report_outputs = {{"--json", reports.json}, {"--html", reports.html}, {"--trace", reports.trace}};
  NamedPaths in = data_inputs(cfg.data, cfg.val_data);
  in.insert(in.end(), {{"--init", cfg.init}, {"--resume", cfg.resume == "auto" ? "" : cfg.resume}, {"--tokenizer", tokenizer_dir}});
  check_outputs_distinct(in,
                         {{"--log", cfg.log_path}, {"--save", cfg.save_path}, {"--save-dir", cfg.save_dir},
                          {"--json", reports.json}, {"--html", reports.html}, {"--trace", reports.trace}});
  reports.check("before the first step");  // every rank: each stops with the same message
  require_step_fits_host(cfg, opts, ctx);
  start_watchdog(ctx, opts.run.collective_timeout, save_timeout);
  SHARD_REQUIRE(cfg.check_links_every >= -1, "--check-links-every {}: expected K steps, 0 or -1", cfg.check_links_every);
  if (cfg.check_links_every >= 0 && (cfg.check_links = link_checker(ctx))) cfg.links_note = cfg.check_links();
  auto backend = opts.backend(ctx, cfg);
  Pool pool(*backend, opts.memory.pools(backend.get()));
  auto comm = ctx.world(cfg.comm).connect(pool);
  set_sgemm_ceiling(cfg, sgemm_ceiling, *backend, *comm);
  Trainer trainer(*backend, pool, *comm, cfg);
  const StepStats last = trainer.run(stdout);
  if (reports.any()) write_train_reports(trainer, *comm, reports, last, ctx.mpi);
  return trainer.interrupted() ? ExitCode::interrupted : ExitCode::ok;
}

}  // namespace shardlab
