// run_log.cpp — reading a train --log back (run_report.hpp): the report's series and its text summary.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "src/core/check.hpp"
#include "src/core/units.hpp"
#include "src/report/run_report.hpp"

namespace shardlab {
namespace {

// One step's record (its "loss" a number) as the report's StepStats.
StepStats step_of(const nlohmann::json& j) {
  StepStats s;
  s.step = j["step"].get<int64_t>();
  s.loss = j["loss"].get<float>();
  s.lr = j.value("lr", 0.f);
  s.grad_norm = j.value("grad_norm", 0.f);
  s.ms = j.value("ms", 0.0);
  s.tokens_per_s = j.value("tokens_per_s", 0.0);
  s.peak_bytes = j.value("peak_bytes", uint64_t{0});
  s.host_peak_bytes = j.value("host_peak_bytes", uint64_t{0});
  s.comm_bytes = j.value("comm_bytes", 0.0);
  s.rss_bytes = j.value("rss_bytes", uint64_t{0});
  s.flops_per_s = j.value("flops_per_s", 0.0);
  s.elapsed_s = j.value("elapsed_s", 0.0);
  if (j.contains("val_loss") && j["val_loss"].is_number()) s.val_loss = j["val_loss"].get<float>();
  // A mixture of experts' balancing statistics (train's log writes the three together).
  if (j.contains("aux_loss") && j["aux_loss"].is_number()) {
    s.aux_loss = j["aux_loss"].get<float>();
    s.expert_imbalance = j.value("expert_imbalance", 1.0);
    s.dropped_slots = j.value("dropped_slots", 0.0);
  }
  return s;
}

std::string what_ran(const nlohmann::json& j) {
  auto str = [&](const char* k) { return j.contains(k) ? j[k].is_string() ? j[k].get<std::string>() : j[k].dump() : "?"; };
  return fmt::format("{}, {} on {} ranks (mesh {}), global batch {} x {} tokens, {} steps, data {}, tokenizer {}{}",
                     str("model"), str("strategy"), str("ranks"), str("mesh"), str("batch"), str("seq"), str("steps"),
                     str("data"), str("tokenizer"), j.contains("run_id") ? ", run " + str("run_id") : "");
}

}  // namespace

RunSeries read_step_log(const std::string& path, const std::string& label) {
  std::ifstream in(path, std::ios::binary);
  SHARD_REQUIRE(in.good(), "cannot read the log '{}'", path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  RunSeries series{label, {}, "", {}};
  size_t at = 0;
  for (int n = 1; at < text.size(); ++n) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, end - at);
    const bool last_cut = end == text.size();  // no newline after it: the writer was stopped mid-line
    at = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() && last_cut) {
      series.notes.push_back(fmt::format("line {} is cut short (the run was stopped while writing it): left out", n));
      break;
    }
    if (j.is_object() && j.contains("event")) {  // a start or resume record
      if (j.contains("model")) series.what_ran = what_ran(j);
      continue;
    }
    SHARD_REQUIRE(j.is_object() && j.contains("step") && j["step"].is_number_integer() && j.contains("loss"),
                  "{}:{}: expected one step's JSON object with \"step\" and \"loss\" (a train --log file), got '{}'",
                  path, n, line.substr(0, 80));
    if (!j["loss"].is_number()) {
      series.notes.push_back(fmt::format("step {}: the loss is not finite (logged as null; --skip-nonfinite skipped "
                                         "its update): left out of the charts", j["step"].get<int64_t>()));
      continue;
    }
    series.steps.push_back(step_of(j));
  }
  SHARD_REQUIRE(!series.steps.empty(), "the log '{}' holds no steps with a finite loss", path);
  return series;
}

std::string run_summary_text(const RunSeries& s) {
  std::string out = fmt::format("{}:\n", s.label);
  if (!s.what_ran.empty()) out += fmt::format("  ran: {}\n", s.what_ran);
  const StepStats& first = s.steps.front();
  const StepStats& last = s.steps.back();
  const auto best = std::min_element(s.steps.begin(), s.steps.end(),
                                     [](const StepStats& a, const StepStats& b) { return a.loss < b.loss; });
  out += fmt::format("  steps {} to {} ({} logged), loss {:.4f} -> {:.4f} (lowest {:.4f} at step {})", first.step,
                     last.step, s.steps.size(), first.loss, last.loss, best->loss, best->step);
  for (auto it = s.steps.rbegin(); it != s.steps.rend(); ++it)
    if (it->val_loss) {
      out += fmt::format(", validation loss {:.4f} at step {}", *it->val_loss, it->step);
      break;
    }
  std::vector<double> ms, tps;
  uint64_t peak = 0;
  for (const StepStats& x : s.steps) {
    if (x.ms > 0) ms.push_back(x.ms), tps.push_back(x.tokens_per_s);
    peak = std::max(peak, x.peak_bytes);
  }
  if (!ms.empty()) {
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    std::nth_element(tps.begin(), tps.begin() + tps.size() / 2, tps.end());
    out += fmt::format("\n  median step {:.1f} ms, {:.0f} tokens/s; peak memory {} (rank 0)", ms[ms.size() / 2],
                       tps[tps.size() / 2], format_bytes(double(peak)));
  }
  if (first.aux_loss && last.aux_loss) {  // a mixture of experts: its balance over the run
    const auto worst = std::max_element(s.steps.begin(), s.steps.end(), [](const StepStats& a, const StepStats& b) {
      return a.expert_imbalance.value_or(1.0) < b.expert_imbalance.value_or(1.0);
    });
    double dropped = 0;
    for (const StepStats& x : s.steps) dropped += x.dropped_slots.value_or(0.0);
    out += fmt::format("\n  experts: auxiliary loss {:.4f} -> {:.4f}, load (max / mean) {:.2f} -> {:.2f} (highest "
                       "{:.2f} at step {}), {:.0f} slots dropped past capacity", *first.aux_loss, *last.aux_loss,
                       first.expert_imbalance.value_or(1.0), last.expert_imbalance.value_or(1.0),
                       worst->expert_imbalance.value_or(1.0), worst->step, dropped);
  }
  out += "\n";
  for (const std::string& n : s.notes) out += fmt::format("  note: {}\n", n);
  return out;
}

}  // namespace shardlab
