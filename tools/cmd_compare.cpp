// `shardlab compare`: the same model, data and seed under each strategy; exit 3 when losses disagree.
#include <cstdio>

#include "src/report/memory_report.hpp"
#include "memory/report.hpp"
#include "src/model/family.hpp"
#include "src/compare/compare.hpp"
#include "src/core/outputs.hpp"
#include "src/data/data.hpp"
#include "src/report/run_report.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"
#include "tools/runtime.hpp"

namespace shardlab {

ExitCode cmd_compare(const Args& args, const Context& ctx) {
  cli::TrainOptions opts;
  cli::ReportOptions reports;
  CompareConfig cc;
  cc.train.steps = 20;
  std::string strategies = "dp,ddp,zero1,zero2,zero3";
  cli::Desc desc = cli::command_options("compare");
  cli::add_strategies(desc, strategies, "strategies to run, in order; the first is the loss reference");
  desc.add_options()("tolerance", cli::po::value(&cc.tolerance)->default_value(cc.tolerance),
                     "largest relative loss difference from the first strategy at any step");
  opts.add(desc, cc.train);
  reports.add(desc, "also write the results as JSON (schema shardlab.compare/1)",
              "write the run report (rank 0): a self-contained HTML page with SVG charts of each strategy's loss and "
              "validation curves, tokens/s, communication and peak memory per step, and memory by category",
              "write a Chrome trace-event file (Perfetto) of the last step: phases, collectives, memory per category");
  cli::po::variables_map given;
  cli::OptionSources sources;
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"compare"}, &sources, &given)) return ExitCode::ok;
  if (ctx.mpi.rank() == 0 && !sources.empty()) std::printf("shardlab compare options: %s\n", cli::describe(sources).c_str());
  opts.finish(cc.train, ctx, ctx.mpi.world());
  cc.strategies = cli::strategies_for(strategies, given, cc.train.layout.dims, "compare", ctx.mpi.rank());
  cli::check_applicable(given, cc.train, cc.strategies, true, "compare", ctx.mpi.rank());
  if (ctx.mpi.rank() == 0)
    std::printf("shardlab compare mesh: %s\n", cc.train.layout.dims.resolved(ctx.mpi.world()).describe().c_str());
  for (StrategyKind k : cc.strategies) {  // each strategy's step must fit this host (none is skipped for it)
    TrainConfig one = cc.train;
    one.use_strategy(k);
    require_step_fits_host(one, opts, ctx);
  }
  start_watchdog(ctx, opts.run.collective_timeout);
  {  // each strategy applies what it allows
    StepConfig z = cc.train;
    z.use_strategy(StrategyKind::zero3);
    z.validate_strategy();
  }
  SHARD_REQUIRE(cc.tolerance > 0, "--tolerance {}: expected a positive number", cc.tolerance);
  NamedPaths inputs = data_inputs(cc.train.data, cc.train.val_data);
  inputs.emplace_back("--init", cc.train.init);
  check_outputs_distinct(inputs,
                         {{"--json", reports.json}, {"--html", reports.html}, {"--trace", reports.trace}});
  reports.check("before the first strategy runs");  // every rank: each stops with the same message
  auto backend = opts.backend(ctx, cc.train);
  const PoolConfig pools = opts.memory.pools(backend.get());
  cc.budget = pools.budget;
  cc.host_budget = pools.host_budget;
  CompareResult r = run_compare(*backend, ctx.world(cc.train.comm), cc, stdout);
  const bool root = ctx.mpi.rank() == 0;
  if (root && !reports.json.empty()) write_text(reports.json, compare_json(cc, r, ctx.mpi.world()) + "\n", "--json");
  if (root && (!reports.html.empty() || !reports.trace.empty())) {
    MemoryReport report;
    report.title = fmt::format("shardlab compare: {}, {} ranks, global batch {}, rank 0, last step of each strategy",
                               cc.train.spec.describe(), ctx.mpi.world(), cc.train.batch);
    report.unit_names = family_of(cc.train.spec).unit_names(cc.train.spec);
    for (const auto& run : r.runs)
      if (!run.oom) report.rows.push_back(run.memory);
    if (!reports.html.empty()) {
      RunReport run;
      run.title = fmt::format("shardlab compare: {}, {} ranks, global batch {} x {} tokens, {} steps",
                              cc.train.spec.describe(), ctx.mpi.world(), cc.train.batch, cc.train.spec.seq, cc.train.steps);
      if (!sources.empty()) run.facts.push_back("options: " + cli::describe(sources));
      for (const auto& one : r.runs)
        if (one.oom) run.facts.push_back(one.name + " did not fit: " + one.error.substr(0, one.error.find('\n')));
        else run.runs.push_back({one.name, one.steps, "", {}});
      run.memory = report;
      write_text(reports.html, run_report_html(run), "--html");
    }
    if (!reports.trace.empty()) write_text(reports.trace, memory_trace_json(report), "--trace");
  }
  if (!r.agree) {
    if (root) std::fprintf(stderr, "shardlab compare: the strategies' losses disagree: %s\n", r.disagreement.c_str());
    return ExitCode::wrong_results;
  }
  return ExitCode::ok;
}

}  // namespace shardlab
