// schedule.cpp — stage splits, a schedule built from its registry entry, and the simulation that
// checks it (schedule.hpp).
//
// The check and simulated_bubble share one simulation of the runner's point-to-point semantics:
// a monotone system (receives and sends, once posted, stay posted), so advancing every rank as far
// as it can, round after round, reaches the same state in any order, and a round without progress
// is a deadlock. Timing rides along: a rank advances only once everything it waits on is known.
#include "shard/pipeline/schedule.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>

#include "src/core/check.hpp"

namespace shardlab {

// ---------------------------------------------------------------------------------------------
// Stage splits

int StageSplit::begin(int chunk) const {
  SHARD_CHECK(chunk >= 0 && chunk < chunks(), "chunk {} of {}", chunk, chunks());
  int b = 0;
  for (int c = 0; c < chunk; ++c) b += count(c);
  return b;
}

int StageSplit::chunk_of_unit(int unit) const {
  int end = 0;
  for (int c = 0; c < chunks(); ++c) {
    end += count(c);
    if (unit < end && unit >= 0) return c;
  }
  SHARD_CHECK(false, "unit {} is outside the split's {} units", unit, end);
  return -1;
}

std::vector<int> StageSplit::chunks_of(int r) const {
  SHARD_CHECK(r >= 0 && r < pp, "pipeline rank {} of {}", r, pp);
  std::vector<int> out;
  for (int c = 0; c < chunks(); ++c)
    if (rank_of(c) == r) out.push_back(c);
  return out;
}

std::vector<int> StageSplit::units_of(int r) const {
  std::vector<int> out;
  for (int c : chunks_of(r))
    for (int u = begin(c); u < begin(c) + count(c); ++u) out.push_back(u);
  return out;
}

std::string StageSplit::describe() const { return describe({}); }

// Chunks are "stage r" without interleaving; with it, the rank is not the chunk's position.
std::string StageSplit::describe(const std::vector<std::string>& unit_names) const {
  std::string out;
  for (int c = 0; c < chunks(); ++c) {
    const int b = begin(c), e = b + count(c) - 1;
    out += c == 0 ? "" : " | ";
    out += virtual_stages == 1 ? fmt::format("stage {}: ", c) : fmt::format("chunk {} (rank {}): ", c, rank_of(c));
    out += b == e ? fmt::format("unit {}", b) : fmt::format("units {}-{}", b, e);
    if (static_cast<int>(unit_names.size()) > e) {
      const std::string& first = unit_names[static_cast<size_t>(b)];
      out += b == e ? fmt::format(" ({})", first) : fmt::format(" ({} .. {})", first, unit_names[static_cast<size_t>(e)]);
    }
  }
  return out;
}

namespace {

void require_degrees(int pp, int virtual_stages) {
  SHARD_REQUIRE(pp >= 1 && virtual_stages >= 1, "--pp {} and --pp-virtual {} must be at least 1", pp, virtual_stages);
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{}", i ? "," : "", v[i]);
  return s;
}

}  // namespace

StageSplit explicit_split(const std::vector<int>& counts, int pp, int virtual_stages, int units) {
  require_degrees(pp, virtual_stages);
  const int chunks = pp * virtual_stages;
  SHARD_REQUIRE(static_cast<int>(counts.size()) == chunks,
                "--pp-split {} gives {} counts, but --pp {} x --pp-virtual {} makes {} chunks: give one count per "
                "chunk, {} in all", join(counts), counts.size(), pp, virtual_stages, chunks, chunks);
  long long sum = 0;
  for (size_t c = 0; c < counts.size(); ++c) {
    SHARD_REQUIRE(counts[c] >= 1, "--pp-split {}: chunk {} gets {} units; every chunk needs at least one",
                  join(counts), c, counts[c]);
    sum += counts[c];
  }
  SHARD_REQUIRE(sum == units, "--pp-split {} sums to {} units, but the model has {}: the counts must add up to {}",
                join(counts), sum, units, units);
  return StageSplit{pp, virtual_stages, counts};
}

namespace {

// Fewest chunks whose costs stay within `limit`, filled greedily (optimal for contiguous splits).
int chunks_needed(const std::vector<double>& prefix, double limit) {
  const size_t U = prefix.size() - 1;
  int n = 0;
  for (size_t b = 0; b < U; ++n) {
    size_t e = b + 1;
    if (prefix[e] - prefix[b] > limit) return std::numeric_limits<int>::max();
    while (e < U && prefix[e + 1] - prefix[b] <= limit) ++e;
    b = e;
  }
  return n;
}

}  // namespace

// The optimal bottleneck is one of the O(U^2) chunk sums: binary search them with the greedy
// count. Every cost is compared as prefix[e] - prefix[b], one expression, so the rounding of the
// search and of the assignment agree.
StageSplit balanced_split(const std::vector<double>& cost, int pp, int virtual_stages) {
  require_degrees(pp, virtual_stages);
  const int chunks = pp * virtual_stages, U = static_cast<int>(cost.size());
  SHARD_REQUIRE(U >= chunks,
                "{} units cannot fill --pp {} x --pp-virtual {} = {} chunks (each needs a unit): lower --pp or "
                "--pp-virtual to at most {} chunks", U, pp, virtual_stages, chunks, U);
  std::vector<double> prefix(static_cast<size_t>(U) + 1, 0.0);
  for (size_t u = 0; u < cost.size(); ++u) {
    SHARD_CHECK(std::isfinite(cost[u]) && cost[u] >= 0, "unit {} costs {}", u, cost[u]);
    prefix[u + 1] = prefix[u] + cost[u];
  }
  std::vector<double> sums;
  for (size_t b = 0; b < cost.size(); ++b)
    for (size_t e = b + 1; e <= cost.size(); ++e) sums.push_back(prefix[e] - prefix[b]);
  std::sort(sums.begin(), sums.end());
  sums.erase(std::unique(sums.begin(), sums.end()), sums.end());
  const auto it = std::partition_point(sums.begin(), sums.end(),
                                       [&](double limit) { return chunks_needed(prefix, limit) > chunks; });
  SHARD_CHECK(it != sums.end(), "no split of {} units into {} chunks", U, chunks);
  const double limit = *it;
  // From the back, each chunk as heavy as the limit allows while leaving a unit per chunk before
  // it: the earlier chunks come out lighter (the first stage holds the most activations in 1f1b).
  StageSplit s{pp, virtual_stages, std::vector<int>(static_cast<size_t>(chunks))};
  int end = U;
  for (int c = chunks - 1; c >= 0; --c) {
    int b = end - 1;
    while (b - 1 >= c && prefix[static_cast<size_t>(end)] - prefix[static_cast<size_t>(b - 1)] <= limit) --b;
    s.counts[static_cast<size_t>(c)] = end - b;
    end = b;
  }
  SHARD_CHECK(end == 0, "balanced split left {} units before chunk 0", end);
  return s;
}

std::vector<int> parse_pp_split(const std::string& s) {
  std::vector<int> out;
  size_t pos = 0;
  while (true) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const char *first = s.data() + pos, *last = s.data() + comma;
    int v = 0;
    const auto [ptr, ec] = std::from_chars(first, last, v);
    SHARD_REQUIRE(ec == std::errc() && ptr == last && first != last && v >= 1,
                  "--pp-split '{}': '{}' is not a positive unit count; give one count per chunk, like 3,3,2", s,
                  std::string(first, last));
    out.push_back(v);
    if (comma == s.size()) return out;
    pos = comma + 1;
  }
}

