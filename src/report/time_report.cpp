#include "src/report/time_report.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace shardlab {
namespace {

std::string ms(double s) { return fmt::format("{:.3f}", s * 1e3); }
std::string share_pct(double part, double whole) { return whole > 0 ? fmt::format("{:.1f}%", 100 * part / whole) : "-"; }

void print_ops(const TimeRow& row, const DeviceModel& d, std::FILE* out, int top) {
  fmt::print(out, "\n{} (rank {}): the operations that take the time\n", row.label, row.rank);
  fmt::print(out, "{:<26} {:>6} {:>8} {:>8} {:>10} {:>10} {:>9} {:>7} {:>10} {:>6}\n", "operation", "calls",
             "launches", "grid", "TC GFLOP", "f32 GFLOP", "GB", "bound", "pred ms", "share");
  int shown = 0, flagged = 0;
  for (const PricedOp& op : row.price.ops) {
    if (top > 0 && shown++ >= top) break;
    const std::string name = op.axis.empty() ? op.name : fmt::format("{} ({})", op.name, op.axis);
    const bool flag = op.underfilled > 0;
    flagged += flag;
    fmt::print(out, "{:<26} {:>6} {:>8} {:>8} {:>10.2f} {:>10.2f} {:>9.3f} {:>7} {:>10} {:>6}{}\n", name, op.calls,
               op.launches, op.blocks > 0 ? fmt::format("{}", op.blocks) : "-", op.tensor_flops / 1e9,
               op.flops / 1e9, (op.axis.empty() ? op.bytes : op.bus_bytes) / 1e9, op.bound, ms(op.seconds),
               share_pct(op.seconds, row.price.compute + row.price.comm_busy), flag ? "  !" : "");
  }
  if (top > 0 && static_cast<int>(row.price.ops.size()) > top)
    fmt::print(out, "({} more operations: --json lists them all)\n", row.price.ops.size() - static_cast<size_t>(top));
  if (flagged)
    fmt::print(out,
               "!: launches that move {:.0f} MB or more on fewer blocks than the device's {} SMs (the idle SMs' "
               "bandwidth is lost)\n",
               d.underfill_bytes / 1e6, d.sms);
}

}  // namespace

void print_time_report(const TimeReport& r, std::FILE* out, int top) {
  fmt::print(out, "Predicted step time: {} on {} rank{}, micro-batch {} x {} tokens, {} micro-step{}, as {} runs it\n",
             r.model, r.world, r.world == 1 ? "" : "s", r.micro_batch, r.seq, r.accum, r.accum == 1 ? "" : "s",
             device_name(r.target));
  fmt::print(out, "{}", r.device.describe());
  bool pipelined = false;
  for (const TimeRow& row : r.rows) pipelined |= row.bubble_s > 0;
  fmt::print(out, "\n{:<22} {:>10} {:>9} {:>9} {:>9} {:>9}{} {:>9} {:>10} {:>9} {:>6}\n", "strategy", "step ms",
             "compute", "exp.comm", "launchgap", "hostwait", pipelined ? fmt::format(" {:>9}", "bubble") : "",
             "launches", "syncs mid", "GB nonGEMM", "MFU");
  for (const TimeRow& row : r.rows) {
    const StepPrice& p = row.price;
    fmt::print(out, "{:<22} {:>10} {:>9} {:>9} {:>9} {:>9}{} {:>9} {:>10} {:>9.2f} {:>6}\n", row.label,
               ms(row.step_s()), ms(p.compute), ms(p.exposed_comm), ms(p.launch_gaps), ms(p.host_waits),
               pipelined ? fmt::format(" {:>9}", ms(row.bubble_s)) : "", p.launches,
               fmt::format("{}/{}", p.host_syncs_mid_step, p.host_syncs), (p.bytes - p.gemm_bytes) / 1e9,
               fmt::format("{:.1f}%", 100 * r.mfu(row)));
  }
  fmt::print(out,
             "(ms per step of one rank: compute is the compute stream's busy time; the rest is where it sat idle, "
             "held by a collective, by the host issuing launches, or by the host waiting on the device; under --pp "
             "the bubble is what the schedule's simulation adds to the stage's step (the step is the slowest "
             "stage's); syncs mid: "
             "host waits before the step's last kernel / all of them. MFU: the family's model FLOPs over the {} "
             "peak.)\n",
             r.device.tensor_flops.value > 0 ? "tensor-core" : "vector");
  for (const TimeRow& row : r.rows) print_ops(row, r.device, out, top);
}

