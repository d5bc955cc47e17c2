// plan_progress.hpp — the search's progress on stderr: how far the walk through the sorted layouts
// is, and an estimate of the time left. The walk's end is not known in advance (it stops when `keep`
// configurations fit, wherever in the list they are), so the time left is a guess from the pace so
// far, and the line says it is one.
#pragma once
#include <cstddef>
#include <cstdio>
#include <string>

namespace shardlab {

// Where the walk stands.
struct WalkState {
  size_t walked = 0, candidates = 0, predictions = 0, fit = 0, keep = 0;
  bool exhaustive = false;      // the walk goes to the end of the list
  double elapsed_s = 0;         // since the search began
  size_t first_fit_walked = 0;  // `walked` when the first configuration that fits was found; 0: none yet
  double first_fit_s = 0;       // `elapsed_s` then
  double first_fit_cost_s = 0;  // the seconds its settling took (every stage's whole step predicted)
  double fit_cost_max_s = 0;    // the longest settling of one that fits
};

// The time left, estimated. An exhaustive walk: the rest of the list at the seconds per layout so
// far. Otherwise the walk ends once `keep` fit, and each that fits costs a whole step predicted on
// every distinct stage, so:
//   - before the first fit there is no estimate, only the rest of the list at this pace (where the
//     walk ends at the latest, hours for a large search that ends in seconds);
//   - from the first: the seconds since it (and its own settling) per layout that fit, for each
//     still to fit;
//   - from the second: the lesser of the layouts still to walk for the rest to fit, at the rate
//     fits came since the first and the seconds per layout since then, and 1.3 times the longest
//     settling of one that fit for each still to fit (fits come faster near the answer: the
//     layouts between them are ruled out by their bounds).
// Never more than the rest of the list at the pace so far (where the walk ends at the latest).
// Measured against the truth, docs/planning.md "Progress".
struct WalkEstimate {
  double seconds_left = 0;
  bool whole_list = false;  // the estimate is the rest of the list's (nothing fits yet, or exhaustive)
};
WalkEstimate estimate_walk_left(const WalkState& w);

// "plan: 4000 of 53370 layouts walked (7%), 1234 memory predictions, 0 of 15 fit, 12 s; nothing
// fits yet, so no estimate of the time left: the walk ends once 15 fit (at the latest, the rest of
// the list: about 150 s at this pace)"
std::string progress_text(const WalkState& w);
// The same in short, for a terminal's one line: "plan: 4000/53370 walked, 0/15 fit, 12 s; no
// estimate before a fit (list <= ~150 s)"
std::string progress_brief(const WalkState& w);

// The line's cadence. On a terminal one short line, rewritten in place every second and cut to the
// terminal's width (a wrapped line would not be rewritten); otherwise (a log file, a pipe) a line
// every 10 s, so a long search leaves a few lines, not one per 2 s. The time is the state's
// elapsed_s, so a test drives it without a clock.
class WalkProgress {
 public:
  static constexpr double kTerminalEvery = 1, kLogEvery = 10;  // seconds
  // out null: prints nothing. columns: the terminal's width, 0 for a log.
  WalkProgress(std::FILE* out, int columns);
  void update(const WalkState& w);  // prints when one is due
  void finish();                    // clears the terminal's line (a log keeps its lines)

 private:
  std::FILE* out_;
  int columns_;
  double every_, next_;
  bool shown_ = false;
};

// The width of the terminal `f` writes to (80 where it does not say); 0 when it is not a terminal.
int terminal_columns(std::FILE* f);

}  // namespace shardlab