// ---------------------------------------------------------------------------------------------
// Schedules

std::string describe(const PipeAction& a) {
  const char kind = a.kind == PipeAction::forward ? 'F' : a.kind == PipeAction::backward ? 'B' : 'W';
  return fmt::format("{}{}c{}", kind, a.micro, a.chunk);
}

namespace {
// The most of `rank`'s micro-batches between an action of kind `opens` and one of kind `closes`.
int most_open(const std::vector<std::vector<PipeAction>>& ranks, int rank, PipeAction::Kind opens,
              PipeAction::Kind closes) {
  SHARD_CHECK(rank >= 0 && rank < static_cast<int>(ranks.size()), "pipeline rank {} of {}", rank, ranks.size());
  int now = 0, most = 0;
  for (const PipeAction& a : ranks[static_cast<size_t>(rank)]) {
    now += a.kind == opens ? 1 : a.kind == closes ? -1 : 0;
    most = std::max(most, now);
  }
  return most;
}
}  // namespace

int PipeSchedule::in_flight(int rank) const {
  return most_open(ranks, rank, PipeAction::forward, PipeAction::backward);
}

int PipeSchedule::weights_owed(int rank) const {
  if (!kind->splits_backward) return 0;
  return most_open(ranks, rank, PipeAction::backward, PipeAction::weight);
}

