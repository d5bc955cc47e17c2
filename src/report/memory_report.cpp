#include "src/report/memory_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "src/core/check.hpp"
#include "src/core/units.hpp"

namespace shardlab {
namespace {

constexpr const char* kShort[kNumCategories] = {"p_shard", "p_full", "g_shard", "g_full", "master",
                                                "optim",   "activ",  "comm",    "work",   "p_second"};
constexpr const char* kColor[kNumCategories] = {"#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#9467bd",
                                                "#c5b0d5", "#2ca02c", "#d62728", "#7f7f7f", "#17becf"};

uint64_t total(const CategoryBytes& c) {
  uint64_t s = 0;
  for (uint64_t b : c) s += b;
  return s;
}

struct SizeUnit {
  double div;
  const char* name;
};
SizeUnit unit_for(uint64_t largest) {
  if (largest >= (10ull << 30)) return {double(1ull << 30), "GiB"};
  if (largest >= (10ull << 20)) return {double(1ull << 20), "MiB"};
  return {1024.0, "KiB"};
}

std::string pct(double a, double b) { return b > 0 ? fmt::format("{:+.1f}%", 100.0 * (a - b) / b) : "-"; }

const MemoryRow* find(const MemoryReport& r, Baseline b, int stage = 0) {
  for (const auto& row : r.rows)
    if (row.baseline == b && row.stage == stage) return &row;
  return nullptr;
}

nlohmann::json cats(const CategoryBytes& c) {
  nlohmann::json o;
  for (int k = 0; k < kNumCategories; ++k) o[std::string(kCategoryNames[k])] = c[k];
  return o;
}

// The host tier's fields beside the device's (schema shardlab.profile/2).
void add_host(nlohmann::json& o, const HostEstimate& h) {
  o["host_model_states"] = cats(h.model_states);
  o["host_at_peak"] = cats(h.at_peak);
  o["host_peak_by_category"] = cats(h.peak_by_category);
  o["host_peak"] = h.peak;
}

std::string esc(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '<') o += "&lt;";
    else if (ch == '>') o += "&gt;";
    else if (ch == '&') o += "&amp;";
    else if (ch == '"') o += "&quot;";
    else o += ch;
  }
  return o;
}

}  // namespace

std::string levers_line(const MemoryReport& r);  // the answer of profile's lever search, in words

