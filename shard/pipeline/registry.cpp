// registry.cpp — the list of schedules and what every caller asks of them (registry.hpp).
#include "shard/pipeline/registry.hpp"

#include <fmt/format.h>

#include "src/core/check.hpp"
#include "src/core/suggest.hpp"

namespace shardlab {

// Each schedule's file (schedules/<name>.cpp) defines its entry.
const PpScheduleDef& gpipe_schedule();
const PpScheduleDef& one_f_one_b_schedule();
const PpScheduleDef& interleaved_1f1b_schedule();
const PpScheduleDef& zb_h1_schedule();
const PpScheduleDef& zb_v_schedule();

// The one list naming them all, in the order --help and messages give them. Explicit rather than
// self-registering: a static library leaves out an object file nothing refers to.
std::span<const PpScheduleDef* const> pp_schedules() {
  static const PpScheduleDef* const all[] = {&gpipe_schedule(), &one_f_one_b_schedule(),
                                             &interleaved_1f1b_schedule(), &zb_h1_schedule(),
                                             &zb_v_schedule()};
  return all;
}

namespace {

// "a, b or c" of the entries that pass `keep`.
template <class Keep>
std::string names_of(Keep keep) {
  std::vector<std::string> names;
  for (const PpScheduleDef* d : pp_schedules())
    if (keep(*d)) names.push_back(d->name);
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

bool runs_virtual(const PpScheduleDef& d, int virtual_stages) {
  if (d.v_shape) return virtual_stages == 2;
  return d.virtual_stages ? virtual_stages >= 2 : virtual_stages == 1;
}

}  // namespace

PpSchedule::PpSchedule() : def_(&*default_pp_schedule()) {}

std::string PpScheduleDef::label(int v) const {
  return virtual_stages ? fmt::format("{} v{}", short_name ? short_name : name, v) : std::string(name);
}

PpSchedule parse_pp_schedule(const std::string& s) {
  std::vector<std::string> names;
  for (const PpScheduleDef* d : pp_schedules()) {
    if (s == d->name) return PpSchedule(*d);
    names.push_back(d->name);
  }
  throw InputError(fmt::format("unknown pipeline schedule '{}': expected {}{}", s,
                               names_of([](const PpScheduleDef&) { return true; }), did_you_mean(s, names)));
}

PpSchedule default_pp_schedule(int virtual_stages) {
  for (const PpScheduleDef* d : pp_schedules())
    if (d->default_choice && runs_virtual(*d, virtual_stages)) return PpSchedule(*d);
  throw InputError(fmt::format("no pipeline schedule runs --pp-virtual {}", virtual_stages));
}

std::string pp_schedule_help() {
  std::vector<std::string> parts;
  for (const PpScheduleDef* d : pp_schedules()) parts.push_back(fmt::format("{} ({})", d->name, d->help));
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i == 0 ? "" : i + 1 == parts.size() ? " or " : ", ") + parts[i];
  return out;
}

void require_pp_schedule(PpSchedule s, int pp, int virtual_stages, int64_t micro_batches) {
  const PpScheduleDef& d = *s;
  SHARD_REQUIRE(!d.v_shape || virtual_stages == 2,
                "--pp-schedule {} runs two chunks per rank, placed in a V: give --pp-virtual 2 (got {})", d.name,
                virtual_stages);
  SHARD_REQUIRE(!d.virtual_stages || virtual_stages >= 2,
                "--pp-schedule {} needs --pp-virtual 2 or more (got {}); with one chunk per rank use {}", d.name,
                virtual_stages, names_of([](const PpScheduleDef& e) { return e.default_choice && !e.virtual_stages; }));
  SHARD_REQUIRE(d.virtual_stages || virtual_stages == 1,
                "--pp-virtual {} with --pp-schedule {}: only {} runs virtual stages", virtual_stages, d.name,
                names_of([](const PpScheduleDef& e) { return e.virtual_stages; }));
  if (micro_batches <= 0 || !d.micro_batches_multiple_of_pp || micro_batches % pp == 0) return;
  const int64_t below = micro_batches / pp * pp;
  throw InputError(fmt::format("--pp-schedule {}: --micro-batches {} is not a multiple of --pp {} ({}); give {}",
                               d.name, micro_batches, pp, d.why_multiple,
                               below == 0 ? fmt::format("{} or more", pp) : fmt::format("{} or {}", below, below + pp)));
}

bool pp_schedule_allows(PpSchedule s, int pp, int virtual_stages, int64_t micro_batches) {
  return runs_virtual(*s, virtual_stages) &&
         (micro_batches <= 0 || !s->micro_batches_multiple_of_pp || micro_batches % pp == 0);
}

}  // namespace shardlab
