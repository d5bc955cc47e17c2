// registry.hpp — the pipeline schedules by name: each one's requirements, its action lists, its
// bubble and what the planner asks of it, declared in one file under shard/pipeline/schedules/
// and listed once in registry.cpp. Code outside shard/pipeline holds a PpSchedule (a handle to its
// entry) parsed once at the edge (parse_pp_schedule) and asks the entry; it never names a schedule.
//
// A new schedule is a file in schedules/ defining its PpScheduleDef, its line in registry.cpp's
// list, its line in CMakeLists.txt and its tests; train, plan, profile and --help follow.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace shardlab {

// A backward is the whole backward of a chunk's micro-batch, or, in a schedule that splits it
// (PpScheduleDef::splits_backward), only the gradient of its input (B: what the previous stage waits
// for); a weight action (W) then computes the same micro-batch's weight gradients later.
struct PipeAction {
  enum Kind : uint8_t { forward, backward, weight } kind;
  int chunk;  // the global chunk (0 .. P x V - 1)
  int micro;  // 0 .. M - 1
  bool operator==(const PipeAction&) const = default;
};
std::string describe(const PipeAction& a);  // "F3c1" (forward of micro-batch 3, chunk 1), "B3c1", "W3c1"

// One schedule. P pipeline ranks, V chunks (virtual stages) per rank, M micro-batches.
struct PpScheduleDef {
  const char* name;   // what --pp-schedule takes and outputs print
  const char* help;   // --help's note on it, after its name
  // Requirements (require_pp_schedule): V >= 2 chunks per rank (else exactly 1); M a multiple of P,
  // and why (an error's reason).
  bool virtual_stages = false;
  bool micro_batches_multiple_of_pp = false;
  // Zero-bubble schedules: backwards compute the input's gradient only, and each (chunk, micro)
  // has a weight action, after its backward, in the order of the backwards on its rank.
  bool splits_backward = false;
  // Chunks placed in a V (schedule.hpp): exactly two per rank (--pp-virtual 2).
  bool v_shape = false;
  // Receives posted ahead (check_schedule): 0, the next forward's and next backward's of the rank's
  // list; n > 0, for each of the rank's chunks its next n forwards' and n backwards'.
  int post_per_chunk = 0;
  const char* why_multiple = "";
  // The schedule used when none is named, among those that run a layout's V (1f1b for one chunk).
  bool default_choice = false;
  // The planner: the V it tries, its place among equally fast layouts (lower first) and the short
  // name of its table ("interleaved v8" for `short_name` "interleaved"; the name without V).
  std::vector<int> plan_virtual = {1};
  int plan_order = 0;
  const char* short_name = nullptr;
  // Rank r's actions of one step, in the order it runs them (build_schedule checks them).
  std::vector<PipeAction> (*actions)(int r, int P, int V, int M) = nullptr;
  // Theory, equal stage times and backward = 2 x forward (split evenly into B and W where the
  // schedule splits it): the bubble's share of a step, and its formula as text ("(P-1)/(M+P-1)").
  double (*bubble_fraction)(int P, int V, int M) = nullptr;
  const char* bubble_formula = "";
  // The theory is a lower bound the order approaches rather than its exact bubble (zb-v's list
  // scheduling; the others' are exact).
  bool bubble_is_bound = false;
  // The time model's bubble in stage times (one micro-batch's forward and backward on the slowest
  // stage), p stages, v chunks each and m micro-batches (plan_time.hpp).
  double (*bubble_stages)(double p, double v, double m) = nullptr;
  // What to warn about in a runnable but poor combination ("" for nothing): the train header's.
  std::string (*warning)(int P, int V, int M) = nullptr;
  std::string label(int v) const;  // the planner's: "1f1b", "interleaved v8"
};

// A schedule: a handle to its registry entry (the default schedule unless given one).
class PpSchedule {
 public:
  PpSchedule();
  explicit PpSchedule(const PpScheduleDef& d) : def_(&d) {}
  const PpScheduleDef* operator->() const { return def_; }
  const PpScheduleDef& operator*() const { return *def_; }
  const char* name() const { return def_->name; }
  bool operator==(const PpSchedule& o) const { return def_ == o.def_; }

 private:
  const PpScheduleDef* def_;
};

// Every schedule, in the order --help and messages list them.
std::span<const PpScheduleDef* const> pp_schedules();
// By name; InputError naming the choices otherwise (with a did-you-mean).
PpSchedule parse_pp_schedule(const std::string& s);
// The default schedule of a layout with V chunks per rank (InputError when none runs V).
PpSchedule default_pp_schedule(int virtual_stages = 1);
// --help's text: "gpipe (...), 1f1b (...) or interleaved-1f1b (...)".
std::string pp_schedule_help();

// The schedule's requirements: one rule for train, plan and the time model. InputError naming the
// flags; micro_batches 0 = not known yet (the virtual stages only). pp_schedule_allows: the same
// without the error.
void require_pp_schedule(PpSchedule s, int pp, int virtual_stages, int64_t micro_batches);
bool pp_schedule_allows(PpSchedule s, int pp, int virtual_stages, int64_t micro_batches);

}  // namespace shardlab
