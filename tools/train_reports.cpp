// train_reports.cpp — train's --json, --html and --trace, written when the run ends.
#include "tools/train_reports.hpp"

#include "src/compare/memory_row.hpp"
#include "src/report/memory_report.hpp"
#include "memory/report.hpp"
#include "src/report/run_report.hpp"
#include "tools/runtime.hpp"

namespace shardlab {

// --json / --html / --trace of a finished run: rank 0's memory, and every rank's last step on the trace.
void write_train_reports(Trainer& trainer, Communicator& comm, const cli::ReportOptions& reports, const StepStats& last,
                         const MpiRuntime& mpi) {
  const TrainConfig& cfg = trainer.config();
  const std::string name = strategy_name(cfg.strategy.kind);
  MemoryRow row = memory_row(trainer, name);
  // Under --pp, each action of the last step ("F3c1") with its message wait inside: the schedule
  // as it ran, one track per rank.
  std::vector<TraceSpan> spans;
  for (const PipelineTiming::Span& a : trainer.pipeline_timing().actions) {
    spans.push_back({a.start_ms, a.end_ms - a.start_ms, describe(a.action)});
    if (a.wait_ms > 0) spans.push_back({a.wait_start_ms, a.wait_ms, "wait"});
  }
  const bool piped = !spans.empty();
  std::string events;  // one trace process per rank
  append_trace_events(events, mpi.rank(),
                      piped ? fmt::format("rank {} ({}, stage {})", mpi.rank(), name, trainer.pipeline_rank())
                            : fmt::format("rank {} ({})", mpi.rank(), name),
                      row.measured_timeline, {row.measured_states, row.measured_host.model_states}, row.measured_comm,
                      trainer.unit_names(), last.val_loss ? std::optional<double>(*last.val_loss) : std::nullopt, spans);
  auto all = comm.gather_strings(events);
  if (mpi.rank() != 0) return;
  MemoryReport report;
  report.title = fmt::format("shardlab train: {}, {} on {} ranks, global batch {}, rank 0, last step",
                             cfg.spec.describe(), name, mpi.world(), cfg.batch);
  report.unit_names = trainer.unit_names();
  report.rows.push_back(row);
  if (!reports.json.empty()) write_text(reports.json, memory_report_json(report) + "\n", "--json");
  if (!reports.html.empty()) {
    RunReport run;
    run.title = fmt::format("shardlab train: {}, {} on {} rank{}, global batch {} x {} tokens", cfg.spec.describe(),
                            cfg.label(), mpi.world(), mpi.world() == 1 ? "" : "s", cfg.batch, cfg.spec.seq);
    if (!cfg.options_origin.empty()) run.facts.push_back("options: " + cfg.options_origin);
    run.runs.push_back({name, trainer.history(), "", {}});
    run.memory = report;
    write_text(reports.html, run_report_html(run), "--html");
  }
  if (!reports.trace.empty()) {
    std::string joined;
    for (const auto& e : all) joined += (joined.empty() || e.empty() ? "" : ",\n") + e;
    write_text(reports.trace, chrome_trace_document(joined), "--trace");
  }
}

}  // namespace shardlab