void print_memory_table(const MemoryReport& r, std::FILE* out) {
  uint64_t largest = 0;
  for (const auto& row : r.rows) largest = std::max({largest, row.predicted.peak, row.measured_peak});
  SizeUnit u = unit_for(largest);
  auto label = [&](const Phase& p) { return phase_label(p, r.unit_names); };
  std::fprintf(out, "%s\n", r.title.c_str());
  for (const std::string& n : r.notes) std::fprintf(out, "%s\n", n.c_str());
  std::fprintf(out, "per rank, composition at the step's peak (%s)\n", u.name);
  std::fprintf(out, "%-19s %-5s", "strategy", "");
  for (int k = 0; k < kNumCategories; ++k) std::fprintf(out, " %8s", kShort[k]);
  std::fprintf(out, " %9s %9s %9s %7s %7s %9s %9s", "peak", "states", "val peak", "vs ddp", "vs dp", "host pk",
               "host st");
  if (r.budget) std::fprintf(out, " %5s %7s", "fits", "max mb");
  std::fprintf(out, "  peak during\n");
  auto line = [&](const std::string& name, const char* kind, const CategoryBytes& c, uint64_t peak, uint64_t states,
                  const HostEstimate& host, const Phase& phase, const MemoryRow* row, int stage) {
    const MemoryRow* ddp = find(r, Baseline::ddp, stage);
    const MemoryRow* dp0 = find(r, Baseline::dp, stage);
    std::fprintf(out, "%-19s %-5s", name.c_str(), kind);
    for (int k = 0; k < kNumCategories; ++k) std::fprintf(out, " %8.2f", double(c[k]) / u.div);
    std::fprintf(out, " %9.2f %9.2f %9s %7s %7s", double(peak) / u.div, double(states) / u.div,
                 row && row->predicted_eval_peak ? fmt::format("{:.2f}", double(row->predicted_eval_peak) / u.div).c_str()
                                                 : "",
                 ddp ? pct(double(peak), double(ddp->predicted.peak)).c_str() : "-",
                 dp0 ? pct(double(peak), double(dp0->predicted.peak)).c_str() : "-");
    std::fprintf(out, " %9.2f %9.2f", double(host.peak) / u.div, double(total(host.model_states)) / u.div);
    if (r.budget && row)
      std::fprintf(out, " %5s %7lld", row->fits ? "yes" : "NO", static_cast<long long>(row->max_micro_batch));
    else if (r.budget)
      std::fprintf(out, " %5s %7s", "", "");
    std::fprintf(out, "  %s\n", label(phase).c_str());
  };
  for (const auto& row : r.rows) {
    line(row.label, "pred", row.predicted.at_peak, row.predicted.peak, row.predicted.model_state_total(),
         row.predicted.host, row.predicted.peak_phase, &row, row.stage);
    if (!row.measured) continue;
    line("", "meas", row.measured_at_peak, row.measured_peak, total(row.measured_states), row.measured_host,
         row.measured_phase, nullptr, row.stage);
    std::fprintf(out, "%-19s %-5s", "", "diff");
    for (int k = 0; k < kNumCategories; ++k)
      std::fprintf(out, " %8s",
                   row.measured_at_peak[k] || row.predicted.at_peak[k]
                       ? pct(double(row.predicted.at_peak[k]), double(row.measured_at_peak[k])).c_str()
                       : "");
    std::fprintf(out, " %9s %9s\n", pct(double(row.predicted.peak), double(row.measured_peak)).c_str(),
                 pct(double(row.predicted.model_state_total()), double(total(row.measured_states))).c_str());
  }
  std::fprintf(out,
               "columns: p_shard/p_full parameters (sharded / gathered or replicated), g_shard/g_full gradients, "
               "master fp32 master weights,\noptim optimizer state, activ activations, comm communication buffers, "
               "work workspaces, p_second ZeRO++'s secondary shard (hpZ). states: parameters, gradients,\nmaster weights and optimizer state held between "
               "steps. val peak: a validation pass (forward only). vs ddp / vs dp: peak against DDP's and DP's rank 0 "
               "(predicted).\nhost pk / host st: the host tier's peak and model states (--offload); the other "
               "columns are the device tier.%s\n",
               r.budget ? fmt::format(" fits: predicted peaks within the {} budget{}; max mb: the largest "
                                      "micro-batch that fits.", format_bytes(double(r.budget)),
                                      r.host_budget ? " and the host's " + format_bytes(double(r.host_budget)) : "")
                              .c_str()
                        : "");
  if (r.levers_searched) std::fprintf(out, "%s\n", levers_line(r).c_str());
  if (r.outside_pool)
    std::fprintf(out, "outside the pool (rank 0's device, measured: CUDA context, cuBLAS workspace, NCCL buffers; "
                 "with ranks sharing a GPU, theirs too): %s\n", format_bytes(double(r.outside_pool)).c_str());
  std::fflush(out);
}

std::string levers_line(const MemoryReport& r) {
  std::string budgets = format_bytes(double(r.budget)) +
                        (r.host_budget ? ", host " + format_bytes(double(r.host_budget)) : std::string(", host unlimited"));
  if (!r.levers)
    return fmt::format("cheapest levers: nothing fits (device {}) at any micro-batch, with any strategy, "
                       "checkpointing or offload", budgets);
  const LeverChoice& c = *r.levers;
  return fmt::format("cheapest levers that fit (device {}): {}, activation checkpointing {}, offload {}, micro-batch "
                     "{} x accum {}: device peak {}, host peak {}\n  (tried cheapest first: shard more, ddp -> zero1 "
                     "-> zero2 -> zero3; then checkpoint attention, then blocks; then offload the optimizer, then "
                     "the parameters; a smaller micro-batch only when nothing fits at --micro-batch)",
                     budgets, c.strategy, c.checkpointing, c.offload, c.micro_batch, c.accum,
                     format_bytes(double(c.peak)), format_bytes(double(c.host_peak)));
}

