// `plan` (src/plan/plan.hpp): its memory against the estimator's prediction of every rank role,
// its time against the time model of the layout, the pruned search against the exhaustive one,
// pins, and the JSON schema shardlab.plan/2.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "src/comm/mesh.hpp"
#include "src/core/check.hpp"
#include "src/plan/plan.hpp"
#include "src/plan/plan_progress.hpp"
#include "src/report/plan_report.hpp"
#include "src/train/predict.hpp"

using namespace shardlab;

namespace {

// The schedules these tests run, by the names --pp-schedule takes.
const PpSchedule interleaved = parse_pp_schedule("interleaved-1f1b");

PlanConfig plan_for(const std::string& preset, int world, uint64_t device_memory, DType dt = DType::bf16) {
  PlanConfig pc;
  pc.train.spec = model_preset(preset);
  pc.train.strategy.precision.param_dtype = pc.train.strategy.precision.reduce_dtype = dt;
  pc.world = world;
  pc.ranks_per_node = std::min(world, 8);
  pc.rates.device.ranks_per_node = pc.ranks_per_node;
  pc.device_memory = device_memory;
  return pc;
}

// The largest peak of any rank of the entry's configuration: every pipeline stage predicted (the
// plan predicts only the distinct ones).
uint64_t every_stage_peak(const PlanConfig& pc, const PlanEntry& e) {
  const TrainConfig t = e.config(pc);
  const ParallelDims d = t.layout.dims.resolved(pc.world);
  uint64_t peak = 0;
  for (int k = 0; k < d.pp; ++k) {
    MeshCoord c;
    c.pp = k;
    peak = std::max(peak, predict_step(t, pc.world, mesh_rank(d, c), e.micro_batch, false).peak);
  }
  return peak;
}

std::string key(const PlanEntry& e) { return e.label() + " " + checkpointing_name(e.checkpointing) + " mb " + std::to_string(e.micro_batch); }

}  // namespace

TEST_CASE("plan: gpt2-xl on 64 x 80 GiB, the top fits with the estimator's peak and the model's time", "[plan]") {
  PlanConfig pc = plan_for("gpt2-xl", 64, uint64_t{80} << 30);
  const PlanResult plan = make_plan(pc);
  REQUIRE(!plan.entries.empty());
  const PlanEntry& top = plan.entries.front();
  REQUIRE(top.fits);
  CHECK(top.peak == every_stage_peak(pc, top));
  CHECK(top.peak <= pc.device_memory);
  const TimePrediction t = predict_step_time(pc.train.spec, top.time_layout(pc), pc.rates.device, pc.rates.achievable);
  CHECK(top.step_ms() == Approx(t.split.total * 1e3).epsilon(1e-12));
  CHECK(top.time.mfu == Approx(t.mfu).epsilon(1e-12));
  for (size_t i = 1; i < plan.entries.size(); ++i)  // fitting ones first, each group fastest first
    CHECK((plan.entries[i - 1].fits > plan.entries[i].fits ||
           (plan.entries[i - 1].fits == plan.entries[i].fits && plan.entries[i - 1].step_ms() <= plan.entries[i].step_ms())));
}

TEST_CASE("plan: the pruned search ranks the same top configurations as the exhaustive one", "[plan]") {
  // `small` (4 blocks, 4 heads) on 16 devices (8 per node), 8 MiB each, global batch 64: tp 1-4,
  // pp 1-4, hybrid groups, every lever. The budget leaves the fastest layouts out.
  PlanConfig pc = plan_for("small", 16, uint64_t{8} << 20);
  pc.global_batch = 64;
  pc.keep = 5;
  const PlanResult pruned = make_plan(pc);
  pc.exhaustive = true;
  const PlanResult all = make_plan(pc);
  CHECK(all.predictions > pruned.predictions);
  CHECK(all.walked == all.candidates);
  std::vector<std::string> a, b;
  size_t fitting_all = 0;
  for (const PlanEntry& e : all.entries) fitting_all += e.fits;
  REQUIRE(fitting_all >= 5);
  for (size_t i = 0; i < 5; ++i) {
    REQUIRE(pruned.entries[i].fits);
    a.push_back(key(pruned.entries[i]));
    b.push_back(key(all.entries[i]));
    CHECK(pruned.entries[i].peak == all.entries[i].peak);
  }
  CHECK(a == b);
  // Some faster layout did not fit (the budget binds), and the top is the fastest that does.
  bool faster_out = false;
  for (const PlanEntry& e : all.entries)
    if (!e.fits && e.step_ms() < all.entries[0].step_ms()) faster_out = true;
  CHECK(faster_out);
  // The exhaustive walk holds hybrid groups and pipelines among its candidates.
  bool hybrid = false, pipelined = false, tp = false;
  for (const PlanEntry& e : all.entries) {
    hybrid |= e.layout.dims.dp_replicate > 1;
    pipelined |= e.layout.dims.pp > 1;
    tp |= e.layout.dims.tp > 1;
  }
  CHECK((hybrid && pipelined && tp));
}

