// plan.cpp — enumerate, predict (memory: the estimator; time: the model in plan.hpp), rank.
#include "src/train/plan.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "shard/strategy_formulas.hpp"
#include "src/core/units.hpp"
#include "src/model/family.hpp"
#include "src/model/model.hpp"
#include "src/train/predict.hpp"

namespace shardlab {

std::string default_rates_source() {
  return fmt::format("defaults: one {} per rank, 8 per node ({:g} TFLOP/s dense bf16 at {:g}%)", kH100.name,
                     kH100.dense_bf16_tflops, kStepPeakShare * 100);
}

void PlanConfig::validate() const {
  train.spec.validate();
  SHARD_REQUIRE(world >= 1 && world <= (1 << 20), "--world {}: expected at least one rank", world);
  SHARD_REQUIRE(ranks_per_node >= 1, "--ranks-per-node {}: expected at least one rank", ranks_per_node);
  SHARD_REQUIRE(world % ranks_per_node == 0 || world < ranks_per_node,
                "--ranks-per-node {} does not divide --world {}: every node needs the same ranks", ranks_per_node, world);
  SHARD_REQUIRE(device_memory > 0, "plan needs --device-memory (each rank's device budget)");
  SHARD_REQUIRE(global_batch >= 0, "--global-batch {}: expected a positive number of sequences", global_batch);
  SHARD_REQUIRE(global_batch == 0 || global_batch % world == 0,
                "--global-batch {} is not divisible by --world {}: every rank needs whole sequences", global_batch, world);
  for (double r : {rates.flops, rates.link_intra, rates.link_inter, rates.host_link, rates.host_adamw, rates.device_adamw})
    SHARD_REQUIRE(r > 0, "plan rates must be positive (--device-tflops, --link-intra, --link-inter, --host-link)");
  SHARD_REQUIRE(rates.overlap >= 0 && rates.overlap <= 1, "overlap {}: expected 0 to 1", rates.overlap);
}

TrainConfig PlanEntry::config(const PlanConfig& p) const {
  TrainConfig t = p.train;
  t.strategy = strategy;
  t.checkpointing = checkpointing;
  t.accum = accum;
  t.batch = micro_batch * accum * p.world;
  return t;
}

namespace {

int64_t global_batch(const PlanConfig& c) { return c.global_batch > 0 ? c.global_batch : 8 * int64_t{c.world}; }

// Which link a group of `span` ranks crosses: a node's own, when they share one.
double link_for(const PlanConfig& c, int span, bool consecutive) {
  const int K = c.ranks_per_node;
  const bool one_node = consecutive ? (span <= K && K % span == 0) : c.world <= K;
  return one_node ? c.rates.link_intra : c.rates.link_inter;
}

// The time model of plan.hpp for one entry (its memory is already predicted).
void predict_time(const PlanConfig& c, double psi, PlanEntry& e) {
  const ModelSpec& s = c.train.spec;
  const double L = double(s.layers), C = double(s.dim), T = double(s.seq);
  double per_token = family_of(s).flops_per_token(s);
  if (e.checkpointing == Checkpointing::blocks) per_token += 2 * psi + 2 * L * C * T;
  if (e.checkpointing == Checkpointing::attention) per_token += L * C * T;
  const double tokens = double(e.micro_batch * e.accum) * T, accum = double(e.accum);
  const double compute = tokens * per_token / c.rates.flops;
  const int N = c.world, S = e.strategy.dims.dp_shard > 0 ? e.strategy.dims.dp_shard : N, G = N / S;
  const StepTraffic t = step_traffic(e.strategy.kind, TrafficInputs{psi, N, e.strategy.dims.dp_shard,
                                                                    c.train.strategy.precision.param_dtype,
                                                                    c.train.strategy.precision.reduce_dtype});
  const double bw_s = link_for(c, S, true), bw_g = link_for(c, G, false), bw_n = link_for(c, N, true);
  // Seconds of communication that can overlap compute, and that cannot (zero1/2's gather after the update).
  const double hidden = (t.per_micro ? accum : 1.0) * (t.group_overlapped_bus() / bw_s + t.across_bus() / bw_g) +
                        t.world_bus() / bw_n;
  const double exposed = t.group_exposed_bus() / bw_s;
  const double shard = psi / S;  // elements this rank updates
  double offload = 0, optimizer = shard / c.rates.device_adamw;
  if (e.strategy.offload != Offload::none) {
    offload = t.host_link(e.strategy.offload, accum) / c.rates.host_link;
    optimizer = shard / c.rates.host_adamw;
  }
  const double hide = c.rates.overlap * std::min(hidden, compute);
  e.compute_ms = compute * 1e3;
  e.comm_ms = (hidden + exposed) * 1e3;
  e.exposed_comm_ms = (hidden - hide + exposed) * 1e3;
  e.offload_ms = offload * 1e3;
  e.optimizer_ms = optimizer * 1e3;
  e.step_ms = e.compute_ms + e.exposed_comm_ms + e.offload_ms + e.optimizer_ms;
  e.tokens_per_s = double(global_batch(c)) * T / (e.step_ms / 1e3);
}

}  // namespace

std::vector<PlanEntry> make_plan(const PlanConfig& c) {
  c.validate();
  const int N = c.world, K = c.ranks_per_node;
  const int64_t per_rank = global_batch(c) / N;
  const double psi = static_cast<double>(num_params(family_of(c.train.spec).layout(c.train.spec)));
  std::vector<int> groups = {0};
  if (c.dp_shard >= 0) groups = {c.dp_shard};
  else if (K > 1 && K < N && N % K == 0) groups.push_back(K);
  std::vector<PlanEntry> plan;
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3})
    for (int S : groups)
      for (Offload off : {Offload::none, Offload::optimizer, Offload::params})
        for (Checkpointing ck : checkpointing_choices(c.train.spec))
          for (int64_t mb = 1; mb <= per_rank; mb *= 2) {
            if (per_rank % mb != 0) continue;
            if ((S > 0 && zero_stage(k) == 0) || offload_for(k, off) != off) continue;
            PlanEntry e;
            e.strategy = c.train.strategy.under(k);
            e.strategy.dims.dp_shard = S;  // 0: the whole world; else the replicas take the rest
            e.strategy.dims.dp_replicate = 0;
            e.strategy.offload = off;
            e.checkpointing = ck;
            e.micro_batch = mb;
            e.accum = per_rank / mb;
            const Estimate est = predict_step(e.config(c), N, 0, mb, false);
            e.peak = est.peak;
            e.host_peak = est.host.peak;
            e.fits = e.peak <= c.device_memory && (c.host_memory == 0 || e.host_peak <= c.host_memory);
            if (e.peak > c.device_memory)
              e.why = fmt::format("device peak {} > {}", format_bytes(double(e.peak)), format_bytes(double(c.device_memory)));
            else if (!e.fits)
              e.why = fmt::format("host peak {} > {}", format_bytes(double(e.host_peak)), format_bytes(double(c.host_memory)));
            predict_time(c, psi, e);
            plan.push_back(std::move(e));
          }
  std::stable_sort(plan.begin(), plan.end(), [](const PlanEntry& a, const PlanEntry& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.step_ms != b.step_ms) return a.step_ms < b.step_ms;
    // Ties (the model gives larger micro-batches no speed of their own): the larger micro-batch,
    // then the smaller peak.
    if (a.micro_batch != b.micro_batch) return a.micro_batch > b.micro_batch;
    return a.peak < b.peak;
  });
  return plan;
}