std::string memory_report_json(const MemoryReport& r) {
  auto label = [&](const Phase& p) { return phase_label(p, r.unit_names); };
  nlohmann::json j;
  j["schema"] = "shardlab.profile/2";
  j["title"] = r.title;
  if (!r.notes.empty()) j["notes"] = r.notes;
  j["config"] = r.config_json.empty() ? nlohmann::json::object() : nlohmann::json::parse(r.config_json);
  j["budget_bytes"] = r.budget;
  j["host_budget_bytes"] = r.host_budget;
  j["outside_pool_bytes"] = r.outside_pool;
  if (r.levers_searched) {
    if (r.levers)
      j["cheapest_levers"] = {{"strategy", r.levers->strategy}, {"activation_checkpointing", r.levers->checkpointing},
                              {"offload", r.levers->offload}, {"micro_batch", r.levers->micro_batch},
                              {"accum", r.levers->accum}, {"peak", r.levers->peak},
                              {"host_peak", r.levers->host_peak}};
    else
      j["cheapest_levers"] = nullptr;
  }
  j["categories"] = std::vector<std::string>(kCategoryNames.begin(), kCategoryNames.end());
  j["rows"] = nlohmann::json::array();
  for (const auto& row : r.rows) {
    nlohmann::json o;
    o["label"] = row.label;
    const Estimate& e = row.predicted;
    nlohmann::json tl = nlohmann::json::array();
    for (const auto& p : e.timeline)
      tl.push_back({{"phase", label(p.phase)}, {"total", total(p.live)}, {"by_category", cats(p.live)},
                    {"host_total", total(p.host_live)}});
    o["predicted"] = {{"model_states", cats(e.model_states)}, {"at_peak", cats(e.at_peak)},
                      {"peak_by_category", cats(e.peak_by_category)}, {"peak", e.peak},
                      {"peak_phase", label(e.peak_phase)}, {"eval_peak", row.predicted_eval_peak}};
    add_host(o["predicted"], e.host);
    o["predicted"]["timeline"] = tl;
    if (row.measured) {
      nlohmann::json mt = nlohmann::json::array();
      for (const auto& ev : row.measured_timeline)
        mt.push_back({{"t_ms", ev.t_ms}, {"tier", std::string(tier_name(ev.tier))},
                      {"category", std::string(category_name(ev.category))}, {"delta", ev.delta},
                      {"total", ev.total_after}, {"tag", ev.tag}, {"phase", label(ev.phase)}});
      o["measured"] = {{"model_states", cats(row.measured_states)}, {"at_peak", cats(row.measured_at_peak)},
                       {"peak_by_category", cats(row.measured_peak_by_category)}, {"peak", row.measured_peak},
                       {"peak_phase", label(row.measured_phase)}, {"comm_bytes_per_step", row.comm_bytes}};
      add_host(o["measured"], row.measured_host);
      o["measured"]["timeline"] = mt;
    } else {
      o["measured"] = nullptr;
    }
    o["fits"] = row.fits;
    o["max_micro_batch"] = row.max_micro_batch;
    j["rows"].push_back(o);
  }
  return j.dump(1);
}

