// price.hpp — the device model: a step's cost ledger (cost.hpp) priced on a device, its streams
// replayed to find the critical path.
//
// Each operation takes the longest of its bounds, plus nothing else:
//   tensor  tensor_flops / (tensor peak x gemm x sat(m) sat(n) sat(k)),  sat(x) = x / (x + knee)
//   vector  flops / vector peak (a GEMM on f32 operands: x gemm x sat too)
//   memory  bytes / (bandwidth x memory x fill),  fill = min(1, blocks / SMs) for the operation's
//           largest kernel (OpCost::blocks): a kernel with fewer blocks than the device has SMs
//           leaves the rest idle, and its bandwidth with them
//   floor   a command's least time on the device (a kernel, a library call, a copy), per command
//   link    a collective's bus bytes / its axis's link + the link's latency
// Replay, in the order the host issued the commands: the host spends `launch` seconds issuing each
// command; an operation starts when the host has issued its first command, its stream is free and
// the events its stream waits on have passed, and ends no sooner than its last command is issued;
// a host synchronisation waits for the compute stream (a copy to or from the host) or for both
// (Backend::synchronize). The step ends when
// the host and both streams are done. Where the compute stream sits idle is split by what held it:
// a collective's event (exposed communication), the host issuing after it synchronised (host
// waits), or the host issuing too slowly for the kernels (launch gaps).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "src/backend/cost.hpp"
#include "src/core/device_peaks.hpp"

namespace shardlab {

// A rate and where it came from.
struct SourcedRate {
  double value = 0;
  std::string from;
};

struct DeviceModel {
  std::string name;
  SourcedRate tensor_flops;  // dense bf16 FLOP/s on tensor cores (0: none, as on a CPU)
  SourcedRate vector_flops;  // f32 FLOP/s without them
  SourcedRate bandwidth;     // device-memory bytes/s
  int sms = 0;               // 0: no grids (a CPU)
  double gemm = 0.70;        // the share of a peak a large GEMM reaches
  double knee = 48;          // sat(x) = x / (x + knee)
  double memory = 0.80;      // the share of bandwidth a streaming kernel reaches
  double launch_s = 0;       // host seconds to issue one command
  double kernel_floor_s = 0; // a kernel's least time on the device
  // Links by the mesh's axis name ("dp", "tp", ...): bus bytes/s; `link` for any axis not named.
  // A node holds `ranks_per_node` ranks (0: one node for all): an axis whose group crosses nodes
  // runs at `inter` (src/train/price_layout.hpp sets `links` so).
  std::map<std::string, double> links;
  SourcedRate link, inter;
  int ranks_per_node = 0;
  double link_latency_s = 0;
  // Operations whose kernels reach only a share of the peaks (compute and memory alike), by name:
  // fitted from measurements on the device where one was lent, with the measurement as the source.
  std::map<std::string, SourcedRate> op_share;
  // Flag a launch that moves at least this many bytes on fewer blocks than the device has SMs.
  double underfill_bytes = 16e6;
  std::string describe() const;  // one line per rate with its source
  double link_of(const std::string& axis) const;
};

// A GPU preset (src/core/device_peaks.hpp) with the model's shares; links within a node.
DeviceModel gpu_device_model(const DevicePeaks& d);
// A CPU of `threads` cores: measured or nominal rates (the caller says which in `from`).
DeviceModel cpu_device_model(double flops, double bandwidth, const std::string& from);

// One operation's seconds on the device, alone.
struct OpTime {
  double seconds = 0;
  const char* bound = "";  // tensor, vector, memory, floor, link
  bool underfilled = false;
};
OpTime price_op(const OpCost& c, const DeviceModel& d);

// The ledger's operations gathered by name (and axis, for collectives), in order of time.
struct PricedOp {
  std::string name{}, axis{}, bound{};
  int64_t calls = 0, launches = 0;
  int64_t underfilled = 0;  // calls whose main kernel moves underfill_bytes or more on fewer blocks than SMs
  int64_t blocks = 0;  // the smallest of its calls' grids (OpCost::blocks; 0: none)
  double flops = 0, tensor_flops = 0, bytes = 0, bus_bytes = 0, seconds = 0;
  int64_t host_syncs = 0;
};

struct StepPrice {
  double total = 0;
  // The compute stream's time: busy, and idle split by what held it (they add up to total).
  double compute = 0, exposed_comm = 0, launch_gaps = 0, host_waits = 0;
  double comm_busy = 0;  // the comm stream's busy time (hidden or not)
  int64_t launches = 0, host_syncs = 0, host_syncs_mid_step = 0;
  double flops = 0, tensor_flops = 0, bytes = 0, bus_bytes = 0;
  double gemm_bytes = 0;  // of bytes: the model's GEMMs' ("gemm"); the rest is traffic outside them
  std::vector<PricedOp> ops;
};
StepPrice price_step(const CostLedger& ledger, const DeviceModel& d);

}  // namespace shardlab