TEST_CASE("plan: a mixture of experts' stage bounds hold and prune as the exhaustive search ranks", "[plan]") {
  // deepseek-v3-tiny (latent attention, 8 experts, bf16) on 8 devices: tp, pp, ep, cp and every
  // strategy. The exhaustive walk predicts every layout whole, and every predicted stage's peak must
  // be at least its bound (plan.cpp checks each: an internal error otherwise); then, under a budget
  // that leaves the fastest layout out, the pruned search ranks the same top five.
  PlanConfig pc = plan_for("deepseek-v3-tiny", 8, uint64_t{1} << 40);
  pc.global_batch = 16;
  pc.keep = 5;
  pc.exhaustive = true;
  const PlanResult whole = make_plan(pc);
  REQUIRE(!whole.entries.empty());
  REQUIRE(whole.entries.front().fits);
  pc.device_memory = whole.entries.front().peak - 1;
  const PlanResult all = make_plan(pc);
  pc.exhaustive = false;
  const PlanResult pruned = make_plan(pc);
  std::printf("deepseek-v3-tiny on 8: %zu layouts, %zu predictions exhaustive, %zu pruned\n", all.candidates,
              all.predictions, pruned.predictions);
  CHECK(pruned.predictions < all.predictions);
  std::vector<std::string> a, b;
  for (size_t i = 0; i < 5; ++i) {
    REQUIRE(pruned.entries.at(i).fits);
    a.push_back(key(pruned.entries[i]));
    b.push_back(key(all.entries.at(i)));
    CHECK(pruned.entries[i].peak == all.entries[i].peak);
  }
  CHECK(a == b);
  bool ep = false, pipelined = false;
  for (const PlanEntry& e : all.entries) ep |= e.layout.dims.ep > 1, pipelined |= e.layout.dims.pp > 1;
  CHECK((ep && pipelined));
}

TEST_CASE("plan: a step within budgets is the whole step's estimate, or nothing past a budget by one byte", "[plan]") {
  // zero3 with the optimizer offloaded on tp 2 x pp 2: both tiers hold bytes.
  PlanConfig pc = plan_for("small", 16, uint64_t{80} << 30);
  pc.global_batch = 64;
  PlanPins& p = pc.pins;
  p.tp = 2, p.pp = 2, p.pp_virtual = 1, p.schedule = parse_pp_schedule("1f1b"), p.dp_shard = 4;
  p.sequence_parallel = true, p.strategy = StrategyKind::zero3, p.checkpointing = Checkpointing::none;
  p.offload = Offload::optimizer, p.micro_batch = 2;
  const PlanEntry e = make_plan(pc).entries.at(0);
  const TrainConfig t = e.config(pc);
  const ParallelDims d = t.layout.dims.resolved(pc.world);
  for (int stage : {0, 1}) {
    MeshCoord at;
    at.pp = stage;
    const int rank = mesh_rank(d, at);
    const Estimate whole = predict_step(t, pc.world, rank, e.micro_batch, false);
    REQUIRE(whole.host.peak > 0);
    const std::optional<Estimate> within =
        predict_step_within(t, pc.world, rank, e.micro_batch, PoolConfig{whole.peak, whole.host.peak});
    REQUIRE(within.has_value());
    CHECK(within->peak == whole.peak);
    CHECK(within->at_peak == whole.at_peak);
    CHECK(within->peak_by_category == whole.peak_by_category);
    CHECK(within->model_states == whole.model_states);
    CHECK(within->host == whole.host);
    CHECK(predict_step_within(t, pc.world, rank, e.micro_batch, PoolConfig{0, 0}).has_value());  // no limits
    CHECK(!predict_step_within(t, pc.world, rank, e.micro_batch, PoolConfig{whole.peak - 1, 0}));
    CHECK(!predict_step_within(t, pc.world, rank, e.micro_batch, PoolConfig{0, whole.host.peak - 1}));
    // A budget under the model states stops it before the step.
    CHECK(!predict_step_within(t, pc.world, rank, e.micro_batch, PoolConfig{whole.model_state_total() - 1, 0}));
  }
}

