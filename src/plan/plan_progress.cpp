// plan_progress.cpp — the search's progress line and its estimate of the time left (plan_progress.hpp).
#include "src/plan/plan_progress.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

namespace shardlab {

WalkEstimate estimate_walk_left(const WalkState& w) {
  if (w.walked == 0 || w.walked >= w.candidates) return {0, true};
  const double rest = double(w.candidates - w.walked);
  const double pace = w.elapsed_s / double(w.walked);  // seconds per layout walked, so far
  if (w.exhaustive || w.fit == 0 || w.first_fit_walked == 0) return {rest * pace, true};
  if (w.fit >= w.keep) return {0, false};
  const double to_fit = double(w.keep - w.fit);
  double left = to_fit * (w.elapsed_s - w.first_fit_s + w.first_fit_cost_s) / double(w.fit);
  if (w.fit >= 2 && w.walked > w.first_fit_walked) {
    // Since the first fit: n layouts walked, w.fit - 1 of them fit, in elapsed_s - first_fit_s.
    const double n = double(w.walked - w.first_fit_walked);
    const double by_rate = std::min(to_fit * n / double(w.fit - 1), rest) * (w.elapsed_s - w.first_fit_s) / n;
    left = std::min(by_rate, to_fit * 1.3 * w.fit_cost_max_s);
  }
  return {std::min(left, rest * pace), false};  // never past the rest of the list at this pace
}

std::string progress_text(const WalkState& w) {
  const WalkEstimate left = estimate_walk_left(w);
  std::string s = fmt::format("plan: {} of {} layouts walked ({:.0f}%), {} memory predictions, {} of {} fit, {:.0f} s; ",
                              w.walked, w.candidates, w.candidates ? 100.0 * double(w.walked) / double(w.candidates) : 0.0,
                              w.predictions, w.fit, w.keep, w.elapsed_s);
  if (w.exhaustive)
    return s + fmt::format("about {:.0f} s left (an estimate: the rest of the list at this pace)", left.seconds_left);
  if (left.whole_list)
    return s + fmt::format("nothing fits yet, so no estimate of the time left: the walk ends once {} fit (at the "
                           "latest, the rest of the list: about {:.0f} s at this pace)", w.keep, left.seconds_left);
  return s + fmt::format("about {:.0f} s left (an estimate: {} more to fit, each a whole step predicted, at the pace "
                         "since the first fit)", left.seconds_left, w.keep - std::min(w.fit, w.keep));
}

std::string progress_brief(const WalkState& w) {
  const WalkEstimate left = estimate_walk_left(w);
  std::string s = fmt::format("plan: {}/{} walked, {}/{} fit, {:.0f} s; ", w.walked, w.candidates, w.fit, w.keep,
                              w.elapsed_s);
  if (w.exhaustive || !left.whole_list) return s + fmt::format("~{:.0f} s left (estimate)", left.seconds_left);
  return s + fmt::format("no estimate before a fit (list <= ~{:.0f} s)", left.seconds_left);
}

WalkProgress::WalkProgress(std::FILE* out, int columns)
    : out_(out), columns_(columns), every_(columns > 0 ? kTerminalEvery : kLogEvery), next_(every_) {}

void WalkProgress::update(const WalkState& w) {
  if (!out_ || w.elapsed_s < next_) return;
  next_ = w.elapsed_s + every_;
  if (columns_ > 0) {
    // Back to the line's start, the text within the width, and the rest of the old line cleared.
    std::string line = progress_brief(w);
    if (line.size() >= static_cast<size_t>(columns_)) line.resize(static_cast<size_t>(columns_ - 1));
    std::fprintf(out_, "\r%s\033[K", line.c_str());
  } else {
    std::fprintf(out_, "%s\n", progress_text(w).c_str());
  }
  std::fflush(out_);
  shown_ = true;
}

void WalkProgress::finish() {
  if (!out_ || columns_ == 0 || !shown_) return;
  std::fprintf(out_, "\r\033[K");
  std::fflush(out_);
  shown_ = false;
}

int terminal_columns(std::FILE* f) {
  if (!f || isatty(fileno(f)) != 1) return 0;
  winsize ws{};
  return ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 80;
}

}  // namespace shardlab