namespace {

// Horizontal stacked bars: one per row (predicted; measured beneath when present).
std::string bars_svg(const MemoryReport& r, const SizeUnit& u, uint64_t largest) {
  const int label_w = 150, bar_w = 620, bar_h = 18, gap = 8;
  int bars = 0;
  for (const auto& row : r.rows) bars += row.measured ? 2 : 1;
  const int h = 40 + bars * (bar_h + gap) + 56;
  std::string s = fmt::format("<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' font-family='sans-serif' font-size='12'>\n",
                              label_w + bar_w + 120, h);
  double scale = largest ? double(bar_w) / double(largest) : 0;
  int y = 30;
  auto bar = [&](const std::string& label, const CategoryBytes& c, uint64_t peak) {
    s += fmt::format("<text x='{}' y='{}' text-anchor='end'>{}</text>\n", label_w - 8, y + 13, esc(label));
    double x = label_w;
    for (int k = 0; k < kNumCategories; ++k) {
      double w = double(c[k]) * scale;
      if (w <= 0) continue;
      s += fmt::format("<rect x='{:.1f}' y='{}' width='{:.1f}' height='{}' fill='{}'><title>{}: {}</title></rect>\n", x,
                       y, w, bar_h, kColor[k], kCategoryNames[k], format_bytes(double(c[k])));
      x += w;
    }
    s += fmt::format("<text x='{:.1f}' y='{}'>{:.2f} {}</text>\n", x + 6, y + 13, double(peak) / u.div, u.name);
    y += bar_h + gap;
  };
  for (const auto& row : r.rows) {
    bar(row.label + (row.measured ? " (pred)" : ""), row.predicted.at_peak, row.predicted.peak);
    if (row.measured) bar(row.label + " (meas)", row.measured_at_peak, row.measured_peak);
  }
  if (r.budget && r.budget <= largest * 2) {
    double bx = label_w + double(r.budget) * scale;
    if (bx <= label_w + bar_w + 100)
      s += fmt::format("<line x1='{:.1f}' y1='20' x2='{:.1f}' y2='{}' stroke='black' stroke-dasharray='4 3'/>"
                       "<text x='{:.1f}' y='14' text-anchor='middle'>budget {}</text>\n",
                       bx, bx, y, bx, format_bytes(double(r.budget)));
  }
  int lx = label_w, ly = y + 8;
  for (int k = 0; k < kNumCategories; ++k) {
    int w = 14 + 7 * static_cast<int>(kCategoryNames[k].size()) + 10;
    if (lx + w > label_w + bar_w + 110) lx = label_w, ly += 16;  // wrap the legend
    s += fmt::format("<rect x='{}' y='{}' width='10' height='10' fill='{}'/><text x='{}' y='{}'>{}</text>\n", lx, ly,
                     kColor[k], lx + 13, ly + 9, kCategoryNames[k]);
    lx += w;
  }
  return s + "</svg>\n";
}

// Memory over one step: stacked areas by category along the step's allocations, with the phases
// (forward, loss, backward, optimizer) shaded and each unit's start ticked.
std::string timeline_svg(const MemoryRow& row, const SizeUnit& u, const std::vector<std::string>& unit_names) {
  const auto& tl = row.predicted.timeline;
  const int w = 760, h = 220, left = 60, top = 20, plot_w = w - left - 20, plot_h = h - top - 40;
  std::string s = fmt::format("<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' font-family='sans-serif' font-size='11'>\n", w, h);
  if (tl.size() < 2) return s + "</svg>\n";
  uint64_t top_val = 0;
  for (const auto& p : tl) top_val = std::max(top_val, total(p.live));
  auto X = [&](size_t i) { return left + plot_w * double(i) / double(tl.size() - 1); };
  auto Y = [&](double v) { return top + plot_h - plot_h * v / double(std::max<uint64_t>(1, top_val)); };
  // Phase bands.
  auto kind = [](const Phase& p) {
    switch (p.kind) {
      case PhaseKind::forward: return 0;
      case PhaseKind::loss: return 1;
      case PhaseKind::backward: return 2;
      case PhaseKind::weight: return 2;  // a split backward's W pass
      case PhaseKind::optimizer: return 3;
      default: return 4;  // begin step (DP's broadcast copies) and idle
    }
  };
  const char* band_color[5] = {"#eef5ff", "#fff5e6", "#f0fff0", "#f7f0ff", "#f4f4f4"};
  const char* band_name[5] = {"forward", "loss", "backward", "optimizer", "begin"};
  size_t start = 0;
  std::string band_labels;  // drawn over the areas, which would hide them at the peak
  for (size_t i = 1; i <= tl.size(); ++i) {
    if (i < tl.size() && kind(tl[i].phase) == kind(tl[start].phase)) continue;
    int k = kind(tl[start].phase);
    // A band's name only where it fits inside the band (about 6.5 px a character at 11 px): narrow
    // bands (loss, a short optimizer step) would print over their neighbour or past the edge.
    const double band_w = std::max(1.0, X(i - 1) - X(start));
    s += fmt::format("<rect x='{:.1f}' y='{}' width='{:.1f}' height='{}' fill='{}'><title>{}</title></rect>\n", X(start),
                     top, band_w, plot_h, band_color[k], band_name[k]);
    if (band_w >= 6 + 6.5 * double(std::strlen(band_name[k])))
      band_labels += fmt::format("<text x='{:.1f}' y='{}' fill='#333' stroke='white' stroke-width='3' "
                                 "paint-order='stroke'>{}</text>\n", X(start) + 3, top + 12, band_name[k]);
    start = i;
  }
  for (size_t i = 1; i < tl.size(); ++i)  // a tick where each unit starts
    if (tl[i].phase != tl[i - 1].phase)
      s += fmt::format("<line x1='{:.1f}' y1='{}' x2='{:.1f}' y2='{}' stroke='#bbb'><title>{}</title></line>\n", X(i),
                       top + plot_h, X(i), top + plot_h + 5, esc(phase_label(tl[i].phase, unit_names)));
  // Stacked areas, bottom category first.
  std::vector<double> base(tl.size(), 0.0);
  for (int k = 0; k < kNumCategories; ++k) {
    bool any = false;
    for (const auto& p : tl) any |= p.live[k] > 0;
    if (!any) continue;
    std::string pts;
    for (size_t i = 0; i < tl.size(); ++i) pts += fmt::format("{:.1f},{:.1f} ", X(i), Y(base[i] + double(tl[i].live[k])));
    for (size_t i = tl.size(); i-- > 0;) pts += fmt::format("{:.1f},{:.1f} ", X(i), Y(base[i]));
    s += fmt::format("<polygon points='{}' fill='{}' fill-opacity='0.85'><title>{}</title></polygon>\n", pts, kColor[k],
                     kCategoryNames[k]);
    for (size_t i = 0; i < tl.size(); ++i) base[i] += double(tl[i].live[k]);
  }
  s += band_labels;
  s += fmt::format("<line x1='{}' y1='{}' x2='{}' y2='{}' stroke='black'/>", left, top + plot_h, left + plot_w, top + plot_h);
  s += fmt::format("<line x1='{}' y1='{}' x2='{}' y2='{}' stroke='black'/>", left, top, left, top + plot_h);
  for (int t = 0; t <= 4; ++t) {
    double v = double(top_val) * t / 4;
    s += fmt::format("<text x='{}' y='{:.1f}' text-anchor='end'>{:.1f}</text>\n", left - 4, Y(v) + 4, v / u.div);
  }
  s += fmt::format("<text x='{}' y='{}'>{}</text><text x='{}' y='{}' text-anchor='middle'>allocations and frees of "
                   "one step, in order (peak {:.2f} {} during {})</text>\n",
                   4, top - 8, u.name, left + plot_w / 2, h - 8, double(row.predicted.peak) / u.div, u.name,
                   esc(phase_label(row.predicted.peak_phase, unit_names)));
  return s + "</svg>\n";
}

}  // namespace