TEST_CASE("plan: steps stopped at the budget settle the same configurations as whole ones", "[plan]") {
  // The setting of the pruned-search test; keeping no configuration that does not fit lets every
  // step stop at the budget, which must not change what fits, in what order, with which peaks.
  PlanConfig pc = plan_for("small", 16, uint64_t{8} << 20);
  pc.global_batch = 64;
  pc.keep = 5;
  pc.keep_not_fitting = size_t{1} << 20;  // every one that does not fit listed, with its peak
  const PlanResult whole = make_plan(pc);
  pc.keep_not_fitting = 0;
  const PlanResult stopped = make_plan(pc);
  CHECK(whole.stopped_at_budget == 0);
  CHECK(stopped.stopped_at_budget > 0);
  CHECK(stopped.predictions <= whole.predictions);
  CHECK(stopped.walked == whole.walked);
  CHECK(stopped.ruled_by_micro_batch == whole.ruled_by_micro_batch);
  CHECK(stopped.ruled_by_bound == whole.ruled_by_bound);
  REQUIRE(stopped.entries.size() == 5);
  for (size_t i = 0; i < 5; ++i) {
    const PlanEntry &a = whole.entries.at(i), &b = stopped.entries[i];
    REQUIRE((a.fits && b.fits));
    CHECK(key(a) == key(b));
    CHECK(a.peak == b.peak);
    CHECK(a.peak_stage == b.peak_stage);
    CHECK(a.host_peak == b.host_peak);
  }
}

TEST_CASE("plan: each pipeline layout's peak is the largest of every stage's", "[plan]") {
  PlanConfig pc = plan_for("small", 8, uint64_t{1} << 30);
  pc.global_batch = 32;
  pc.pins.pp = 4;
  pc.keep = 6;
  const PlanResult plan = make_plan(pc);
  size_t checked = 0;
  for (const PlanEntry& e : plan.entries) {
    if (!e.predicted) continue;
    CHECK(e.layout.dims.pp == 4);
    CHECK(e.peak == every_stage_peak(pc, e));
    ++checked;
  }
  CHECK(checked >= 6);
}

TEST_CASE("plan: every dimension pinned gives one configuration, the one asked for", "[plan]") {
  PlanConfig pc = plan_for("small", 16, uint64_t{80} << 30);
  pc.global_batch = 64;
  PlanPins& p = pc.pins;
  p.tp = 2, p.pp = 2, p.pp_virtual = 2, p.schedule = interleaved, p.dp_shard = 2;
  p.sequence_parallel = true, p.strategy = StrategyKind::zero3, p.checkpointing = Checkpointing::attention;
  p.offload = Offload::optimizer, p.micro_batch = 2;
  const PlanResult plan = make_plan(pc);
  CHECK(plan.candidates == 1);
  REQUIRE(plan.entries.size() == 1);
  const PlanEntry& e = plan.entries[0];
  CHECK(e.fits);
  CHECK(e.layout.dims == ParallelDims{2, 2, 2, 2});
  CHECK(e.layout.pipeline.virtual_stages == 2);
  CHECK(e.accum == 64 / (4 * 2));
  CHECK(e.label() == "tp 2+sp pp 2 interleaved v2 dp 4 zero3 S=2 off:optimizer");
  CHECK(e.peak == every_stage_peak(pc, e));
  // A pin that cannot hold is refused with its values.
  p.pp_virtual = 3;  // 2 x 3 chunks, 4 blocks
  CHECK_THROWS_WITH(make_plan(pc), Catch::Contains("no layout of 16 ranks meets the flags given"));
  p.pp_virtual = 2;
  p.tp = 5;
  CHECK_THROWS_WITH(make_plan(pc), Catch::Contains("--tp 5: tensor parallelism stays within a node of 8 ranks"));
  p.tp = 8;
  CHECK_THROWS_WITH(make_plan(pc), Catch::Contains("--tp 8 must divide the attention heads (4) and the KV heads (4)"));
}