std::string PipeSchedule::describe() const {
  std::string out;
  for (size_t r = 0; r < ranks.size(); ++r) {
    out += fmt::format("{}rank {}:", r ? "\n" : "", r);
    for (const PipeAction& a : ranks[r]) out += fmt::format(" {}", shardlab::describe(a));
  }
  return out;
}

std::vector<size_t> receives_to_post(PpSchedule kind, const std::vector<PipeAction>& list, size_t i,
                                     const std::function<bool(const PipeAction&)>& remote) {
  std::vector<size_t> out;
  if (const int depth = kind->post_per_chunk; depth > 0) {  // each chunk's first forwards and backwards from i on
    std::map<std::pair<int, int>, int> seen;  // (chunk, kind) -> how many posted
    for (size_t j = i; j < list.size(); ++j) {
      const PipeAction& a = list[j];
      if (a.kind == PipeAction::weight || !remote(a)) continue;
      if (int& n = seen[{a.chunk, a.kind}]; n < depth) ++n, out.push_back(j);
    }
    return out;
  }
  if (i < list.size() && remote(list[i])) out.push_back(i);
  bool forward = false, backward = false;
  for (size_t j = i + 1; j < list.size() && !(forward && backward); ++j) {
    if (list[j].kind == PipeAction::weight) continue;
    bool& done = list[j].kind == PipeAction::forward ? forward : backward;
    if (!done && remote(list[j])) {
      done = true;
      out.push_back(j);
    }
  }
  return out;
}

PipeSchedule build_schedule_uncached(PpSchedule kind, int pp, int virtual_stages, int micro_batches) {
  require_degrees(pp, virtual_stages);
  SHARD_REQUIRE(micro_batches >= 1, "--micro-batches {}: a step needs at least one micro-batch", micro_batches);
  require_pp_schedule(kind, pp, virtual_stages, micro_batches);
  PipeSchedule s;
  s.kind = kind;
  s.pp = pp, s.virtual_stages = virtual_stages, s.micro_batches = micro_batches;
  for (int r = 0; r < pp; ++r) s.ranks.push_back(kind->actions(r, pp, virtual_stages, micro_batches));
  check_schedule(s);
  return s;
}

// ---------------------------------------------------------------------------------------------
// The simulation

namespace {

class Simulation {
 public:
  Simulation(const PipeSchedule& s, PassTimes t)
      : s_(s), chunks_(s.pp * s.virtual_stages), t_(t),
        sent_at_(2 * static_cast<size_t>(chunks_ * s.micro_batches), -1),
        posted_at_(sent_at_.size(), -1), ranks_(static_cast<size_t>(s.pp)) {}

