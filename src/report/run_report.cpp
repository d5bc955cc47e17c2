#include "src/report/memory_report.hpp"
#include "src/report/run_report.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "src/core/check.hpp"
#include "src/core/units.hpp"

namespace shardlab {
namespace {

// ---- line charts ------------------------------------------------------------------------------

const char* const kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

struct Line {
  std::string label;
  std::vector<double> x, y;
  const char* color;
  bool dashed = false;  // validation: dashed, with a dot at each point
};

// A step axis's tick spacing: 1, 2 or 5 times a power of ten, at most about 8 ticks.
double tick_spacing(double span) {
  const double raw = std::max(span / 8, 1.0);
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

// Lines over the steps, y from `from_zero` ? 0 : the smallest value; the legend wraps below the
// plot, so no label is drawn over another or past the picture's edge.
std::string line_chart(const std::vector<Line>& lines, const std::string& y_title, bool from_zero,
                       const std::function<std::string(double)>& fmt_y) {
  const int w = 760, left = 78, right = 20, top = 24, plot_h = 180, plot_w = w - left - right;
  double x0 = INFINITY, x1 = -INFINITY, y0 = from_zero ? 0 : INFINITY, y1 = -INFINITY;
  for (const Line& l : lines)
    for (size_t i = 0; i < l.x.size(); ++i) {
      if (!std::isfinite(l.y[i])) continue;
      x0 = std::min(x0, l.x[i]), x1 = std::max(x1, l.x[i]);
      y0 = std::min(y0, l.y[i]), y1 = std::max(y1, l.y[i]);
    }
  if (!std::isfinite(x0)) return "<p>(no finite values)</p>\n";
  if (x1 <= x0) x0 -= 1, x1 += 1;
  if (y1 <= y0) y1 = y0 + std::max(1.0, std::fabs(y0) * 0.1);
  if (!from_zero) y0 -= (y1 - y0) * 0.05;
  y1 += (y1 - y0) * 0.05;
  auto X = [&](double v) { return left + plot_w * (v - x0) / (x1 - x0); };
  auto Y = [&](double v) { return top + plot_h - plot_h * (v - y0) / (y1 - y0); };
  // The legend's rows: items of about 7 px a character, wrapped at the plot's width.
  std::vector<std::pair<int, int>> at;  // x, row of each line's legend item
  int lx = left, row = 0;
  for (const Line& l : lines) {
    const int item = 28 + 7 * static_cast<int>(l.label.size());
    if (lx + item > left + plot_w && lx > left) lx = left, ++row;
    at.emplace_back(lx, row);
    lx += item + 12;
  }
  const int legend_top = top + plot_h + 44, h = legend_top + 16 * (row + 1) + 4;
  std::string s = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' font-family='sans-serif' font-size='11'>\n", w, h);
  for (int t = 0; t <= 4; ++t) {  // y grid and values
    const double v = y0 + (y1 - y0) * t / 4;
    s += fmt::format("<line x1='{}' y1='{:.1f}' x2='{}' y2='{:.1f}' stroke='#eee'/><text x='{}' y='{:.1f}' "
                     "text-anchor='end'>{}</text>\n", left, Y(v), left + plot_w, Y(v), left - 4, Y(v) + 4,
                     html_escape(fmt_y(v)));
  }
  const double dx = tick_spacing(x1 - x0);
  for (double v = std::ceil(x0 / dx) * dx; v <= x1 + 1e-9; v += dx)  // x ticks: the steps
    s += fmt::format("<line x1='{0:.1f}' y1='{1}' x2='{0:.1f}' y2='{2}' stroke='#999'/><text x='{0:.1f}' y='{3}' "
                     "text-anchor='middle'>{4}</text>\n", X(v), top + plot_h, top + plot_h + 4, top + plot_h + 16,
                     static_cast<long long>(std::llround(v)));
  s += fmt::format("<line x1='{0}' y1='{1}' x2='{2}' y2='{1}' stroke='black'/><line x1='{0}' y1='{3}' x2='{0}' "
                   "y2='{1}' stroke='black'/>\n", left, top + plot_h, left + plot_w, top);
  s += fmt::format("<text x='{}' y='{}' text-anchor='middle'>step</text><text x='{}' y='{}'>{}</text>\n",
                   left + plot_w / 2, top + plot_h + 32, 4, top - 10, html_escape(y_title));
  for (size_t k = 0; k < lines.size(); ++k) {
    const Line& l = lines[k];
    std::string pts;
    for (size_t i = 0; i < l.x.size(); ++i)
      if (std::isfinite(l.y[i])) pts += fmt::format("{:.1f},{:.1f} ", X(l.x[i]), Y(l.y[i]));
    s += fmt::format("<polyline points='{}' fill='none' stroke='{}' stroke-width='1.5'{}><title>{}</title></polyline>\n",
                     pts, l.color, l.dashed ? " stroke-dasharray='5 3'" : "", html_escape(l.label));
    if (l.dashed || l.x.size() == 1)
      for (size_t i = 0; i < l.x.size(); ++i)
        if (std::isfinite(l.y[i]))
          s += fmt::format("<circle cx='{:.1f}' cy='{:.1f}' r='2.5' fill='{}'><title>step {}: {}</title></circle>\n",
                           X(l.x[i]), Y(l.y[i]), l.color, static_cast<long long>(l.x[i]), html_escape(fmt_y(l.y[i])));
    const int ly = legend_top + 16 * at[k].second;
    s += fmt::format("<line x1='{0}' y1='{1}' x2='{2}' y2='{1}' stroke='{3}' stroke-width='2'{4}/><text x='{5}' "
                     "y='{6}'>{7}</text>\n", at[k].first, ly - 4, at[k].first + 20, l.color,
                     l.dashed ? " stroke-dasharray='5 3'" : "", at[k].first + 26, ly, html_escape(l.label));
  }
  return s + "</svg>\n";
}

// One line per run of `value` over its steps (a step without a value is left out).
std::vector<Line> per_run(const RunReport& r, const std::function<std::optional<double>(const StepStats&)>& value,
                          const char* suffix = "", bool dashed = false) {
  std::vector<Line> lines;
  for (size_t k = 0; k < r.runs.size(); ++k) {
    Line l{r.runs[k].label + suffix, {}, {}, kPalette[k % std::size(kPalette)], dashed};
    for (const StepStats& s : r.runs[k].steps)
      if (const auto v = value(s)) l.x.push_back(double(s.step)), l.y.push_back(*v);
    if (!l.x.empty()) lines.push_back(std::move(l));
  }
  return lines;
}

std::string bytes_label(double b) { return format_bytes(b); }

}  // namespace

std::string run_report_html(const RunReport& r) {
  std::string h = html_page_start(r.title);
  h += "<h1>shardlab run report</h1>\n<p>" + html_escape(r.title) + "</p>\n";
  for (const std::string& f : r.facts) h += "<p>" + html_escape(f) + "</p>\n";
  auto fixed = [](int digits) { return [digits](double v) { return fmt::format("{:.{}f}", v, digits); }; };
  std::vector<Line> loss = per_run(r, [](const StepStats& s) { return std::optional<double>(s.loss); }, " train");
  bool any_val = false;
  for (Line& l : per_run(r, [](const StepStats& s) { return s.val_loss ? std::optional<double>(*s.val_loss) : std::nullopt; },
                         " validation", true))
    loss.push_back(std::move(l)), any_val = true;
  if (r.runs.size() == 1)
    for (Line& l : loss) l.label = l.label.substr(l.label.rfind(' ') + 1);  // one run: "train", "validation"
  h += std::string("<h2>Loss</h2>\n<p>Training loss of each step") +
       (any_val ? "; validation loss (dashed, dots) where the run validated." : ".") + "</p>\n";
  h += line_chart(loss, "loss", false, fixed(3));
  h += "<h2>Throughput</h2>\n<p>Tokens per second of the whole job, each step (the first warms caches).</p>\n";
  h += line_chart(per_run(r, [](const StepStats& s) { return std::optional<double>(s.tokens_per_s); }), "tokens/s", true,
                  fixed(0));
  h += "<h2>Communication per step</h2>\n<p>Bus bytes each rank moved in the step's collectives (rank 0).</p>\n";
  h += line_chart(per_run(r, [](const StepStats& s) { return std::optional<double>(s.comm_bytes); }), "bus bytes / rank",
                  true, bytes_label);
  h += "<h2>Peak memory per step</h2>\n<p>The device tier's peak of each step on rank 0 (host tier dashed, where "
       "--offload puts state there).</p>\n";
  std::vector<Line> peak = per_run(r, [](const StepStats& s) { return std::optional<double>(double(s.peak_bytes)); });
  for (Line& l : per_run(r, [](const StepStats& s) {
         return s.host_peak_bytes ? std::optional<double>(double(s.host_peak_bytes)) : std::nullopt;
       }, " host", true))
    peak.push_back(std::move(l));
  h += line_chart(peak, "peak bytes", true, bytes_label);
  if (r.memory) h += "<h2>Memory of the last step</h2>\n" + memory_report_sections(*r.memory);
  h += "<p style='color:#666;font-size:11px'>Written by shardlab. Self-contained: no scripts, no network.</p>\n";
  return h + "</body></html>\n";
}

}  // namespace shardlab
