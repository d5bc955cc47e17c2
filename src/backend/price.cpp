#include "src/backend/price.hpp"

#include <algorithm>
#include <array>
#include <string_view>
#include <fmt/format.h>

namespace shardlab {

std::string DeviceModel::describe() const {
  std::string s = fmt::format("{}:\n", name);
  auto line = [&](const char* what, const SourcedRate& r, bool flops) {
    if (r.value <= 0) return;
    const bool tera = flops && r.value >= 1e12;
    s += fmt::format("  {:<14} {:>10.1f} {}  ({})\n", what, r.value / (tera ? 1e12 : 1e9),
                     flops ? (tera ? "TFLOP/s" : "GFLOP/s") : "GB/s", r.from);
  };
  line("tensor", tensor_flops, true);
  line("vector", vector_flops, true);
  line("memory", bandwidth, false);
  line("links", link, false);
  if (ranks_per_node > 0) line(fmt::format("across nodes of {}", ranks_per_node).c_str(), inter, false);
  for (const auto& [op, share] : op_share)
    s += fmt::format("  {:<26} {:>5.1f}% of the peaks  ({})\n", op, 100 * share.value, share.from);
  s += fmt::format(
      "  shares: gemm {:.2f} (knee {:.0f}), memory {:.2f}; launch {:.1f} us, kernel floor {:.1f} us, "
      "{} SMs\n",
      gemm, knee, memory, launch_s * 1e6, kernel_floor_s * 1e6, sms);
  return s;
}

double DeviceModel::link_of(const std::string& axis) const {
  auto it = links.find(axis);
  return it != links.end() ? it->second : link.value;
}

// The launch and kernel figures are nominal until a lent GPU fits them (docs/performance.md):
// a CUDA launch costs the host a few microseconds, and a kernel takes about two on the device.
DeviceModel gpu_device_model(const DevicePeaks& d) {
  DeviceModel m;
  m.name = d.name;
  m.tensor_flops = {d.dense_bf16_tflops * 1e12, d.source};
  m.vector_flops = {d.vector_f32_tflops * 1e12, d.source};
  m.bandwidth = {d.hbm_gbs * 1e9, d.source};
  m.sms = d.sms;
  m.launch_s = 4e-6;
  m.kernel_floor_s = 2e-6;
  m.link = {d.nvlink_gbs * 1e9 * 0.80, fmt::format("{}: NVLink per direction x 0.80 (plan's intra share)", d.source)};
  m.inter = {d.nic_gbits / 8 * 1e9 * 0.90, fmt::format("{}: one NIC per GPU x 0.90 (plan's inter share)", d.source)};
  m.ranks_per_node = d.gpus_per_node;
  m.link_latency_s = 10e-6;
  // The CUDA fused attention (a warp per row on the CUDA cores, no shared-memory tiles) measured on
  // the lent H200: bench-attention --device cuda, 12 heads of 64, T 4,096, batch 1, forward and
  // backward 63.2 ms (docs/gpus.md, 2026-11-26) for the 92.0 GFLOP this model counts: 1.46 TFLOP/s,
  // 2.2% of the vector peak. Applied to every preset until each is measured.
  const SourcedRate flash{91.95e9 / 63.2e-3 / 67e12,
                          "fitted: bench-attention --device cuda on the lent H200, 2026-11-26 "
                          "(63.2 ms for H 12, hd 64, T 4,096, forward + backward)"};
  m.op_share["flash_attention_forward"] = flash;
  m.op_share["flash_attention_backward"] = flash;
  // cuDNN's fused attention (--attention cudnn), not yet measured here: forward at the share of the
  // H100's dense bf16 peak Shah et al. 2024 (FlashAttention-3, "attention forward speed, head dim
  // 64, H100 80GB SXM5") report for cuDNN at sequence 1k, 373 of 989 TFLOP/s; backward nominal, below
  // forward as every fused backward is. Both applied to every preset until a lent GPU fits them.
  m.op_share["cudnn_attention_forward"] = {373.0 / 989.0, "Shah et al. 2024 (FlashAttention-3), cuDNN forward, "
                                                          "hd 64, T 1k, H100 SXM5: 373 TFLOP/s"};
  m.op_share["cudnn_attention_backward"] = {0.30, "nominal (below forward); to fit on a lent GPU"};
  return m;
}

DeviceModel cpu_device_model(double flops, double bandwidth, const std::string& from) {
  DeviceModel m;
  m.name = "cpu";
  m.vector_flops = {flops, from};
  m.bandwidth = {bandwidth, from};
  m.gemm = 1.0;
  m.knee = 0;
  m.memory = 1.0;
  m.link = {2e9, "nominal: shared-memory MPI between ranks of one host"};
  m.link_latency_s = 5e-6;
  return m;
}

namespace {
double sat(double x, double knee) { return knee > 0 ? x / (x + knee) : 1.0; }
}  // namespace

OpTime price_op(const OpCost& c, const DeviceModel& d) {
  if (c.collective()) {
    if (c.group <= 1 || c.bus_bytes <= 0) return {0, "link", false};
    return {c.bus_bytes / d.link_of(c.axis) + d.link_latency_s, "link", false};
  }
  const bool gemm = c.m > 0;
  const auto own = d.op_share.find(c.name);
  const double share = own != d.op_share.end() ? own->second.value : 1.0;
  const double shape = gemm ? d.gemm * sat(static_cast<double>(c.m), d.knee) * sat(static_cast<double>(c.n), d.knee) *
                                  sat(static_cast<double>(c.k), d.knee)
                            : share;
  std::array<std::pair<double, const char*>, 4> bounds{};
  bounds[0] = {d.tensor_flops.value > 0 ? c.tensor_flops / (d.tensor_flops.value * shape)
                                        : c.tensor_flops / (d.vector_flops.value * shape),
               "tensor"};
  bounds[1] = {d.vector_flops.value > 0 ? c.flops / (d.vector_flops.value * shape) : 0, "vector"};
  const bool underfilled = d.sms > 0 && c.blocks > 0 && c.blocks < d.sms && c.bytes >= d.underfill_bytes;
  const double fill = d.sms > 0 && c.blocks > 0 ? std::min(1.0, static_cast<double>(c.blocks) / d.sms) : 1.0;
  bounds[2] = {d.bandwidth.value > 0 ? c.bytes / (d.bandwidth.value * d.memory * fill * share) : 0, "memory"};
  bounds[3] = {c.launches * d.kernel_floor_s, "floor"};
  auto best = std::max_element(bounds.begin(), bounds.end(), [](auto& a, auto& b) { return a.first < b.first; });
  return {best->first, best->second, underfilled};
}

namespace {

// The replay's state: when the host has issued everything so far, when each stream is next free,
// and when each event passes.
struct Replay {
  double host = 0;
  std::array<double, 2> free{};     // compute, comm
  std::array<double, 2> waiting{};  // the latest event each stream waits on before its next command
  std::vector<double> events;
  bool synced = false;  // the host synchronised since the compute stream's last command
};

int stream_index(StreamKind s) { return s == StreamKind::compute ? 0 : 1; }

PricedOp& row_for(std::vector<PricedOp>& rows, std::map<std::string, size_t>& at, const OpCost& c) {
  const std::string key = std::string(c.name) + "|" + c.axis;
  auto [it, added] = at.try_emplace(key, rows.size());
  if (added) rows.push_back({.name = c.name, .axis = c.axis});
  return rows[it->second];
}

// An operation's call added to its row and to the step's totals.
void tally(StepPrice& p, PricedOp& row, const OpCost& c, const OpTime& t) {
  row.calls += 1;
  row.launches += c.launches;
  row.underfilled += t.underfilled ? 1 : 0;  // the call's main kernel
  if (c.blocks > 0) row.blocks = row.blocks == 0 ? c.blocks : std::min(row.blocks, c.blocks);
  row.flops += c.flops;
  row.tensor_flops += c.tensor_flops;
  row.bytes += c.bytes;
  row.bus_bytes += c.bus_bytes;
  row.seconds += t.seconds;
  row.host_syncs += c.host_syncs;
  p.launches += c.launches;
  p.flops += c.flops;
  p.tensor_flops += c.tensor_flops;
  p.bytes += c.bytes;
  if (std::string_view(c.name) == "gemm") p.gemm_bytes += c.bytes;  // the GEMMs the model issues (cuBLAS)
  p.bus_bytes += c.bus_bytes;
}

}  // namespace

StepPrice price_step(const CostLedger& ledger, const DeviceModel& d) {
  StepPrice p;
  Replay r;
  r.events.assign(static_cast<size_t>(ledger.events()), 0.0);
  std::map<std::string, size_t> row_at;
  std::map<std::ptrdiff_t, std::map<std::string, double>> bound_seconds;  // per row: its time by bound
  size_t last_compute = 0;  // index of the last compute command: syncs before it are mid-step
  for (size_t i = 0; i < ledger.commands().size(); ++i) {
    const CostCommand& cmd = ledger.commands()[i];
    if (cmd.kind == CostCommand::Kind::op && cmd.stream == StreamKind::compute) last_compute = i;
  }
  for (size_t i = 0; i < ledger.commands().size(); ++i) {
    const CostCommand& cmd = ledger.commands()[i];
    const int s = stream_index(cmd.stream);
    switch (cmd.kind) {
      case CostCommand::Kind::record:
        r.events[static_cast<size_t>(cmd.event)] = std::max(r.free[s], r.waiting[s]);
        break;
      case CostCommand::Kind::wait:
        r.waiting[s] = std::max(r.waiting[s], r.events[static_cast<size_t>(cmd.event)]);
        break;
      case CostCommand::Kind::host_sync: {
        double done = std::max(r.free[0], r.waiting[0]);
        if (cmd.all_streams) done = std::max({done, r.free[1], r.waiting[1]});
        if (done > r.host) r.synced = true;
        r.host = std::max(r.host, done);
        ++p.host_syncs;
        if (i < last_compute) ++p.host_syncs_mid_step;
        break;
      }
      case CostCommand::Kind::op: {
        const OpCost& c = ledger.ops()[static_cast<size_t>(cmd.op)];
        const OpTime t = price_op(c, d);
        // Its first command can start once issued; the host issues the rest meanwhile, and the
        // operation ends no sooner than the last of them is issued.
        const double first = r.host + (c.launches > 0 ? d.launch_s : 0);
        r.host += c.launches * d.launch_s;
        const double start = std::max({first, r.free[s], r.waiting[s]});
        if (s == 0) {
          const double idle = start - r.free[0];
          if (idle > 0) {
            if (r.waiting[0] >= start && r.waiting[0] > first)
              p.exposed_comm += idle;
            else if (r.synced)
              p.host_waits += idle;
            else
              p.launch_gaps += idle;
          }
          p.compute += t.seconds;
          p.launch_gaps += std::max(0.0, r.host - (start + t.seconds));  // its commands issued slower than run
          r.synced = false;
        } else {
          p.comm_busy += t.seconds;
        }
        r.free[s] = std::max(start + t.seconds, r.host);
        PricedOp& row = row_for(p.ops, row_at, c);
        tally(p, row, c, t);
        bound_seconds[&row - p.ops.data()][t.bound] += t.seconds;
        break;
      }
    }
  }
  const double end = std::max({r.host, r.free[0], r.free[1], r.waiting[0], r.waiting[1]});
  // The tail: the compute stream's last work to the step's end (the last collectives, a final sync).
  const double tail = end - r.free[0];
  if (tail > 0) (r.waiting[0] > r.free[0] || r.free[1] > r.free[0] ? p.exposed_comm : p.launch_gaps) += tail;
  p.total = end;
  for (auto& [at, by_bound] : bound_seconds)  // a row's bound: where most of its time went
    p.ops[static_cast<size_t>(at)].bound =
        std::max_element(by_bound.begin(), by_bound.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
  std::stable_sort(p.ops.begin(), p.ops.end(),
                   [](const PricedOp& a, const PricedOp& b) { return a.seconds > b.seconds; });
  return p;
}

}  // namespace shardlab