void print_plan(const PlanConfig& c, const std::vector<PlanEntry>& plan, size_t show, std::FILE* out) {
  const PlanRates& r = c.rates;
  std::fprintf(out, "shardlab plan: %s, %d ranks (%d per node), global batch %lld x %lld tokens, params %s, "
               "device %s per rank, host %s\n", c.train.spec.describe().c_str(), c.world, c.ranks_per_node,
               static_cast<long long>(global_batch(c)), static_cast<long long>(c.train.spec.seq),
               dtype_name(c.train.strategy.precision.param_dtype), format_bytes(double(c.device_memory)).c_str(),
               c.host_memory ? format_bytes(double(c.host_memory)).c_str() : "unlimited");
  const std::string flops =
      r.flops >= 1e12 ? fmt::format("{:.1f} TFLOP/s", r.flops / 1e12) : fmt::format("{:.2f} GFLOP/s", r.flops / 1e9);
  std::fprintf(out, "rates (%s): %s per rank, links %.1f GB/s within a node and %.1f GB/s between nodes, "
               "host link %.1f GB/s, AdamW %.3g (host) / %.3g (device) elements/s, %.0f%% of overlappable "
               "communication hidden\n", r.source.c_str(), flops.c_str(), r.link_intra / 1e9, r.link_inter / 1e9,
               r.host_link / 1e9, r.host_adamw, r.device_adamw, 100 * r.overlap);
  size_t fitting = 0;
  for (const auto& e : plan) fitting += e.fits;
  std::fprintf(out, "%zu of %zu configurations fit; fastest first (predicted)\n", fitting, plan.size());
  std::fprintf(out, "%4s %-22s %-10s %9s %11s %11s %10s %12s %10s %11s\n", "#", "strategy", "ckpt", "mb x acc",
               "peak", "host peak", "step ms", "tokens/s", "meas ms", "meas peak");
  auto line = [&](size_t i, const PlanEntry& e) {
    std::fprintf(out, "%4zu %-22s %-10s %4lld x %-3lld %11s %11s %10.1f %12.0f %10s %11s%s\n", i + 1,
                 e.strategy.label().c_str(), checkpointing_name(e.checkpointing), static_cast<long long>(e.micro_batch),
                 static_cast<long long>(e.accum), format_bytes(double(e.peak)).c_str(),
                 format_bytes(double(e.host_peak)).c_str(), e.step_ms, e.tokens_per_s,
                 e.measured_step_ms ? fmt::format("{:.1f}", *e.measured_step_ms).c_str() : "",
                 e.measured_peak ? format_bytes(double(*e.measured_peak)).c_str() : "",
                 e.fits ? "" : ("  does not fit: " + e.why).c_str());
  };
  for (size_t i = 0; i < plan.size() && i < show && plan[i].fits; ++i) line(i, plan[i]);
  if (fitting < plan.size()) {
    std::fprintf(out, "the fastest that do not fit:\n");
    for (size_t i = fitting; i < plan.size() && i < fitting + 3; ++i) line(i, plan[i]);
  }
  if (fitting == 0) std::fprintf(out, "nothing fits: more ranks, more device memory, or a smaller model\n");
  std::fflush(out);
}