TEST_CASE("plan: tensor parallelism follows the trainer's rule, the MLP width as well as the heads", "[plan]") {
  // `small` has 4 heads; an MLP width of 510 takes --tp 2 but not 4, which the heads alone allow.
  PlanConfig pc = plan_for("small", 8, uint64_t{80} << 30);
  pc.train.spec.ffn_dim = 510;
  pc.pins.pp = 1, pc.pins.strategy = StrategyKind::zero3, pc.pins.offload = Offload::none;
  pc.pins.checkpointing = Checkpointing::none;
  pc.exhaustive = true;
  const PlanResult plan = make_plan(pc);
  bool tp2 = false;
  for (const PlanEntry& e : plan.entries) {
    CHECK(e.layout.dims.tp <= 2);
    tp2 |= e.layout.dims.tp == 2;
  }
  CHECK(tp2);
  // Pinned, plan refuses it in the words train refuses it with.
  std::string train_says;
  try {
    family_of(pc.train.spec).make_units(pc.train.spec, TpConfig{4, 0, false});
  } catch (const InputError& e) {
    train_says = e.what();
  }
  REQUIRE(train_says == "--tp 4 must divide the MLP width (510) of small");
  pc.pins.tp = 4;
  CHECK_THROWS_WITH(make_plan(pc), train_says);
}

TEST_CASE("plan: a budget nothing meets says why for every configuration walked", "[plan]") {
  PlanConfig pc = plan_for("gpt2-xl", 8, uint64_t{1} << 30, DType::f32);
  pc.pins.tp = 1, pc.pins.pp = 1;
  pc.pins.cp = 1;  // with cp 2 or 4 and parameters offloaded a rank's share fits (plan: context parallelism)
  const PlanResult plan = make_plan(pc);
  REQUIRE(!plan.entries.empty());
  CHECK(plan.walked == plan.candidates);
  for (const PlanEntry& e : plan.entries) CHECK((!e.fits && !e.why.empty()));
  CHECK(plan.ruled_by_bound > 0);
}

TEST_CASE("plan: JSON schema shardlab.plan/2", "[plan]") {
  PlanConfig pc = plan_for("tiny", 8, uint64_t{64} << 20);
  pc.keep = 3;
  const PlanResult plan = make_plan(pc);
  const auto j = nlohmann::json::parse(plan_json(pc, plan));
  CHECK(j["schema"] == "shardlab.plan/2");
  for (const char* k : {"config", "rates", "search", "configs"}) CHECK(j.contains(k));
  REQUIRE(j["configs"].size() == plan.entries.size());
  for (const char* k : {"strategy", "dp_shard", "dp_replicate", "activation_checkpointing", "offload", "micro_batch",
                        "accum", "fits", "predicted_peak_bytes", "predicted_host_peak_bytes", "predicted_step_ms",
                        "predicted_tokens_per_s", "measured_step_ms", "measured_peak_bytes", "tp", "pp", "pp_virtual",
                        "pp_schedule", "sequence_parallel", "predicted_tflops_per_device", "predicted_mfu",
                        "time_split"})
    CHECK(j["configs"][0].contains(k));
  for (const char* k : {"compute_ms", "recompute_ms", "exposed_tp_ms", "exposed_dp_ms", "bubble_ms", "pp_p2p_ms",
                        "offload_ms", "optimizer_ms"})
    CHECK(j["configs"][0]["time_split"].contains(k));
  double parts = 0;
  for (const auto& [k, v] : j["configs"][0]["time_split"].items()) parts += v.get<double>();
  CHECK(parts == Approx(j["configs"][0]["predicted_step_ms"].get<double>()).epsilon(1e-9));
  CHECK(j["configs"][0]["measured_step_ms"].is_null());
  const std::string html = plan_html(pc, plan);
  CHECK(html.find("class='bar'") != std::string::npos);
}

TEST_CASE("plan: the answer for a fixed small case, by the model's arithmetic", "[plan]") {
  // `small` on one node of 8 H100s, global batch 64. With memory to spare the model can only lose
  // time by splitting a layer (tp: smaller GEMMs, exposed all-reduces) or the model (pp: a bubble),
  // and a micro-batch below 8 only shrinks GEMMs; among the strategies ZeRO-3 updates an eighth of
  // the parameters and hides all its traffic in the whole step (ddp updates all of them; ZeRO-1/2
  // expose their all-gather). So: tp 1, pp 1, dp 8, zero3, micro-batch 8.
  PlanConfig pc = plan_for("small", 8, uint64_t{80} << 30);
  pc.global_batch = 64;
  pc.keep = 1;
  const PlanEntry top = make_plan(pc).entries.at(0);
  CHECK(top.layout.dims == ParallelDims{1, 1, 8, 1});
  CHECK(top.strategy.kind == StrategyKind::zero3);
  CHECK(top.micro_batch == 8);
  CHECK(top.checkpointing == Checkpointing::none);
  CHECK(top.strategy.offload == Offload::none);
  // At 5 MiB no data-parallel-only layout fits (each rank holds every layer),
  // so the answer splits the model, and it fits.
  pc.device_memory = uint64_t{5} << 20;
  pc.train.spec.attention = AttentionKernel::naive;  // the (T, T) probabilities make 5 MiB too small for dp alone
  pc.exhaustive = true;
  const PlanResult all = make_plan(pc);
  for (const PlanEntry& e : all.entries)
    if (e.layout.dims.tp == 1 && e.layout.dims.pp == 1) CHECK(!e.fits);
  REQUIRE(all.entries.at(0).fits);
  CHECK(all.entries[0].layout.dims.tp * all.entries[0].layout.dims.pp > 1);
  CHECK(all.entries[0].peak <= pc.device_memory);
}

