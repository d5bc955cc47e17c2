#include "src/checkpoint/checkpoint.hpp"
#include "src/checkpoint/checkpoint_format.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <string_view>

#include "src/comm/watchdog.hpp"
#include "src/core/hash.hpp"
#include "src/model/family.hpp"
#include "src/model/safetensors.hpp"

namespace shardlab {
namespace fs = std::filesystem;

// ---- Loading ------------------------------------------------------------------------------------

namespace {

void check_compatible(const Manifest& m, const CheckpointState& state, const std::string& path) {
  const StepConfig& c = state.step;
  // Every field of the spec but its name: family, sizes, and what the family's units compute.
  nlohmann::json there = spec_to_json(m.model), here = spec_to_json(c.spec);
  for (auto* j : {&there, &here}) {
    j->erase("name");
    // Whether the balancing loss is in the objective is how the model trains, not what it is:
    // check_schedule compares it with the optimizer's settings.
    if (j->contains("moe")) (*j)["moe"].erase("aux_loss");
  }
  for (const auto* j : {&there, &here})
    for (auto it = j->begin(); it != j->end(); ++it) {
      const char* k = it.key().c_str();
      const std::string a = there.contains(k) ? there[k].dump() : "(unset)", b = here.contains(k) ? here[k].dump() : "(unset)";
      SHARD_REQUIRE(a == b, "checkpoint '{}' is of another model: {} {} there, {} here (model {} vs {}); without "
                    "--model and size flags a resume takes the checkpoint's", path, k, a, b, m.model.name,
                    c.spec.describe());
    }
  SHARD_REQUIRE(m.shuffle == state.shuffle, "checkpoint '{}' was trained {} --shuffle, this run is {} it: the batch order "
                "would change (pass the same setting)", path, m.shuffle ? "with" : "without", state.shuffle ? "with" : "without");
  SHARD_REQUIRE(!state.shuffle || m.seed == c.seed, "checkpoint '{}' shuffled its batches with --seed {}, this run has --seed "
                "{}: the order would change (pass --seed {})", path, m.seed, c.seed, m.seed);
  SHARD_REQUIRE(state.run_id.empty() || m.run_id.empty() || m.run_id == state.run_id, "checkpoint '{}' belongs to run "
                "'{}'; this run is --run-id '{}': another run's checkpoint (pass --run-id {} to continue that run, or "
                "another --save-dir)", path, m.run_id, state.run_id, m.run_id);
  SHARD_REQUIRE(m.optimizer.kind == optimizer_name(c.optim.kind),
                "checkpoint '{}' holds {} state; this run uses --optimizer {}", path, m.optimizer.kind,
                optimizer_name(c.optim.kind));
}

std::string describe(const DataSource& s) {
  return s.path == "synthetic" ? "synthetic" : fmt::format("'{}' ({} bytes, {})", s.path, s.bytes, s.hash);
}
std::string describe_val(const DataRecord& d) {
  if (d.val_data) return fmt::format("--val-data {}", describe(*d.val_data));
  if (d.val_fraction != 0) return fmt::format("--val-fraction {}", d.val_fraction);
  return "no validation split";
}

// The tokens, batch and validation split: with the step, they say which sequences come next.
// Returns a note when the manifest predates the record (nothing to compare).
std::string check_data(const Manifest& m, const CheckpointState& state, const std::string& path) {
  if (!state.data) return "";
  if (!m.data)
    return fmt::format("checkpoint '{}' records no data source, batch or validation split (written before shardlab "
                       "recorded them): resuming without checking --data, --batch and the validation split", path);
  const DataRecord &was = *m.data, &now = *state.data;
  SHARD_REQUIRE(!(was.train.path != "synthetic" && now.train.path == "synthetic"),
                "checkpoint '{}' was trained on --data {}; this run has --data synthetic (the default when --data is "
                "not given): pass --data '{}'", path, describe(was.train), was.train.path);
  std::string note;
  if (!was.train.same_tokens(now.train)) {
    const bool grown = now.train.grown_from(was.train);
    SHARD_REQUIRE(grown || !state.allow_data_growth || was.train.files.empty(),
                  "--allow-data-growth: checkpoint '{}' was trained on --data {} ({} files); this run's --data is {} "
                  "({} files): not those files, unchanged and first, with more after them", path,
                  describe(was.train), was.train.files.size(), describe(now.train), now.train.files.size());
    SHARD_REQUIRE(!state.allow_data_growth || !was.train.files.empty(),
                  "--allow-data-growth: checkpoint '{}' records --data {} as a whole, not file by file (one file, or "
                  "written before shardlab recorded each): its growth cannot be checked; pass the same data",
                  path, describe(was.train));
    SHARD_REQUIRE(grown && state.allow_data_growth,
                  "checkpoint '{}' was trained on --data {}; this run's --data is {}: it would continue at step {} on "
                  "other tokens (pass the same data{})", path, describe(was.train), describe(now.train), m.step,
                  grown && was.val_fraction == 0
                      ? fmt::format(", or --allow-data-growth: its {} files are the checkpoint's followed by {} new",
                                    now.train.files.size(), now.train.files.size() - was.train.files.size())
                      : "");
    SHARD_REQUIRE(was.val_fraction == 0, "--allow-data-growth: checkpoint '{}' holds out --val-fraction {} of its "
                  "stream's tail for validation, which would move into what was trained on: a run with --val-fraction "
                  "cannot grow its data (one with --val-data can)", path, was.val_fraction);
    note = fmt::format("--data grew (--allow-data-growth): {} files, {} bytes -> {} files, {} bytes; step {} on reads "
                       "the longer stream ({})", was.train.files.size(), was.train.bytes, now.train.files.size(),
                       now.train.bytes, m.step + 1,
                       state.shuffle ? "the epoch in progress is drawn anew over it: sequences it already gave may "
                                       "come again"
                                     : "in order: the new files' sequences after the checkpoint's");
  }
  SHARD_REQUIRE(was.batch == now.batch, "checkpoint '{}' was trained with --batch {}; this run has --batch {}: step "
                "{}'s batch would be other sequences (pass --batch {})", path, was.batch, now.batch, m.step, was.batch);
  SHARD_REQUIRE(was.seq == now.seq, "checkpoint '{}' was trained with sequences of {} tokens; this run has --seq {}",
                path, was.seq, now.seq);
  const bool same_val = was.val_fraction == now.val_fraction && was.val_data.has_value() == now.val_data.has_value() &&
                        (!was.val_data || was.val_data->same_tokens(*now.val_data));
  SHARD_REQUIRE(same_val, "checkpoint '{}' was trained with {}; this run has {} (pass the same validation split)", path,
                describe_val(was), describe_val(now));
  return note;
}

// The schedule, gradient clip and optimizer hyper-parameters: another value changes the learning
// rate or the update from the next step on. Schedule fields that differ but give the same learning
// rate at every step left to run (a horizon moved while still in the warmup) pass; anything else is
// refused unless state.allow_schedule_change, and then noted. A manifest without the record: a note.
std::string check_schedule(const Manifest& m, const CheckpointState& state, const std::string& path) {
  if (state.steps <= m.step) return "";  // no step left to run (sample loads a checkpoint this way)
  if (!m.schedule)
    return fmt::format("checkpoint '{}' records no learning-rate schedule (written before shardlab recorded it): "
                       "resuming without checking --lr and the schedule", path);
  const ManifestSchedule& was = *m.schedule;
  const StepConfig& c = state.step;
  const LrSchedule& now = c.schedule;
  std::vector<std::string> changed;
  auto compare = [&changed](const char* flag, double a, float b) {
    if (static_cast<float>(a) != b) changed.push_back(fmt::format("{} {} -> {}", flag, static_cast<float>(a), b));
  };
  if (was.kind != schedule_name(now.kind)) changed.push_back(fmt::format("--schedule {} -> {}", was.kind, schedule_name(now.kind)));
  compare("--lr", was.lr, now.lr);
  if (was.warmup_steps != now.warmup_steps)
    changed.push_back(fmt::format("--warmup-steps {} -> {}", was.warmup_steps, now.warmup_steps));
  if (was.decay_steps != now.total_steps)
    changed.push_back(fmt::format("the cosine's last step (--lr-decay-steps, else --steps) {} -> {}", was.decay_steps,
                                  now.total_steps));
  compare("--min-lr-frac", was.min_lr_frac, now.min_lr_frac);
  const size_t schedule_changes = changed.size();  // the rest change the update itself
  const ManifestOptimizer& o = m.optimizer;
  compare("--grad-clip", was.grad_clip, c.grad_clip);
  compare("--beta1", o.beta1, c.optim.beta1);
  compare("--beta2", o.beta2, c.optim.beta2);
  compare("--eps", o.eps, c.optim.eps);
  compare("--weight-decay", o.weight_decay, c.optim.weight_decay);
  compare("--momentum", o.momentum, c.optim.momentum);
  if (m.model.moe.enabled() && m.model.moe.aux_loss != c.spec.moe.aux_loss)
    changed.push_back(fmt::format("--moe-aux-loss {} -> {} (the load-balancing loss {} the objective)",
                                  m.model.moe.aux_loss ? "on" : "off", c.spec.moe.aux_loss ? "on" : "off",
                                  c.spec.moe.aux_loss ? "enters" : "leaves"));
  compare("--moe-bias-update-rate", m.model.moe.bias_rate, c.spec.moe.bias_rate);
  if (o.muon_ns_steps > 0) {  // Muon's iteration
    const MuonConfig& mu = c.optim.muon;
    if (o.muon_ns_steps != mu.ns_steps)
      changed.push_back(fmt::format("--muon-ns-steps {} -> {}", o.muon_ns_steps, mu.ns_steps));
    if (o.muon_ns_dtype != dtype_name(mu.ns_dtype))
      changed.push_back(fmt::format("--muon-ns-dtype {} -> {}", o.muon_ns_dtype, dtype_name(mu.ns_dtype)));
    if (o.muon_adjust_lr != muon_adjust_lr_name(mu.adjust_lr))
      changed.push_back(fmt::format("--muon-adjust-lr {} -> {}", o.muon_adjust_lr, muon_adjust_lr_name(mu.adjust_lr)));
  }
  if (changed.empty()) return "";
  const bool update_changed = changed.size() > schedule_changes;
  LrSchedule old;
  old.kind = parse_schedule(was.kind);
  old.lr = static_cast<float>(was.lr), old.min_lr_frac = static_cast<float>(was.min_lr_frac);
  old.warmup_steps = was.warmup_steps, old.total_steps = was.decay_steps;
  int64_t first = m.step;  // the first step left whose learning rate differs
  while (first < state.steps && now.at(first) == old.at(first)) ++first;
  if (first == state.steps && !update_changed) return "";
  const std::string what =
      first == state.steps ? fmt::format("{}", fmt::join(changed, ", "))
                           : fmt::format("{}; at step {} the learning rate is {:.4g} where the checkpoint's schedule "
                                         "gives {:.4g}", fmt::join(changed, ", "), first + 1, now.at(first), old.at(first));
  SHARD_REQUIRE(state.allow_schedule_change, "checkpoint '{}' was trained with other optimizer settings: {}. Pass the "
                "checkpoint's values (a run extended to more steps keeps its cosine with --lr-decay-steps {}), or "
                "--allow-schedule-change to go on with the new ones", path, what, was.decay_steps);
  return fmt::format("resuming '{}' with changed optimizer settings (--allow-schedule-change): {}", path, what);
}

}  // namespace

RunPosition load_checkpoint(const std::string& path, const CheckpointState& state) {
  const fs::path dir(path);
  const Manifest m = read_manifest(dir);
  Strategy& st = state.strategy;
  const auto names = st.owned_state_names();
  check_compatible(m, state, path);
  std::string note = check_data(m, state, path);
  if (const std::string n = check_schedule(m, state, path); !n.empty()) note += (note.empty() ? "" : "\n") + n;
  CheckpointFiles files(dir, m.files);
  const auto& units = state.units;
  for (size_t u = 0; u < units.size(); ++u) {
    auto [a, b] = st.owned_range(u);
    if (b <= a) continue;
    auto tensors = st.owned_state(u);
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::vector<float> host(static_cast<size_t>(b - a));
      read_unit_state(m, files, units[u]->layout(), a, b, names[i], host, path);
      state.backend.copy(tensors[i].slice(0, b - a), Tensor::of(std::span<float>(host)));
    }
    st.state_views_written();  // what was staged for this unit (Muon's v) back where it lives
  }
  st.sync_after_load();
  RunPosition at{m.step, m.data_position, std::nullopt, note, m.run_id};
  if (m.val_loss) at.val_loss = static_cast<float>(*m.val_loss);
  return at;
}

}  // namespace shardlab