std::string plan_html(const PlanConfig& c, const std::vector<PlanEntry>& plan) {
  auto esc = [](std::string s) {
    std::string o;
    for (char ch : s) o += ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '&' ? "&amp;" : std::string(1, ch);
    return o;
  };
  const PlanRates& r = c.rates;
  std::string h = "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>shardlab plan</title><style>"
                  "body{font-family:sans-serif;margin:24px}table{border-collapse:collapse;font-size:12px}"
                  "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#f3f3f3}"
                  "td.l{text-align:left}tr.no{color:#999}</style></head><body>\n<h1>shardlab plan</h1>\n";
  h += fmt::format("<p>{}, {} ranks ({} per node), global batch {} x {} tokens, device {} per rank, host {}</p>\n",
                   esc(c.train.spec.describe()), c.world, c.ranks_per_node, global_batch(c), c.train.spec.seq,
                   format_bytes(double(c.device_memory)), c.host_memory ? format_bytes(double(c.host_memory)) : "unlimited");
  h += fmt::format("<p>Rates ({}): {:.4g} GFLOP/s per rank; links {:.1f} GB/s within a node, {:.1f} GB/s between "
                   "nodes; host link {:.1f} GB/s; AdamW {:.3g} (host) / {:.3g} (device) elements/s; {:.0f}% of "
                   "overlappable communication hidden.</p>\n",
                   esc(r.source), r.flops / 1e9, r.link_intra / 1e9, r.link_inter / 1e9, r.host_link / 1e9,
                   r.host_adamw, r.device_adamw, 100 * r.overlap);
  h += "<table><tr><th>#</th><th>strategy</th><th>checkpointing</th><th>micro-batch x accum</th><th>peak</th>"
       "<th>host peak</th><th>compute ms</th><th>exposed comm ms</th><th>offload ms</th><th>optimizer ms</th>"
       "<th>step ms</th><th>tokens/s</th><th>measured ms</th><th>measured peak</th><th>fits</th></tr>\n";
  size_t shown_no = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlanEntry& e = plan[i];
    if (!e.fits && ++shown_no > 10) break;
    h += fmt::format("<tr{}><td>{}</td><td class='l'>{}</td><td class='l'>{}</td><td>{} x {}</td><td>{}</td><td>{}</td>"
                     "<td>{:.1f}</td><td>{:.1f}</td><td>{:.1f}</td><td>{:.1f}</td><td><b>{:.1f}</b></td><td>{:.0f}</td>"
                     "<td>{}</td><td>{}</td><td class='l'>{}</td></tr>\n",
                     e.fits ? "" : " class='no'", i + 1, esc(e.strategy.label()), checkpointing_name(e.checkpointing),
                     e.micro_batch, e.accum, format_bytes(double(e.peak)), format_bytes(double(e.host_peak)),
                     e.compute_ms, e.exposed_comm_ms, e.offload_ms, e.optimizer_ms, e.step_ms, e.tokens_per_s,
                     e.measured_step_ms ? fmt::format("{:.1f}", *e.measured_step_ms) : "",
                     e.measured_peak ? format_bytes(double(*e.measured_peak)) : "", e.fits ? "yes" : esc(e.why));
  }
  return h + "</table>\n<p style='color:#666;font-size:11px'>Written by shardlab plan. The memory is the "
             "estimator's (exact); the time is a model (README, Planning).</p>\n</body></html>\n";
}