TEST_CASE("plan: the progress line's estimate of the time left", "[plan]") {
  WalkState w;
  w.candidates = 11000, w.keep = 15, w.walked = 1000, w.elapsed_s = 10;
  // Nothing fits yet: no estimate, only where the walk ends at the latest (the rest of the list,
  // 10,000 layouts at 10 ms a layout).
  WalkEstimate e = estimate_walk_left(w);
  CHECK(e.whole_list);
  CHECK(e.seconds_left == Approx(100));
  CHECK_THAT(progress_text(w), Catch::Contains("1000 of 11000 layouts walked (9%)") &&
                                   Catch::Contains("nothing fits yet, so no estimate of the time left: the walk ends "
                                                   "once 15 fit (at the latest, the rest of the list: about 100 s at "
                                                   "this pace)"));
  CHECK(progress_brief(w) == "plan: 1000/11000 walked, 0/15 fit, 10 s; no estimate before a fit (list <= ~100 s)");
  // The first fit at layout 1000 (8 s; its settling took 0.5 s); at 10 s: 2.5 s per fit, 14 to come.
  w.first_fit_walked = 1000, w.first_fit_s = 8, w.first_fit_cost_s = 0.5, w.fit_cost_max_s = 0.5, w.fit = 1;
  e = estimate_walk_left(w);
  CHECK(!e.whole_list);
  CHECK(e.seconds_left == Approx(14 * 2.5));
  // At layout 1100 (12 s) 5 fit: 4 more in 100 layouts since the first, so 250 for the other 10, at
  // 40 ms a layout since the first (10 s); or 1.3 x the longest fit's settling (2 s) for each of the
  // 10: the lesser.
  w.walked = 1100, w.elapsed_s = 12, w.fit = 5, w.fit_cost_max_s = 2;
  e = estimate_walk_left(w);
  CHECK(!e.whole_list);
  CHECK(e.seconds_left == Approx(250 * 0.04));
  CHECK_THAT(progress_text(w), Catch::Contains("5 of 15 fit, 12 s; about 10 s left (an estimate: 10 more to fit, "
                                               "each a whole step predicted, at the pace since the first fit)"));
  w.fit_cost_max_s = 0.5;
  CHECK(estimate_walk_left(w).seconds_left == Approx(10 * 1.3 * 0.5));
  // Never more than the rest of the list (50 layouts) at the pace so far (12 s for 1100), where the
  // walk ends at the latest.
  w.candidates = 1150, w.fit_cost_max_s = 2;
  CHECK(estimate_walk_left(w).seconds_left == Approx(50 * 12.0 / 1100));
  // An exhaustive walk goes to the end of the list: its rest at the pace so far.
  w.candidates = 11000, w.exhaustive = true;
  CHECK(estimate_walk_left(w).seconds_left == Approx(9900 * 12.0 / 1100));
  CHECK_THAT(progress_text(w), Catch::Contains("left (an estimate: the rest of the list at this pace)"));
  CHECK(progress_brief(w) == "plan: 1100/11000 walked, 5/15 fit, 12 s; ~108 s left (estimate)");
  // Nothing walked yet, or the list walked: nothing to estimate from, or nothing left.
  w.walked = 0;
  CHECK(estimate_walk_left(w).seconds_left == 0);
  w.walked = w.candidates;
  CHECK(estimate_walk_left(w).seconds_left == 0);
}

namespace {
std::string written(std::FILE* f) {
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s += static_cast<char>(c);
  return s;
}
}  // namespace

