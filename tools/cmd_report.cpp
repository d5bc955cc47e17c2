// `shardlab report`: the run report (src/report/run_report.hpp) of a finished run, from its --log.
#include <cstdio>
#include <filesystem>

#include "src/core/outputs.hpp"
#include "src/core/suggest.hpp"
#include "src/report/run_report.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"
#include "tools/runtime.hpp"

namespace shardlab {

ExitCode cmd_report(const Args& args, const Context& ctx) {
  std::vector<std::string> logs;
  std::string html, title;
  cli::Desc desc = cli::command_options("report");
  desc.add_options()("log", cli::po::value(&logs)->multitoken(),
                     "a train --log file (JSON lines, one object per step); the words after `report` are these, and "
                     "several draw one line each on every chart")(
      "html", cli::po::value(&html)->default_value(""),
      "also write the report here: a self-contained HTML page with SVG charts (the text summary is always printed)")(
      "title", cli::po::value(&title)->default_value(""), "the report's title (default: the log files' names)");
  cli::Usage usage{"report", "LOG.jsonl [LOG2.jsonl ...]", "log"};
  usage.positional_many = true;
  if (!cli::parse(args, desc, ctx.mpi.rank(), usage)) return ExitCode::ok;
  SHARD_REQUIRE(!logs.empty(), "report needs a log file: shardlab report LOG.jsonl --html FILE");
  if (ctx.mpi.rank() != 0) return ExitCode::ok;
  if (!html.empty()) probe_output_file(html, "--html", "before reading the logs");
  RunReport r;
  for (const std::string& log : logs)
    r.runs.push_back(read_step_log(log, logs.size() == 1 ? log : std::filesystem::path(log).stem().string()));
  r.title = title.empty() ? "shardlab report: " + join_names(logs) : title;
  for (const RunSeries& s : r.runs) std::fputs(run_summary_text(s).c_str(), stdout);
  if (html.empty()) return ExitCode::ok;
  for (const RunSeries& s : r.runs) {
    if (!s.what_ran.empty()) r.facts.push_back(fmt::format("{}: {}", s.label, s.what_ran));
    r.facts.push_back(fmt::format("{}: steps {} to {}, loss {:.4f} -> {:.4f}{}", s.label, s.steps.front().step,
                                  s.steps.back().step, s.steps.front().loss, s.steps.back().loss,
                                  s.steps.back().val_loss ? fmt::format(", validation loss {:.4f}", *s.steps.back().val_loss)
                                                          : std::string()));
    for (const std::string& n : s.notes) r.facts.push_back(fmt::format("{}: note: {}", s.label, n));
  }
  r.facts.emplace_back("Memory by category over a step is in train --html and profile --html: the log holds each step's "
                    "peaks only.");
  write_text(html, run_report_html(r), "--html");  // says "wrote FILE"
  return ExitCode::ok;
}

}  // namespace shardlab
