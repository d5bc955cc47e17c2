// TEMPORARY stub for the lead's testing; replaced by the helper's pipeline.cpp.
#include "src/train/pipeline.hpp"
#include <fmt/format.h>
#include <sstream>
#include "src/core/check.hpp"
namespace shardlab {
PpSchedule parse_pp_schedule(const std::string& s) {
  if (s == "gpipe") return PpSchedule::gpipe;
  if (s == "1f1b") return PpSchedule::one_f_one_b;
  if (s == "interleaved-1f1b") return PpSchedule::interleaved;
  throw InputError("bad schedule " + s);
}
const char* pp_schedule_name(PpSchedule s) { return s == PpSchedule::gpipe ? "gpipe" : s == PpSchedule::one_f_one_b ? "1f1b" : "interleaved-1f1b"; }
int StageSplit::begin(int chunk) const { int b = 0; for (int c = 0; c < chunk; ++c) b += counts[c]; return b; }
int StageSplit::chunk_of_unit(int unit) const { int b = 0; for (int c = 0; c < chunks(); ++c) { b += counts[c]; if (unit < b) return c; } return -1; }
std::vector<int> StageSplit::chunks_of(int r) const { std::vector<int> v; for (int c = r; c < chunks(); c += pp) v.push_back(c); return v; }
std::vector<int> StageSplit::units_of(int r) const { std::vector<int> v; for (int c : chunks_of(r)) for (int u = begin(c); u < begin(c) + count(c); ++u) v.push_back(u); return v; }
std::string StageSplit::describe() const { return ""; }
std::string StageSplit::describe(const std::vector<std::string>&) const { return ""; }
StageSplit explicit_split(const std::vector<int>& counts, int pp, int v, int) { return StageSplit{pp, v, counts}; }
StageSplit balanced_split(const std::vector<double>& cost, int pp, int v) {
  int n = pp * v, U = (int)cost.size(); StageSplit s{pp, v, {}};
  for (int c = 0; c < n; ++c) s.counts.push_back(U / n + (c < U % n ? 1 : 0));
  return s;
}
std::vector<int> parse_pp_split(const std::string& s) { std::vector<int> v; std::stringstream ss(s); std::string x; while (std::getline(ss, x, ',')) v.push_back(std::stoi(x)); return v; }
std::string describe(const PipeAction& a) { return fmt::format("{}{}c{}", a.kind == PipeAction::forward ? "F" : "B", a.micro, a.chunk); }
int PipeSchedule::in_flight(int) const { return 0; }
std::string PipeSchedule::describe() const { return ""; }
PipeSchedule build_schedule(PpSchedule kind, int pp, int v, int M) {
  PipeSchedule s; s.kind = kind; s.pp = pp; s.virtual_stages = v; s.micro_batches = M; s.ranks.resize(pp);
  for (int r = 0; r < pp; ++r) {
    auto& L = s.ranks[r];
    if (kind == PpSchedule::gpipe) { for (int m = 0; m < M; ++m) L.push_back({PipeAction::forward, r, m}); for (int m = 0; m < M; ++m) L.push_back({PipeAction::backward, r, m}); continue; }
    int warm = std::min(M, pp - r), f = 0, b = 0;
    for (; f < warm; ++f) L.push_back({PipeAction::forward, r, f});
    while (b < M) { L.push_back({PipeAction::backward, r, b++}); if (f < M) L.push_back({PipeAction::forward, r, f++}); }
  }
  return s;
}
void check_schedule(const PipeSchedule&) {}
double bubble_fraction(PpSchedule, int pp, int v, int M) { return double(pp - 1) / (v * M + pp - 1); }
}
