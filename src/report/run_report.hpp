// run_report.hpp — the run report: what one training run (or compare's run per strategy) did, as a
// self-contained HTML page with inline SVG and no scripts: the training and validation loss over
// the steps, tokens/s, communication (bus bytes per rank) and peak memory per step, and, where the
// run recorded them, memory/report's memory charts. `shardlab report` draws it from a --log file.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "memory/report.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {

struct RunSeries {
  std::string label;             // the strategy ("zero3"), or the log's name
  std::vector<StepStats> steps;  // in step order; val_loss on the steps that validated
  std::string what_ran;          // from a log's start record: model, strategy, mesh, batch, data ("" without one)
  std::vector<std::string> notes;  // what reading the log left out, and why
};

struct RunReport {
  std::string title;               // "shardlab train: tiny (...), zero2 on 2 ranks, global batch 4"
  std::vector<std::string> facts;  // lines under the title
  std::vector<RunSeries> runs;     // one per strategy (compare), else one
  std::optional<MemoryReport> memory;  // rank 0's memory: table, bars, one step's timeline per row
};

std::string run_report_html(const RunReport& r);

// A --log file (JSON lines, one object per step, as Trainer::run writes them; run_log.cpp) as a
// series named `label`. A start record gives what_ran; a step whose loss is null (not finite,
// --skip-nonfinite) and a last line cut short by a killed run are left out with a note. Throws
// InputError naming the file and line of anything else that is not such an object.
RunSeries read_step_log(const std::string& path, const std::string& label);
// `report LOG` without --html: per run, what ran, the steps, the loss (first, last, lowest, last
// validation), the median step time and tokens/s, the peak memory and the notes.
std::string run_summary_text(const RunSeries& s);

}  // namespace shardlab
