// report.hpp — a memory report as data: plain rows (predicted and, when measured, measured bytes
// per category), the budget and the unit names its phase labels ("backward h.3") are built from.
// Nothing here knows strategies or models, and nothing here renders: the terminal table, the JSON
// document, the HTML page and the Chrome trace are src/report/memory_report.hpp.
#pragma once
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "memory/estimate.hpp"

namespace shardlab {

// A point event on a trace (a collective's issue), at t_ms on the ledger's clock.
struct TraceMark {
  double t_ms;
  std::string name;
  double bytes;
};

// A span on a trace's own track (a pipeline stage's actions: "F3c1", its message waits inside),
// from t_ms for dur_ms on the ledger's clock.
struct TraceSpan {
  double t_ms, dur_ms;
  std::string name;
};

// What the "vs ddp" and "vs dp" columns compare each row against.
enum class Baseline : uint8_t { none, ddp, dp };

using TierBytes = std::array<CategoryBytes, kNumTiers>;  // device, host

struct MemoryRow {
  std::string label;          // "zero3", "dp rank 0", "dp others"
  Baseline baseline = Baseline::none;
  int stage = 0;  // pipeline stage (--pp): "vs ddp" compares with DDP's row of the same stage
  Estimate predicted;
  uint64_t predicted_eval_peak = 0;  // a validation pass's peak (forward only); 0 = not predicted
  bool measured = false;
  CategoryBytes measured_states{}, measured_at_peak{}, measured_peak_by_category{};
  uint64_t measured_peak = 0;
  Phase measured_phase;
  HostEstimate measured_host;                  // the host tier, measured
  std::vector<LedgerEvent> measured_timeline;  // one step
  std::vector<TraceMark> measured_comm;        // the collectives of that step
  bool fits = true;           // predicted peak within the budget (when there is one)
  int64_t max_micro_batch = 0;  // largest micro-batch whose predicted peak fits (0: none, or no budget)
  double comm_bytes = 0;      // measured bus bytes per rank per step (0 when not measured)
  // Copies the measured fields of m (a measured row of the same configuration).
  void take_measurement(const MemoryRow& m);
};

// `profile --budget`: the cheapest combination of memory levers whose predicted peaks fit.
struct LeverChoice {
  std::string strategy, checkpointing, offload;
  int64_t micro_batch = 0, accum = 0;  // accum keeps the requested sequences per rank and step
  uint64_t peak = 0, host_peak = 0;
};

struct MemoryReport {
  std::string title;      // e.g. "gpt2-xl (...), world 64, micro-batch 4 x 1024"
  std::string config_json;  // the run's configuration, embedded as is in the JSON report
  uint64_t budget = 0;
  std::vector<std::string> unit_names;  // for phase labels
  std::vector<std::string> notes;       // lines printed under the title (under --pp: what each stage holds)
  std::vector<MemoryRow> rows;
  uint64_t host_budget = 0;
  bool levers_searched = false;       // with a budget: the search ran
  std::optional<LeverChoice> levers;  // its answer (none: nothing fits)
  // Measured on a GPU: device memory outside the Pool on rank 0 (CUDA context, cuBLAS workspace,
  // NCCL buffers), from cudaMemGetInfo less what the backend's allocator reserved. 0 elsewhere.
  uint64_t outside_pool = 0;
};

}  // namespace shardlab