std::string plan_json(const PlanConfig& c, const std::vector<PlanEntry>& plan) {
  nlohmann::json j;
  j["schema"] = "shardlab.plan/1";
  j["config"] = {{"model", spec_to_json(c.train.spec)},
                 {"world", c.world},
                 {"ranks_per_node", c.ranks_per_node},
                 {"device_memory_bytes", c.device_memory},
                 {"host_memory_bytes", c.host_memory},
                 {"global_batch", global_batch(c)},
                 {"param_dtype", dtype_name(c.train.strategy.precision.param_dtype)},
                 {"reduce_dtype", dtype_name(c.train.strategy.precision.reduce_dtype)}};
  const PlanRates& r = c.rates;
  j["rates"] = {{"source", r.source},         {"flops", r.flops},           {"link_intra_bytes_per_s", r.link_intra},
                {"link_inter_bytes_per_s", r.link_inter}, {"host_link_bytes_per_s", r.host_link},
                {"host_adamw_elements_per_s", r.host_adamw}, {"device_adamw_elements_per_s", r.device_adamw},
                {"overlap", r.overlap}};
  j["configs"] = nlohmann::json::array();
  for (const auto& e : plan) {
    nlohmann::json o = {{"strategy", strategy_name(e.strategy.kind)},
                        {"dp_shard", e.strategy.dims.dp_shard > 0 ? e.strategy.dims.dp_shard : c.world},
                        {"activation_checkpointing", checkpointing_name(e.checkpointing)},
                        {"offload", offload_name(e.strategy.offload)},
                        {"micro_batch", e.micro_batch},
                        {"accum", e.accum},
                        {"fits", e.fits},
                        {"predicted_peak_bytes", e.peak},
                        {"predicted_host_peak_bytes", e.host_peak},
                        {"predicted_step_ms", e.step_ms},
                        {"predicted_tokens_per_s", e.tokens_per_s},
                        {"measured_step_ms", nullptr},
                        {"measured_peak_bytes", nullptr}};
    if (e.measured_step_ms) o["measured_step_ms"] = *e.measured_step_ms;
    if (e.measured_peak) o["measured_peak_bytes"] = *e.measured_peak;
    if (!e.fits) o["why"] = e.why;
    j["configs"].push_back(o);
  }
  return j.dump(1);
}

}  // namespace shardlab
