// plan_report.cpp — plan's JSON and HTML (plan_report.hpp).
#include "src/report/plan_report.hpp"

#include <nlohmann/json.hpp>

#include "src/core/units.hpp"

namespace shardlab {

namespace {

nlohmann::json split_json(const TimeSplit& s) {
  nlohmann::json j = {{"compute_ms", s.compute * 1e3},   {"recompute_ms", s.recompute * 1e3},
                      {"bubble_ms", s.bubble * 1e3},     {"pp_p2p_ms", s.pp_p2p * 1e3},
                      {"offload_ms", s.offload * 1e3},   {"optimizer_ms", s.optimizer * 1e3}};
  for (const auto& [axis, sec] : s.exposed) j[fmt::format("exposed_{}_ms", comm_axis_name(axis))] = sec * 1e3;
  return j;
}

// A part of the split, in seconds: a field, or an axis's exposed communication (the chart's bars).
template <double TimeSplit::*F>
double part(const TimeSplit& s) {
  return s.*F;
}
template <CommAxis A>
double exposed(const TimeSplit& s) {
  return s.exposed_on(A);
}

nlohmann::json rate_json(const Rate& r) { return {{"value", r.value}, {"from", r.from}}; }

}  // namespace

std::string plan_json(const PlanConfig& c, const PlanResult& res) {
  nlohmann::json j;
  j["schema"] = "shardlab.plan/2";
  j["config"] = {{"model", spec_to_json(c.train.spec)},
                 {"world", c.world},
                 {"ranks_per_node", c.ranks_per_node},
                 {"device_memory_bytes", c.device_memory},
                 {"host_memory_bytes", c.host_memory},
                 {"global_batch", c.batch()},
                 {"param_dtype", dtype_name(c.train.strategy.precision.param_dtype)},
                 {"reduce_dtype", dtype_name(c.train.strategy.precision.reduce_dtype)}};
  const PlanRates& r = c.rates;
  const Achievable& a = r.achievable;
  j["rates"] = {{"source", r.source},
                {"peak_flops", rate_json(r.device.flops)},
                {"hbm_bytes_per_s", rate_json(r.device.hbm)},
                {"intra_node_bytes_per_s", rate_json(r.device.intra)},
                {"inter_node_bytes_per_s", rate_json(r.device.inter)},
                {"host_link_bytes_per_s", rate_json(r.device.host)},
                {"device_adamw_elements_per_s", rate_json(r.device.adamw)},
                {"host_adamw_elements_per_s", rate_json(r.device.host_adamw)},
                {"sync_wait_s", rate_json(r.device.sync)},
                {"ranks_per_node", r.device.ranks_per_node},
                {"gemm_fraction", a.gemm},
                {"gemm_knee", a.knee},
                {"memory_fraction", a.memory},
                {"intra_fraction", a.intra},
                {"inter_fraction", a.inter},
                {"whole_step", a.whole_step},
                {"dp_overlap", r.dp_overlap},
                {"flash_attention", r.flash_attention}};
  j["search"] = {{"candidates", res.candidates},           {"walked", res.walked},
                 {"memory_predictions", res.predictions},  {"ruled_by_bound", res.ruled_by_bound},
                 {"ruled_by_micro_batch", res.ruled_by_micro_batch}, {"not_runnable", res.not_runnable},
                 {"seconds", res.seconds}};
  j["configs"] = nlohmann::json::array();
  for (const auto& e : res.entries) {
    const ParallelDims& d = e.layout.dims;
    nlohmann::json o = {{"strategy", strategy_name(e.strategy.kind)},
                        {"tp", d.tp},
                        {"pp", d.pp},
                        {"pp_virtual", e.layout.pipeline.virtual_stages},
                        {"pp_schedule", e.layout.pipeline.schedule.name()},
                        {"sequence_parallel", e.layout.sequence_parallel},
                        {"dp_shard", d.dp_shard},
                        {"dp_replicate", d.dp_replicate},
                        {"activation_checkpointing", checkpointing_name(e.checkpointing)},
                        {"offload", offload_name(e.strategy.offload)},
                        {"micro_batch", e.micro_batch},
                        {"accum", e.accum},
                        {"fits", e.fits},
                        {"memory_predicted", e.predicted},
                        {"predicted_peak_bytes", e.predicted ? nlohmann::json(e.peak) : nlohmann::json(nullptr)},
                        {"predicted_peak_stage", e.peak_stage},
                        {"predicted_host_peak_bytes", e.predicted ? nlohmann::json(e.host_peak) : nlohmann::json(nullptr)},
                        {"predicted_step_ms", e.step_ms()},
                        {"predicted_tokens_per_s", e.time.tokens_per_s},
                        {"predicted_tflops_per_device", e.time.model_tflops_per_device},
                        {"predicted_hardware_tflops_per_device", e.time.hardware_tflops_per_device},
                        {"predicted_mfu", e.time.mfu},
                        {"time_split", split_json(e.time.split)},
                        {"measured_step_ms", nullptr},
                        {"measured_peak_bytes", nullptr}};
    if (e.measured_step_ms) o["measured_step_ms"] = *e.measured_step_ms;
    if (e.ledger_step_ms) o["ledger_step_ms"] = *e.ledger_step_ms;
    if (!e.ledger_top_op.empty()) o["ledger_top_op"] = e.ledger_top_op;
    if (e.measured_peak) o["measured_peak_bytes"] = *e.measured_peak;
    if (!e.fits) o["why"] = e.why;
    j["configs"].push_back(o);
  }
  return j.dump(1);
}

std::string plan_html(const PlanConfig& c, const PlanResult& res) {
  auto esc = [](const std::string& s) {
    std::string o;
    for (char ch : s) o += ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '&' ? "&amp;" : std::string(1, ch);
    return o;
  };
  struct Part {
    const char* name;
    const char* color;
    double (*seconds)(const TimeSplit&);
  };
  static const Part parts[] = {{"compute", "#4e79a7", part<&TimeSplit::compute>},
                               {"recompute", "#a0cbe8", part<&TimeSplit::recompute>},
                               {"exposed TP", "#f28e2b", exposed<CommAxis::tp>},
                               {"exposed CP", "#ff9da7", exposed<CommAxis::cp>},
                               {"exposed EP", "#9c755f", exposed<CommAxis::ep>},
                               {"exposed DP", "#e15759", exposed<CommAxis::dp>},
                               {"bubble", "#bab0ac", part<&TimeSplit::bubble>},
                               {"PP sends", "#59a14f", part<&TimeSplit::pp_p2p>},
                               {"offload", "#b07aa1", part<&TimeSplit::offload>},
                               {"optimizer", "#edc948", part<&TimeSplit::optimizer>}};
  std::string h = "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>shardlab plan</title><style>"
                  "body{font-family:sans-serif;margin:24px}table{border-collapse:collapse;font-size:12px}"
                  "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#f3f3f3}"
                  "td.l{text-align:left}tr.no{color:#999}.bar{display:flex;height:12px;width:320px}"
                  ".bar div{height:12px}.key span{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px}"
                  "pre{font-size:11px}</style></head><body>\n<h1>shardlab plan</h1>\n";
  h += fmt::format("<p>{}, {} ranks ({} per node), global batch {} x {} tokens, device {} per rank, host {}</p>\n",
                   esc(c.train.spec.describe()), c.world, c.ranks_per_node, c.batch(), c.train.spec.seq,
                   format_bytes(double(c.device_memory)), c.host_memory ? format_bytes(double(c.host_memory)) : "unlimited");
  h += "<pre>" + esc(c.rates.describe()) + "</pre>\n";
  h += fmt::format("<p>Search: {} layouts timed, {} walked, {} memory predictions, {:.2f} s.</p>\n<p class='key'>",
                   res.candidates, res.walked, res.predictions, res.seconds);
  for (const Part& p : parts) h += fmt::format("<span style='background:{}'></span>{}", p.color, p.name);
  h += "</p>\n<table><tr><th>#</th><th>layout</th><th>checkpointing</th><th>micro-batch x accum</th><th>peak (stage)</th>"
       "<th>host peak</th><th>step ms</th><th>tokens/s</th><th>TFLOP/s</th><th>MFU</th><th>time split</th>"
       "<th>measured ms</th><th>measured peak</th><th>fits</th></tr>\n";
  double longest = 0;
  size_t shown_no = 0;
  for (const auto& e : res.entries)
    if (e.fits || ++shown_no <= 10) longest = std::max(longest, e.step_ms());
  shown_no = 0;
  for (size_t i = 0; i < res.entries.size(); ++i) {
    const PlanEntry& e = res.entries[i];
    if (!e.fits && ++shown_no > 10) break;
    std::string bar = "<div class='bar'>";
    for (const Part& p : parts) {
      const double ms = p.seconds(e.time.split) * 1e3;
      if (ms > 0 && longest > 0)
        bar += fmt::format("<div title='{} {:.1f} ms' style='width:{:.2f}%;background:{}'></div>", p.name, ms,
                           100 * ms / longest, p.color);
    }
    bar += "</div>";
    h += fmt::format("<tr{}><td>{}</td><td class='l'>{}</td><td class='l'>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                     "<td><b>{:.1f}</b></td><td>{:.0f}</td><td>{:.1f}</td><td>{:.0f}%</td><td>{}</td><td>{}</td><td>{}</td>"
                     "<td class='l'>{}</td></tr>\n",
                     e.fits ? "" : " class='no'", i + 1, esc(e.label()), checkpointing_name(e.checkpointing),
                     mb_text(e), esc(e.peak_text()), e.predicted ? format_bytes(double(e.host_peak)) : "-", e.step_ms(),
                     e.time.tokens_per_s, e.time.model_tflops_per_device, 100 * e.time.mfu, bar,
                     e.measured_step_ms ? fmt::format("{:.1f}", *e.measured_step_ms) : "",
                     e.measured_peak ? format_bytes(double(*e.measured_peak)) : "", e.fits ? "yes" : esc(e.why));
  }
  return h + "</table>\n<p style='color:#666;font-size:11px'>Written by shardlab plan. The memory is the "
             "estimator's (exact); the time is a model (docs/planning.md).</p>\n</body></html>\n";
}

}  // namespace shardlab