std::string memory_report_sections(const MemoryReport& r) {
  uint64_t largest = r.budget;
  for (const auto& row : r.rows) largest = std::max({largest, row.predicted.peak, row.measured_peak});
  uint64_t bar_max = 0;
  for (const auto& row : r.rows) bar_max = std::max({bar_max, row.predicted.peak, row.measured_peak});
  SizeUnit u = unit_for(largest);
  std::string h = fmt::format("<h2>Per rank at the step's peak ({})</h2>\n<table><tr><th>strategy</th><th></th>", u.name);
  for (int k = 0; k < kNumCategories; ++k) h += "<th>" + std::string(kCategoryNames[k]) + "</th>";
  h += "<th>peak</th><th>model states</th><th>host peak</th><th>host model states</th><th>peak during</th></tr>\n";
  auto tr = [&](const std::string& label, const char* kind, const CategoryBytes& c, uint64_t peak, uint64_t states,
                const HostEstimate& host, const Phase& phase) {
    h += "<tr><td>" + esc(label) + "</td><td>" + kind + "</td>";
    for (int k = 0; k < kNumCategories; ++k) h += fmt::format("<td>{:.2f}</td>", double(c[k]) / u.div);
    h += fmt::format("<td><b>{:.2f}</b></td><td>{:.2f}</td><td>{:.2f}</td><td>{:.2f}</td><td>{}</td></tr>\n",
                     double(peak) / u.div, double(states) / u.div, double(host.peak) / u.div,
                     double(total(host.model_states)) / u.div, esc(phase_label(phase, r.unit_names)));
  };
  for (const auto& row : r.rows) {
    tr(row.label, "predicted", row.predicted.at_peak, row.predicted.peak, row.predicted.model_state_total(),
       row.predicted.host, row.predicted.peak_phase);
    if (row.measured)
      tr(row.label, "measured", row.measured_at_peak, row.measured_peak, total(row.measured_states), row.measured_host,
         row.measured_phase);
  }
  h += "</table>\n";
  if (r.levers_searched) h += "<p>" + esc(levers_line(r)) + "</p>\n";
  h += "<h2>Memory per rank by category</h2>\n" + bars_svg(r, u, bar_max);
  h += "<h2>Memory over one training step (predicted)</h2>\n";
  for (const auto& row : r.rows) h += "<h3>" + esc(row.label) + "</h3>\n" + timeline_svg(row, u, r.unit_names);
  return h;
}

std::string html_page_start(const std::string& title) {
  return "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>" + esc(title) +
         "</title>\n<style>body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;"
         "font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
         "th{background:#f3f3f3}td:first-child{text-align:left}h2{margin-top:28px}</style></head><body>\n";
}