TEST_CASE("plan: the progress line comes every 10 s in a log, in place every second on a terminal", "[plan]") {
  // 100 s of a walk, the line asked for every 10 ms (exact binary fractions of the clock: i / 100).
  auto drive = [](WalkProgress& p) {
    WalkState w;
    w.candidates = 1'000'000, w.keep = 15;
    for (int i = 1; i <= 10000; ++i) {
      w.walked = static_cast<size_t>(i), w.elapsed_s = i / 100.0;
      p.update(w);
    }
    p.finish();
  };
  std::FILE* log = std::tmpfile();
  REQUIRE(log);
  WalkProgress in_log(log, 0);
  drive(in_log);
  const std::string a = written(log);
  std::fclose(log);
  CHECK(std::count(a.begin(), a.end(), '\n') == 10);  // at 10, 20, ..., 100 s
  CHECK(a.find('\r') == std::string::npos);
  CHECK(a.find("walked (0%), 0 memory predictions, 0 of 15 fit, 10 s; nothing fits yet") != std::string::npos);
  size_t estimates = 0;
  for (size_t at = 0; (at = a.find("(at the latest, the rest", at)) != std::string::npos; ++at) ++estimates;
  CHECK(estimates == 10);
  std::FILE* tty = std::tmpfile();
  REQUIRE(tty);
  WalkProgress on_terminal(tty, 50);  // 50 columns: each line cut to 49
  drive(on_terminal);
  const std::string b = written(tty);
  std::fclose(tty);
  CHECK(std::count(b.begin(), b.end(), '\r') == 100 + 1);  // every second, then cleared
  CHECK(b.find('\n') == std::string::npos);
  CHECK(b.substr(b.size() - 4) == "\r\033[K");
  CHECK(b.substr(0, 50) == "\rplan: 100/1000000 walked, 0/15 fit, 1 s; no estim");
  for (size_t at = b.find('\r'); at + 4 < b.size(); at = b.find('\r', at + 1))
    CHECK(b.find("\033[K", at) - at - 1 <= 49);
  WalkProgress quiet(nullptr, 80);  // no stream: nothing to do, nothing to fail
  drive(quiet);
}

TEST_CASE("plan: context parallelism is searched, and at a long sequence it is what fits", "[plan][cp]") {
  PlanConfig pc = plan_for("llama-small", 8, uint64_t{80} << 30, DType::f32);
  pc.train.spec.seq = 8192;
  pc.global_batch = 8;
  PlanPins& p = pc.pins;
  p.strategy = StrategyKind::zero3, p.offload = Offload::none, p.checkpointing = Checkpointing::blocks;
  p.micro_batch = 1, p.sequence_parallel = false, p.pp = 1;
  pc.exhaustive = true;
  const PlanResult all = make_plan(pc);
  uint64_t best_whole = UINT64_MAX, best_cp = UINT64_MAX;
  std::vector<int> cps;
  for (const PlanEntry& e : all.entries) {
    REQUIRE(e.predicted);
    uint64_t& best = e.layout.dims.cp == 1 ? best_whole : best_cp;
    best = std::min(best, e.peak);
    if (std::find(cps.begin(), cps.end(), e.layout.dims.cp) == cps.end()) cps.push_back(e.layout.dims.cp);
    // Its peak is the trainer's prediction of that run (the cp ranks hold equal pieces: rank 0 stands for them).
    if (e.layout.dims.cp > 1 && e.layout.dims.tp == 1)
      CHECK(e.peak == predict_step(e.config(pc), pc.world, 0, e.micro_batch).peak);
  }
  std::sort(cps.begin(), cps.end());
  CHECK(cps == std::vector<int>{1, 2, 4, 8});
  REQUIRE(best_cp < best_whole);  // a rank holds 1 / cp of each sequence's activations
  pc.device_memory = best_cp;
  pc.exhaustive = false;
  const PlanResult tight = make_plan(pc);
  REQUIRE(!tight.entries.empty());
  REQUIRE(tight.entries.front().fits);
  for (const PlanEntry& e : tight.entries)
    if (e.fits) CHECK(e.layout.dims.cp > 1);
  CHECK(tight.entries.front().label().find(" cp ") != std::string::npos);
}