  // Runs to the end or to a deadlock; false on a deadlock.
  bool run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < s_.pp; ++r)
        while (advance(r)) progress = true;
    }
    for (const Rank& k : ranks_)
      if (!k.done) return false;
    return true;
  }

  double makespan() const {
    double t = 0;
    for (const Rank& k : ranks_) t = std::max(t, k.free);
    return t;
  }
  double busy(int r) const { return ranks_[static_cast<size_t>(r)].busy; }

  // Each stuck rank's position and what it waits for.
  std::string stuck() const {
    std::string out;
    for (int r = 0; r < s_.pp; ++r) {
      const Rank& k = ranks_[static_cast<size_t>(r)];
      if (k.done) continue;
      const auto& list = s_.ranks[static_cast<size_t>(r)];
      out += fmt::format("; rank {} ", r);
      out += k.pc < list.size() ? fmt::format("at {} (action {} of {})", describe(list[k.pc]), k.pc + 1, list.size())
                                : std::string("at the end of its list");
      const int unreceived = first_unreceived(k);
      if (unreceived >= 0)
        out += fmt::format(" waits for rank {} to take {}", receiver(unreceived), message_name(unreceived));
      else if (k.pc < list.size())
        out += fmt::format(" waits for {}", message_name(needs(list[k.pc])));
    }
    return out;
  }

 private:
  struct Rank {
    size_t pc = 0;
    bool posted = false, done = false;
    double free = 0, busy = 0, sends_done = 0;
    std::vector<int> sends;  // posted, not yet known to be received
  };

  // A message is named by the action that consumes it: index (kind, chunk, micro).
  int key(PipeAction::Kind kind, int chunk, int micro) const {
    return (static_cast<int>(kind) * chunks_ + chunk) * s_.micro_batches + micro;
  }
  // Weight actions neither need nor send a message.
  int needs(const PipeAction& a) const {
    if (a.kind == PipeAction::forward) return a.chunk > 0 ? key(a.kind, a.chunk, a.micro) : -1;
    if (a.kind == PipeAction::weight) return -1;
    return a.chunk < chunks_ - 1 ? key(a.kind, a.chunk, a.micro) : -1;
  }
  int sends(const PipeAction& a) const {
    if (a.kind == PipeAction::forward) return a.chunk < chunks_ - 1 ? key(a.kind, a.chunk + 1, a.micro) : -1;
    if (a.kind == PipeAction::weight) return -1;
    return a.chunk > 0 ? key(a.kind, a.chunk - 1, a.micro) : -1;
  }
  PipeAction consumer(int k) const {
    const int micro = k % s_.micro_batches, chunk = (k / s_.micro_batches) % chunks_;
    return {k / (s_.micro_batches * chunks_) == 0 ? PipeAction::forward : PipeAction::backward, chunk, micro};
  }
  int receiver(int k) const { return s_.rank_of(consumer(k).chunk); }
  int sender(int k) const {
    const PipeAction a = consumer(k);
    return s_.rank_of(a.kind == PipeAction::forward ? a.chunk - 1 : a.chunk + 1);
  }
  // A message between two chunks of one rank (a V's turn) stays there: no send, no receive.
  bool local(int k) const { return k >= 0 && sender(k) == receiver(k); }
  std::string message_name(int k) const {
    const PipeAction a = consumer(k);
    const int from = sender(k);
    return fmt::format("the {} for {} from rank {}", a.kind == PipeAction::forward ? "activation" : "gradient",
                       describe(a), from);
  }
  int first_unreceived(const Rank& k) const {
    for (int m : k.sends)
      if (posted_at_[static_cast<size_t>(m)] < 0) return m;
    return -1;
  }

  // Every posted send received: its completion time joins the rank's.
  bool sends_received(Rank& k) {
    if (first_unreceived(k) >= 0) return false;
    for (int m : k.sends)
      k.sends_done = std::max({k.sends_done, sent_at_[static_cast<size_t>(m)], posted_at_[static_cast<size_t>(m)]});
    k.sends.clear();
    return true;
  }

  bool advance(int r) {
    Rank& k = ranks_[static_cast<size_t>(r)];
    const auto& list = s_.ranks[static_cast<size_t>(r)];
    if (k.done) return false;
    if (k.pc == list.size()) return k.done = sends_received(k);
    const PipeAction& a = list[k.pc];
    const int in = needs(a);
    bool moved = false;
    double start = k.free;
    if (!k.posted) {  // this action's receive, and those posted ahead of it
      k.posted = moved = true;
      const auto remote = [&](const PipeAction& x) { return needs(x) >= 0 && !local(needs(x)); };
      for (size_t j : receives_to_post(s_.kind, list, k.pc, remote)) post(needs(list[j]), k.free);
    }
    if (local(in)) {  // the runner takes it from its stash: no wait for sends
      if (sent_at_[static_cast<size_t>(in)] < 0) return moved;
      start = std::max(start, sent_at_[static_cast<size_t>(in)]);
    } else if (in >= 0) {
      if (!sends_received(k) || sent_at_[static_cast<size_t>(in)] < 0) return moved;
      start = std::max({start, k.sends_done, sent_at_[static_cast<size_t>(in)]});
    }
    const double took = a.kind == PipeAction::forward ? t_.forward
                        : a.kind == PipeAction::weight ? t_.weight
                        : s_.kind->splits_backward    ? t_.input
                                                      : t_.input + t_.weight;
    k.free = start + took, k.busy += took;
    if (const int out = sends(a); out >= 0) {
      sent_at_[static_cast<size_t>(out)] = k.free;
      if (local(out)) posted_at_[static_cast<size_t>(out)] = k.free;
      else k.sends.push_back(out);
    }
    ++k.pc, k.posted = false;
    return true;
  }

  void post(int m, double at) {
    if (m >= 0 && posted_at_[static_cast<size_t>(m)] < 0) posted_at_[static_cast<size_t>(m)] = at;
  }

  const PipeSchedule& s_;
  const int chunks_;
  const PassTimes t_;
  std::vector<double> sent_at_, posted_at_;  // per message; -1 until it happens
  std::vector<Rank> ranks_;
};

