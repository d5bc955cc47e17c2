// memory_report.hpp — a memory report (memory/report.hpp) rendered: the terminal table, a versioned
// JSON document, a self-contained HTML page with SVG charts (no scripts, no network) and a Chrome
// trace-event file. The rows say which one is the baseline each saving is measured against.
#pragma once
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "memory/report.hpp"

namespace shardlab {

void print_memory_table(const MemoryReport& r, std::FILE* out);
std::string memory_report_json(const MemoryReport& r);
std::string memory_report_html(const MemoryReport& r);
// The page's parts, for reports that embed the memory charts (the run report): the doctype, head
// and style up to <body>; and the memory sections (table, bars, one timeline per row) without them.
std::string html_page_start(const std::string& title);
std::string memory_report_sections(const MemoryReport& r);
std::string html_escape(const std::string& s);
// Chrome trace-event JSON (opens in Perfetto): per measured row a process with memory counters per
// category and a span per phase (forward of unit i, backward of unit i, loss, optimizer step).
std::string memory_trace_json(const MemoryReport& r);
// A trace-event document around events written by append_trace_events.
std::string chrome_trace_document(const std::string& events);
// The same for one ledger timeline, as the events of process `pid` named `name` (no enclosing
// array): `base` is what was live on each tier before the first event (the host tier gets its own
// counter); marks go on a "collectives" track; a
// validation loss measured after the step, if given, is a counter at its end; spans, if any, go on
// a "pipeline actions" track (nested where one holds another).
void append_trace_events(std::string& out, int pid, const std::string& name, const std::vector<LedgerEvent>& events,
                         const TierBytes& base, const std::vector<TraceMark>& marks,
                         const std::vector<std::string>& unit_names, std::optional<double> val_loss = std::nullopt,
                         const std::vector<TraceSpan>& spans = {});

}  // namespace shardlab