TEST_CASE("plan: the time model of context parallelism", "[plan][cp]") {
  ModelSpec m = model_preset("llama3-8b");
  m.seq = 65536;
  const PlanConfig pc = plan_for("llama3-8b", 64, uint64_t{80} << 30);
  TimeLayout whole, cp;
  whole.tp = cp.tp = 8, whole.global_batch = cp.global_batch = 8, whole.recompute = cp.recompute = Checkpointing::blocks;
  whole.dp_strategy = cp.dp_strategy = StrategyKind::zero3;
  whole.dp = 8, cp.dp = 1, cp.cp = 8;
  const TimePrediction a = predict_step_time(m, whole, pc.rates.device, pc.rates.achievable);
  const TimePrediction b = predict_step_time(m, cp, pc.rates.device, pc.rates.achievable);
  // The same tokens over the same devices: the work per step is the same but for the GEMMs'
  // shapes (s / cp query rows per rank), and the K/V exchanges are exposed.
  CHECK(b.split.compute == Approx(a.split.compute).epsilon(0.05));
  CHECK(a.split.exposed_on(CommAxis::cp) == 0);
  CHECK(b.split.exposed_on(CommAxis::cp) > 0);
  CHECK(b.hardware_flops == a.hardware_flops);
  // The ring hides its K/V hops behind the attention tiles: less exposed than the all-gathers.
  cp.cp_method = CpMethod::ring;
  const TimePrediction r = predict_step_time(m, cp, pc.rates.device, pc.rates.achievable);
  CHECK(r.split.exposed_on(CommAxis::cp) < b.split.exposed_on(CommAxis::cp));
  // cp needs its pieces whole, and the fused attention.
  cp.cp = 3;
  CHECK_THROWS_WITH(predict_step_time(m, cp, pc.rates.device, pc.rates.achievable), Catch::Contains("equal pieces"));
}

// Zero-bubble schedules are searched with the others: where the time model puts them first (a deep
// pipeline of few layers a stage, little room for interleaving) plan picks one, with its smaller
// bubble in the split; its memory (the weight passes' held operands) is the prediction's.
TEST_CASE("plan: a zero-bubble schedule where the time model says it wins, its bubble in the split", "[plan][zb]") {
  PlanConfig pc = plan_for("llama3-8b", 64, uint64_t{80} << 30);
  pc.global_batch = 256;
  pc.pins.pp = 16;
  const PlanResult plan = make_plan(pc);
  REQUIRE(!plan.entries.empty());
  const PlanEntry& top = plan.entries.front();
  REQUIRE(top.fits);
  INFO(top.label());
  CHECK(top.layout.pipeline.schedule->splits_backward);
  CHECK(top.peak == every_stage_peak(pc, top));
  // The same layout under each other schedule: slower by the model, the difference its bubble's.
  for (const PpScheduleDef* d : pp_schedules()) {
    TimeLayout l = top.time_layout(pc);
    if (PpSchedule(*d) == l.schedule || d->virtual_stages) continue;  // one chunk a rank, as the top's
    l.schedule = PpSchedule(*d);
    const TimePrediction other = predict_step_time(pc.train.spec, l, pc.rates.device, pc.rates.achievable);
    INFO(d->name);
    CHECK(other.split.bubble > top.time.split.bubble);
    CHECK(other.split.total - top.time.split.total == Approx(other.split.bubble - top.time.split.bubble).epsilon(1e-9));
  }
}

TEST_CASE("plan: expert parallelism is searched for a mixture of experts, its peak the trainer's prediction",
          "[plan][ep]") {
  PlanConfig pc = plan_for("qwen3-moe-small", 8, uint64_t{80} << 30, DType::f32);
  pc.global_batch = 8;
  PlanPins& p = pc.pins;
  p.strategy = StrategyKind::zero3, p.offload = Offload::none, p.checkpointing = Checkpointing::none;
  p.micro_batch = 1, p.sequence_parallel = false, p.pp = 1, p.tp = 1, p.cp = 1;
  pc.exhaustive = true;
  const PlanResult all = make_plan(pc);
  std::vector<int> eps;
  for (const PlanEntry& e : all.entries) {
    REQUIRE(e.predicted);
    const int ep = e.layout.dims.ep;
    if (std::find(eps.begin(), eps.end(), ep) == eps.end()) eps.push_back(ep);
    CHECK(e.peak == predict_step(e.config(pc), pc.world, 0, e.micro_batch).peak);
    if (ep > 1) CHECK(e.label().find(fmt::format(" ep {}", ep)) != std::string::npos);
  }
  std::sort(eps.begin(), eps.end());
  CHECK(eps == std::vector<int>{1, 2, 4, 8});  // the 16 experts over any part of the 8 ranks
  // Pinned: that ep alone, and one the experts do not divide refused by name.
  p.ep = 4;
  for (const PlanEntry& e : make_plan(pc).entries) CHECK(e.layout.dims.ep == 4);
  PlanConfig mixtral = plan_for("mixtral-tiny", 8, uint64_t{80} << 30, DType::f32);
  mixtral.pins.ep = 3;
  CHECK_THROWS_WITH(make_plan(mixtral), Catch::Contains("--ep 3"));
  // A dense model has no experts to split: never searched.
  PlanConfig dense = plan_for("llama-small", 8, uint64_t{80} << 30, DType::f32);
  dense.pins = p;
  dense.pins.ep.reset();
  for (const PlanEntry& e : make_plan(dense).entries) CHECK(e.layout.dims.ep == 1);
}