// Each action once, on its chunk's rank, each backward after its own forward; where the schedule
// splits backwards, each weight action after its own backward, in the order of the rank's backwards.
void check_actions(const PipeSchedule& s) {
  const int P = s.pp, C = s.pp * s.virtual_stages, M = s.micro_batches;
  SHARD_CHECK(P >= 1 && s.virtual_stages >= 1 && M >= 1, "schedule of pp {} x {} virtual over {} micro-batches", P,
              s.virtual_stages, M);
  SHARD_CHECK(static_cast<int>(s.ranks.size()) == P, "schedule has {} rank lists for pp {}", s.ranks.size(), P);
  const bool split = s.kind->splits_backward;
  const size_t per_kind = static_cast<size_t>(C * M);
  std::vector<int> seen(3 * per_kind, -1);  // the rank that ran it
  const auto index = [&](PipeAction::Kind k, int chunk, int micro) {
    return static_cast<size_t>(k) * per_kind + static_cast<size_t>(chunk * M + micro);
  };
  for (int r = 0; r < P; ++r) {
    std::vector<PipeAction> owed;  // backwards whose weight action has not run, in order
    size_t paid = 0;
    for (const PipeAction& a : s.ranks[static_cast<size_t>(r)]) {
      SHARD_CHECK(a.chunk >= 0 && a.chunk < C && a.micro >= 0 && a.micro < M,
                  "rank {} runs {}, outside {} chunks and {} micro-batches", r, describe(a), C, M);
      SHARD_CHECK(s.rank_of(a.chunk) == r, "rank {} runs {}, whose chunk lives on rank {}", r, describe(a),
                  s.rank_of(a.chunk));
      SHARD_CHECK(split || a.kind != PipeAction::weight, "rank {} runs {}, but {} does not split backwards", r,
                  describe(a), s.kind.name());
      const size_t i = index(a.kind, a.chunk, a.micro);
      SHARD_CHECK(seen[i] < 0, "rank {} runs {} twice", r, describe(a));
      seen[i] = r;
      if (a.kind == PipeAction::backward) {
        SHARD_CHECK(seen[index(PipeAction::forward, a.chunk, a.micro)] >= 0, "rank {} runs {} before its forward", r,
                    describe(a));
        owed.push_back(a);
      }
      if (a.kind == PipeAction::weight) {
        SHARD_CHECK(seen[index(PipeAction::backward, a.chunk, a.micro)] >= 0, "rank {} runs {} before its backward",
                    r, describe(a));
        const PipeAction& due = owed[paid++];
        SHARD_CHECK(due.chunk == a.chunk && due.micro == a.micro,
                    "rank {} runs {} before W{}c{}: weight actions follow the order of the backwards", r, describe(a),
                    due.micro, due.chunk);
      }
    }
  }
  for (size_t i = 0; i < (split ? 3 : 2) * per_kind; ++i) {
    const PipeAction a{static_cast<PipeAction::Kind>(i / per_kind), static_cast<int>(i % per_kind) / M,
                       static_cast<int>(i % per_kind) % M};
    SHARD_CHECK(seen[i] >= 0, "no rank runs {} (rank {} should)", describe(a), s.rank_of(a.chunk));
  }
}

}  // namespace

void check_schedule(const PipeSchedule& s) {
  check_actions(s);
  Simulation sim(s, PassTimes{});
  const bool finished = sim.run();
  SHARD_CHECK(finished, "{} schedule (pp {}, {} virtual, {} micro-batches) deadlocks{}", s.kind.name(),
              s.pp, s.virtual_stages, s.micro_batches, sim.stuck());
}

double bubble_fraction(PpSchedule kind, int pp, int virtual_stages, int micro_batches) {
  return kind->bubble_fraction(pp, virtual_stages, micro_batches);
}

namespace {
// The timed simulation of a checked schedule, run to its end.
template <class Use>
auto simulated(const PipeSchedule& s, PassTimes t, Use use) {
  check_schedule(s);
  Simulation sim(s, t);
  SHARD_CHECK(sim.run(), "the checked schedule deadlocks in the timed simulation{}", sim.stuck());
  return use(sim);
}
}  // namespace

double simulated_makespan(const PipeSchedule& s, PassTimes t) {
  return simulated(s, t, [](const Simulation& sim) { return sim.makespan(); });
}

double simulated_bubble(const PipeSchedule& s, PassTimes t) {
  return simulated(s, t, [&](const Simulation& sim) {
    const double span = sim.makespan();
    if (span <= 0) return 0.0;
    double idle = 0;
    for (int r = 0; r < s.pp; ++r) idle += (span - sim.busy(r)) / span;
    return idle / s.pp;
  });
}

double simulated_bubble(const PipeSchedule& s, double forward_time, double backward_time) {
  return simulated_bubble(s, PassTimes{forward_time, backward_time / 2, backward_time / 2});
}

}  // namespace shardlab