std::string time_report_json(const TimeReport& r) {
  using nlohmann::json;
  const DeviceModel& d = r.device;
  json dev = {{"name", d.name},
              {"tensor_flops", d.tensor_flops.value},
              {"tensor_flops_from", d.tensor_flops.from},
              {"vector_flops", d.vector_flops.value},
              {"vector_flops_from", d.vector_flops.from},
              {"bandwidth", d.bandwidth.value},
              {"bandwidth_from", d.bandwidth.from},
              {"sms", d.sms},
              {"gemm", d.gemm},
              {"knee", d.knee},
              {"memory", d.memory},
              {"launch_s", d.launch_s},
              {"kernel_floor_s", d.kernel_floor_s},
              {"link", d.link.value},
              {"link_from", d.link.from},
              {"inter_node_link", d.inter.value},
              {"inter_node_link_from", d.inter.from},
              {"ranks_per_node", d.ranks_per_node},
              {"link_latency_s", d.link_latency_s}};
  json shares = json::object();
  for (const auto& [op, share] : d.op_share) shares[op] = {{"share", share.value}, {"from", share.from}};
  dev["op_shares"] = std::move(shares);
  json rows = json::array();
  for (const TimeRow& row : r.rows) {
    const StepPrice& p = row.price;
    json ops = json::array();
    for (const PricedOp& op : p.ops)
      ops.push_back({{"name", op.name},
                     {"axis", op.axis},
                     {"calls", op.calls},
                     {"launches", op.launches},
                     {"blocks", op.blocks},
                     {"underfilled_calls", op.underfilled},
                     {"flops", op.flops},
                     {"tensor_flops", op.tensor_flops},
                     {"bytes", op.bytes},
                     {"bus_bytes", op.bus_bytes},
                     {"host_syncs", op.host_syncs},
                     {"bound", op.bound},
                     {"predicted_s", op.seconds}});
    rows.push_back({{"label", row.label},
                    {"strategy", strategy_name(row.kind)},
                    {"rank", row.rank},
                    {"step_s", row.step_s()},
                    {"split", {{"compute_s", p.compute},
                               {"exposed_comm_s", p.exposed_comm},
                               {"launch_gaps_s", p.launch_gaps},
                               {"host_waits_s", p.host_waits},
                               {"bubble_s", row.bubble_s}}},
                    {"comm_busy_s", p.comm_busy},
                    {"launches", p.launches},
                    {"host_syncs", p.host_syncs},
                    {"host_syncs_mid_step", p.host_syncs_mid_step},
                    {"flops", p.flops},
                    {"tensor_flops", p.tensor_flops},
                    {"bytes", p.bytes},
                    {"non_gemm_bytes", p.bytes - p.gemm_bytes},
                    {"bus_bytes", p.bus_bytes},
                    {"tokens", r.tokens},
                    {"model_flops", r.model_flops},
                    {"mfu", r.mfu(row)},
                    {"ops", std::move(ops)}});
  }
  json doc = {{"schema", "shardlab.profile_time/1"},
              {"model", r.model},
              {"world", r.world},
              {"micro_batch", r.micro_batch},
              {"seq", r.seq},
              {"accum", r.accum},
              {"target", device_name(r.target)},
              {"device", std::move(dev)},
              {"rows", std::move(rows)}};
  return doc.dump(1);
}

}  // namespace shardlab