TEST_CASE("plan: the bound that rules layouts out is under every stage's predicted peak", "[plan]") {
  // Exhaustive walks predict every layout and check each stage's peak against its bound (model
  // states, the activations of the micro-batches in flight, a gathered block): an InternalError
  // if a bound were over. Both families, the scores kept (no fused kernel), experts, pipelines,
  // context parallelism, f32 and bf16; bf16 saved activations; a GPU's step (its products' operands
  // saved in bf16, cuDNN's too), as plan predicts for its --gpu presets.
  struct Case {
    const char* preset;
    int world;
    int64_t seq;
    AttentionKernel attention;
    DType dt;
    DType activations = DType::f32;
    Device device = Device::cpu;
  };
  for (const Case& c : {Case{"tiny", 8, 0, AttentionKernel::flash, DType::bf16},
                        Case{"tiny", 4, 0, AttentionKernel::naive, DType::f32},
                        Case{"llama-tiny", 8, 512, AttentionKernel::flash, DType::bf16},
                        Case{"qwen3-moe-tiny", 4, 0, AttentionKernel::flash, DType::bf16},
                        Case{"tiny", 4, 0, AttentionKernel::naive, DType::bf16, DType::bf16},
                        Case{"tiny", 8, 0, AttentionKernel::cudnn, DType::bf16, DType::f32, Device::cuda},
                        Case{"llama-tiny", 4, 0, AttentionKernel::cudnn, DType::bf16, DType::bf16, Device::cuda}}) {
    CAPTURE(c.preset, c.world, attention_kernel_name(c.attention), dtype_name(c.activations), device_name(c.device));
    PlanConfig pc = plan_for(c.preset, c.world, uint64_t{1} << 40, c.dt);
    if (c.seq) pc.train.spec.seq = c.seq;
    pc.train.spec.attention = c.attention;
    pc.train.spec.activation_dtype = c.activations;
    pc.train.device = c.device;
    pc.exhaustive = true;
    const PlanResult plan = make_plan(pc);
    CHECK(plan.predictions > 100);
    CHECK(plan.walked == plan.candidates);
  }
}

// Korthikanti et al. 2022's 1T row (Table 3: 128 layers, 25,600 wide, 160 heads, T 2,048, 512 A100
// 80GB at tp 8 x pp 64, sequence parallelism and selective recomputation, micro-batch 1, batch 512):
// pinned, it fits an A100's budget (80 GiB less 2 for the context) only with its activations saved in
// 2 bytes, as Megatron keeps them; in f32 the stage's activations in flight alone are about 50 GiB.
TEST_CASE("plan: Megatron's published 1T row fits 80 GB with bf16 activations, not with f32", "[plan]") {
  PlanConfig pc;
  ModelSpec& s = pc.train.spec;
  s = model_preset("gpt2");
  s.name = "megatron-1t";
  s.layers = 128, s.dim = 25600, s.heads = 160, s.seq = 2048, s.vocab = 51200;
  s.attention = AttentionKernel::naive;  // the paper's attention keeps its probabilities
  pc.train.strategy.precision.param_dtype = pc.train.strategy.precision.reduce_dtype = DType::bf16;
  pc.train.device = Device::cuda;  // as plan predicts for a --gpu preset
  pc.world = 512;
  pc.device_memory = uint64_t{78} << 30;
  pc.global_batch = 512;
  PlanPins& p = pc.pins;
  p.tp = 8, p.pp = 64, p.dp_shard = 1, p.schedule = parse_pp_schedule("1f1b"), p.sequence_parallel = true;
  p.strategy = StrategyKind::ddp, p.checkpointing = Checkpointing::attention, p.offload = Offload::none;
  p.micro_batch = 1;
  const PlanResult f32 = make_plan(pc);
  REQUIRE(f32.entries.size() == 1);
  CHECK_FALSE(f32.entries[0].fits);
  s.activation_dtype = DType::bf16;
  const PlanResult bf16 = make_plan(pc);
  REQUIRE(bf16.entries.size() == 1);
  const PlanEntry& e = bf16.entries[0];
  std::printf("megatron 1T, tp 8+sp pp 64 1f1b, selective recomputation, bf16 activations: peak %.2f GiB of 78\n",
              double(e.peak) / (1 << 30));
  CHECK(e.label() == "tp 8+sp pp 64 1f1b dp 1 ddp");
  CHECK(e.fits);
  CHECK(e.peak < pc.device_memory);
}