std::string memory_report_html(const MemoryReport& r) {
  std::string h = html_page_start("shardlab memory profile");
  h += "<h1>shardlab memory profile</h1>\n<p>" + esc(r.title) + "</p>\n";
  for (const std::string& n : r.notes) h += "<p>" + esc(n) + "</p>\n";
  h += memory_report_sections(r);
  h += "<p style='color:#666;font-size:11px'>Written by shardlab profile. Self-contained: no scripts, no network.</p>\n";
  return h + "</body></html>\n";
}

std::string html_escape(const std::string& s) { return esc(s); }

void append_trace_events(std::string& out, int pid, const std::string& name, const std::vector<LedgerEvent>& events,
                         const TierBytes& base, const std::vector<TraceMark>& marks,
                         const std::vector<std::string>& unit_names, std::optional<double> val_loss,
                         const std::vector<TraceSpan>& spans) {
  auto add = [&](const nlohmann::json& e) {
    if (!out.empty()) out += ",\n";
    out += e.dump();
  };
  add({{"ph", "M"}, {"pid", pid}, {"name", "process_name"}, {"args", {{"name", name}}}});
  add({{"ph", "M"}, {"pid", pid}, {"tid", 1}, {"name", "thread_name"}, {"args", {{"name", "compute phases"}}}});
  add({{"ph", "M"}, {"pid", pid}, {"tid", 2}, {"name", "thread_name"}, {"args", {{"name", "collectives (issued)"}}}});
  if (!spans.empty())
    add({{"ph", "M"}, {"pid", pid}, {"tid", 3}, {"name", "thread_name"}, {"args", {{"name", "pipeline actions"}}}});
  if (events.empty()) return;
  double t0 = events.front().t_ms;
  for (const auto& m : marks) t0 = std::min(t0, m.t_ms);
  for (const auto& s : spans) t0 = std::min(t0, s.t_ms);
  for (const auto& s : spans)
    add({{"ph", "X"}, {"pid", pid}, {"tid", 3}, {"name", s.name}, {"ts", (s.t_ms - t0) * 1000.0},
         {"dur", s.dur_ms * 1000.0}});
  for (const auto& m : marks)
    add({{"ph", "i"}, {"pid", pid}, {"tid", 2}, {"s", "t"}, {"name", m.name}, {"ts", (m.t_ms - t0) * 1000.0},
         {"args", {{"bus_bytes", m.bytes}}}});
  TierBytes live = base;
  size_t phase_start = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    const LedgerEvent& e = events[i];
    CategoryBytes& l = live[static_cast<int>(e.tier)];
    int k = static_cast<int>(e.category);
    l[k] = static_cast<uint64_t>(static_cast<int64_t>(l[k]) + e.delta);
    nlohmann::json args;
    for (int c = 0; c < kNumCategories; ++c) args[std::string(kCategoryNames[c])] = l[c];
    add({{"ph", "C"}, {"pid", pid},
         {"name", e.tier == Tier::device ? "memory (bytes by category)" : "host memory (bytes by category)"},
         {"ts", (e.t_ms - t0) * 1000.0}, {"args", args}});
    bool last = i + 1 == events.size();
    if (last || events[i + 1].phase != events[phase_start].phase) {
      double end = last ? e.t_ms : events[i + 1].t_ms;
      if (events[phase_start].phase.kind != PhaseKind::idle)
        add({{"ph", "X"}, {"pid", pid}, {"tid", 1}, {"name", phase_label(events[phase_start].phase, unit_names)},
             {"ts", (events[phase_start].t_ms - t0) * 1000.0},
             {"dur", std::max(1.0, (end - events[phase_start].t_ms) * 1000.0)}});
      phase_start = i + 1;
    }
  }
  if (val_loss)  // a counter at the end of the step: the validation loss measured after it
    add({{"ph", "C"}, {"pid", pid}, {"name", "validation loss"}, {"ts", (events.back().t_ms - t0) * 1000.0},
         {"args", {{"val_loss", *val_loss}}}});
}

std::string memory_trace_json(const MemoryReport& r) {
  std::string events;
  int pid = 0;
  for (const auto& row : r.rows)
    if (row.measured && !row.measured_timeline.empty())
      append_trace_events(events, pid++, row.label, row.measured_timeline,
                          {row.measured_states, row.measured_host.model_states}, row.measured_comm, r.unit_names);
  return chrome_trace_document(events);
}

std::string chrome_trace_document(const std::string& events) {
  return "{\"traceEvents\": [\n" + events + "\n], \"displayTimeUnit\": \"ms\"}\n";
}

}  // namespace shardlab
