// Pipeline stage splits and schedules (shard/pipeline/schedule.hpp): the 1f1b and gpipe orders written
// out by hand from Narayanan et al. 2021 (fig. 4) and GPipe, the interleaved order from Megatron's
// rule worked by hand, stage memory (in_flight) against each paper's count, the check catching
// broken schedules, balanced splits against hand-computed and brute-force optima, and the simulated
// bubble against the closed forms.
#include <catch2/catch.hpp>
#include <algorithm>
#include <functional>
#include <sstream>

#include "src/core/check.hpp"
#include "shard/pipeline/schedule.hpp"

using namespace shardlab;

namespace {

// The schedules these tests run, by the names --pp-schedule takes.
const PpSchedule gpipe = parse_pp_schedule("gpipe"), one_f_one_b = parse_pp_schedule("1f1b"),
                 interleaved = parse_pp_schedule("interleaved-1f1b"), zb_h1 = parse_pp_schedule("zb-h1"),
                 zb_v = parse_pp_schedule("zb-v");

// An exception whose message contains `part` (Catch2 v2's Contains matches strings only).
struct Says : Catch::MatcherBase<std::exception> {
  explicit Says(std::string p) : part(std::move(p)) {}
  bool match(const std::exception& e) const override { return std::string(e.what()).find(part) != std::string::npos; }
  std::string describe() const override { return "says \"" + part + "\""; }
  std::string part;
};

// "F0 F1 B0 W0" -> actions on `chunk`; "F0c2 B1c0" names the chunk.
std::vector<PipeAction> actions(const std::string& text, int chunk = -1) {
  std::vector<PipeAction> out;
  std::istringstream in(text);
  for (std::string w; in >> w;) {
    const size_t c = w.find('c');
    const int micro = std::stoi(w.substr(1, c == std::string::npos ? std::string::npos : c - 1));
    out.push_back({w[0] == 'F' ? PipeAction::forward : w[0] == 'B' ? PipeAction::backward : PipeAction::weight,
                   c == std::string::npos ? chunk : std::stoi(w.substr(c + 1)), micro});
  }
  return out;
}

PipeSchedule by_hand(PpSchedule kind, int pp, int v, int M, const std::vector<std::string>& lists) {
  PipeSchedule s;
  s.kind = kind, s.pp = pp, s.virtual_stages = v, s.micro_batches = M;
  for (size_t r = 0; r < lists.size(); ++r) s.ranks.push_back(actions(lists[r], static_cast<int>(r)));
  return s;
}

// Megatron's count of what rank r holds: its warm-up forwards, plus the one forward the steady state
// runs before its first backward.
int megatron_in_flight(int r, int P, int V, int M) {
  const int warmup = (P - r - 1) * 2 + (V - 1) * P;
  return warmup >= V * M ? V * M : warmup + 1;
}

}  // namespace

TEST_CASE("schedule names parse, and a wrong one names the choices and the closest", "[pipeline]") {
  CHECK(parse_pp_schedule("gpipe") == gpipe);
  CHECK(parse_pp_schedule("1f1b") == one_f_one_b);
  CHECK(parse_pp_schedule("interleaved-1f1b") == interleaved);
  for (PpSchedule k : {gpipe, one_f_one_b, interleaved})
    CHECK(parse_pp_schedule(k.name()) == k);
  CHECK_THROWS_MATCHES(parse_pp_schedule("1fb1"), InputError,
                       Catch::Message("unknown pipeline schedule '1fb1': expected gpipe, 1f1b, interleaved-1f1b, zb-h1 or zb-v "
                                      "(did you mean 1f1b?)"));
  CHECK_THROWS_WITH(parse_pp_schedule("interleaved-1fb1"), Catch::Contains("did you mean interleaved-1f1b?"));
  CHECK_THROWS_WITH(parse_pp_schedule("zero3"), !Catch::Contains("did you mean"));
}

TEST_CASE("--pp-split parses positive counts and names the text otherwise", "[pipeline]") {
  CHECK(parse_pp_split("3,3,2") == std::vector<int>{3, 3, 2});
  CHECK(parse_pp_split("12") == std::vector<int>{12});
  for (const char* bad : {"", "3,,2", "3,2,", ",3", "3,a", "3x,2", "3,0,2", "3,-1", "3.5,2", "99999999999"})
    CHECK_THROWS_MATCHES(parse_pp_split(bad), InputError, Says(fmt::format("--pp-split '{}'", bad)));
  CHECK_THROWS_WITH(parse_pp_split("3,0,2"), Catch::Contains("'0' is not a positive unit count"));
}

TEST_CASE("explicit splits place chunk c on rank c % P and refuse counts that do not fit", "[pipeline]") {
  const StageSplit s = explicit_split({3, 2, 1, 2}, 2, 2, 8);
  CHECK(s.chunks() == 4);
  CHECK(s.begin(0) == 0);
  CHECK(s.begin(2) == 5);
  CHECK(s.begin(3) == 6);
  CHECK(s.chunk_of_unit(0) == 0);
  CHECK(s.chunk_of_unit(4) == 1);
  CHECK(s.chunk_of_unit(5) == 2);
  CHECK(s.chunk_of_unit(7) == 3);
  CHECK(s.chunks_of(0) == std::vector<int>{0, 2});
  CHECK(s.chunks_of(1) == std::vector<int>{1, 3});
  CHECK(s.units_of(0) == std::vector<int>{0, 1, 2, 5});
  CHECK(s.units_of(1) == std::vector<int>{3, 4, 6, 7});
  CHECK(s.describe() == "chunk 0 (rank 0): units 0-2 | chunk 1 (rank 1): units 3-4 | chunk 2 (rank 0): unit 5 | "
                        "chunk 3 (rank 1): units 6-7");
  const StageSplit v1 = explicit_split({2, 3}, 2, 1, 5);
  CHECK(v1.describe({"embedding", "h.0", "h.1", "h.2", "head"}) ==
        "stage 0: units 0-1 (embedding .. h.0) | stage 1: units 2-4 (h.1 .. head)");

  CHECK_THROWS_MATCHES(explicit_split({3, 3, 2}, 2, 2, 8), InputError,
                       Says("--pp-split 3,3,2 gives 3 counts, but --pp 2 x --pp-virtual 2 makes 4 chunks"));
  CHECK_THROWS_MATCHES(explicit_split({3, 0, 5}, 3, 1, 8), InputError,
                       Says("chunk 1 gets 0 units; every chunk needs at least one"));
  CHECK_THROWS_MATCHES(explicit_split({3, 3, 3}, 3, 1, 8), InputError,
                       Says("--pp-split 3,3,3 sums to 9 units, but the model has 8"));
}

TEST_CASE("balanced splits minimise the heaviest chunk, earlier chunks lighter on ties", "[pipeline]") {
  // Embedding 10, six blocks of 4, head 8 over 4 stages: a bottleneck of 11 needs 5 chunks
  // ({8} {4,4} {4,4} {4,4} {10}); 12 fits, as {10} {4,4} {4,4,4} {4,8} or {10} {4,4,4} {4,4} {4,8}:
  // the first, whose second stage is the lighter.
  CHECK(balanced_split({10, 4, 4, 4, 4, 4, 4, 8}, 4, 1).counts == std::vector<int>{1, 2, 3, 2});
  // A heavy head alone at the end; the first stage takes what is left: costs 5, 9, 9.
  CHECK(balanced_split({2, 3, 3, 3, 3, 9}, 3, 1).counts == std::vector<int>{2, 3, 1});
  CHECK(balanced_split(std::vector<double>(8, 1.0), 2, 2).counts == std::vector<int>{2, 2, 2, 2});
  CHECK(balanced_split(std::vector<double>(5, 1.0), 2, 2).counts == std::vector<int>{1, 1, 1, 2});
  CHECK(balanced_split(std::vector<double>(4, 0.0), 4, 1).counts == std::vector<int>{1, 1, 1, 1});
  CHECK_THROWS_MATCHES(balanced_split(std::vector<double>(5, 1.0), 3, 2), InputError,
                       Says("5 units cannot fill --pp 3 x --pp-virtual 2 = 6 chunks"));

  // Against every contiguous split of small integer costs (exact sums): the least bottleneck, and
  // among those the one whose last chunk is heaviest, then the one before it, and so on.
  uint32_t seed = 12345;
  const auto next = [&] { return seed = seed * 1664525u + 1013904223u, static_cast<int>(seed >> 24) % 9; };
  for (int trial = 0; trial < 200; ++trial) {
    const int U = 3 + trial % 7, K = 1 + trial % 3 + (trial / 3) % 2;
    if (U < K) continue;
    std::vector<double> cost;
    for (int u = 0; u < U; ++u) cost.push_back(next());
    std::vector<int> best, counts;
    double best_max = 1e300;
    const std::function<void(int, int)> walk = [&](int used, int left) {
      if (static_cast<int>(counts.size()) == K - 1) {
        counts.push_back(left);
        double worst = 0;
        for (int c = 0, b = 0; c < K; b += counts[static_cast<size_t>(c)], ++c) {
          double sum = 0;
          for (int u = b; u < b + counts[static_cast<size_t>(c)]; ++u) sum += cost[static_cast<size_t>(u)];
          worst = std::max(worst, sum);
        }
        const bool later_heavier = std::lexicographical_compare(best.rbegin(), best.rend(), counts.rbegin(), counts.rend());
        if (worst < best_max || (worst == best_max && later_heavier)) best_max = worst, best = counts;
        counts.pop_back();
        return;
      }
      for (int n = 1; left - n >= K - 1 - static_cast<int>(counts.size()); ++n) {
        counts.push_back(n);
        walk(used + n, left - n);
        counts.pop_back();
      }
    };
    walk(0, U);
    INFO("costs " << Catch::Detail::stringify(cost) << " into " << K << " chunks");
    CHECK(balanced_split(cost, K, 1).counts == best);
  }
}

TEST_CASE("gpipe and 1f1b orders, rank by rank, as in the papers", "[pipeline]") {
  const PipeSchedule g = build_schedule(gpipe, 2, 1, 3);
  CHECK(g.ranks[0] == actions("F0 F1 F2 B0 B1 B2", 0));
  CHECK(g.ranks[1] == actions("F0 F1 F2 B0 B1 B2", 1));
  CHECK(g.describe() == "rank 0: F0c0 F1c0 F2c0 B0c0 B1c0 B2c0\nrank 1: F0c1 F1c1 F2c1 B0c1 B1c1 B2c1");

  const PipeSchedule a = build_schedule(one_f_one_b, 2, 1, 4);
  CHECK(a.ranks[0] == actions("F0 F1 B0 F2 B1 F3 B2 B3", 0));
  CHECK(a.ranks[1] == actions("F0 B0 F1 B1 F2 B2 F3 B3", 1));

  // Narayanan et al. 2021, fig. 4 (top): 4 devices, 8 micro-batches.
  const PipeSchedule b = build_schedule(one_f_one_b, 4, 1, 8);
  CHECK(b.ranks[0] == actions("F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7", 0));
  CHECK(b.ranks[1] == actions("F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7", 1));
  CHECK(b.ranks[2] == actions("F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7", 2));
  CHECK(b.ranks[3] == actions("F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7", 3));

  // Fewer micro-batches than stages: every forward, then every backward (gpipe's memory).
  const PipeSchedule c = build_schedule(one_f_one_b, 4, 1, 2);
  CHECK(c.ranks[0] == actions("F0 F1 B0 B1", 0));
  CHECK(c.ranks[3] == actions("F0 B0 F1 B1", 3));
  CHECK(describe(PipeAction{PipeAction::forward, 1, 3}) == "F3c1");
}

TEST_CASE("interleaved order: Megatron's chunk order and warm-up, then one forward and one backward", "[pipeline]") {
  // P 2, V 2, M 4. Forward k of rank r: virtual stage (k / 2) % 2, micro-batch (k / 4) * 2 + k % 2;
  // backward k: the virtual stages reversed; warm-up (P - r - 1) * 2 + (V - 1) * P = 4 forwards on
  // rank 0 and 2 on rank 1, then forward k + warm-up and backward k in turn.
  const PipeSchedule s = build_schedule(interleaved, 2, 2, 4);
  CHECK(s.ranks[0] == actions("F0c0 F1c0 F0c2 F1c2 F2c0 B0c2 F3c0 B1c2 F2c2 B0c0 F3c2 B1c0 B2c2 B3c2 B2c0 B3c0"));
  CHECK(s.ranks[1] == actions("F0c1 F1c1 F0c3 B0c3 F1c3 B1c3 F2c1 B0c1 F3c1 B1c1 F2c3 B2c3 F3c3 B3c3 B2c1 B3c1"));
  // The same order runs only with receives posted ahead: rank 0 waits at B0c2 for rank 1 to take
  // F2c1's activation; rank 1 posts that receive at B0c3 (its next forward's), long before F2c1.
  CHECK_NOTHROW(check_schedule(s));
}

TEST_CASE("in_flight: what each rank holds", "[pipeline]") {
  for (int P = 1; P <= 6; ++P)
    for (int M = 1; M <= 10; ++M) {
      const PipeSchedule g = build_schedule(gpipe, P, 1, M);
      const PipeSchedule f = build_schedule(one_f_one_b, P, 1, M);
      for (int r = 0; r < P; ++r) {
        CHECK(g.in_flight(r) == M);
        CHECK(f.in_flight(r) == std::min(M, P - r));
      }
    }
  // Interleaved: Megatron's warm-up + 1 (every chunk's every micro-batch when the warm-up is all).
  for (int P = 1; P <= 6; ++P)
    for (int V = 2; V <= 4; ++V)
      for (int M = P; M <= 4 * P; M += P) {
        const PipeSchedule s = build_schedule(interleaved, P, V, M);
        for (int r = 0; r < P; ++r) {
          INFO("P " << P << " V " << V << " M " << M << " rank " << r);
          CHECK(s.in_flight(r) == megatron_in_flight(r, P, V, M));
        }
      }
}

TEST_CASE("every built schedule passes the check, and combinations without one are refused", "[pipeline]") {
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 16; ++M) {
      CHECK_NOTHROW(build_schedule(gpipe, P, 1, M));
      CHECK_NOTHROW(build_schedule(one_f_one_b, P, 1, M));
      for (int V = 2; V <= 4; ++V)
        if (M % P == 0) {
          INFO("P " << P << " V " << V << " M " << M);
          CHECK_NOTHROW(build_schedule(interleaved, P, V, M));
        }
    }
  CHECK_THROWS_MATCHES(build_schedule(interleaved, 4, 2, 6), InputError,
                       Says("--micro-batches 6 is not a multiple of --pp 4 (micro-batches go through the chunks in "
                            "groups of pp); give 4 or 8"));
  CHECK_THROWS_MATCHES(build_schedule(interleaved, 4, 2, 2), InputError, Says("give 4 or more"));
  CHECK_THROWS_MATCHES(build_schedule(interleaved, 2, 1, 4), InputError,
                       Says("needs --pp-virtual 2 or more (got 1)"));
  CHECK_THROWS_MATCHES(build_schedule(one_f_one_b, 2, 2, 4), InputError,
                       Says("--pp-virtual 2 with --pp-schedule 1f1b: only interleaved-1f1b or zb-v runs virtual stages"));
  CHECK_THROWS_MATCHES(build_schedule(gpipe, 2, 1, 0), InputError, Says("--micro-batches 0"));
}

TEST_CASE("the check catches broken schedules", "[pipeline]") {
  const auto P2 = [](const std::string& r0, const std::string& r1) {
    return by_hand(one_f_one_b, 2, 1, 2, {r0, r1});
  };
  CHECK_NOTHROW(check_schedule(P2("F0 F1 B0 B1", "F0 B0 F1 B1")));
  CHECK_THROWS_MATCHES(check_schedule(P2("F0 B0 F1 B1", "B0 F0 F1 B1")), InternalError,
                       Says("rank 1 runs B0c1 before its forward"));
  CHECK_THROWS_MATCHES(check_schedule(P2("F0 F1 B0 B1", "F0 B0 F1")), InternalError,
                       Says("no rank runs B1c1 (rank 1 should)"));
  CHECK_THROWS_MATCHES(check_schedule(P2("F0 F1 B0 B1 B1", "F0 B0 F1 B1")), InternalError,
                       Says("rank 0 runs B1c0 twice"));
  CHECK_THROWS_MATCHES(check_schedule(by_hand(one_f_one_b, 2, 1, 1, {"F0c0 F0c1 B0c1 B0c0", ""})),
                       InternalError, Says("rank 0 runs F0c1, whose chunk lives on rank 1"));
  // A cycle of messages: rank 1 wants micro-batch 1 first, rank 0 sends it only after micro-batch 0's
  // backward, which needs rank 1.
  CHECK_THROWS_MATCHES(check_schedule(P2("F0 B0 F1 B1", "F1 B1 F0 B0")), InternalError,
                       Says("deadlocks; rank 0 at B0c0 (action 2 of 4) waits for the gradient for B0c0 from "
                            "rank 1; rank 1 at F1c1 (action 1 of 4) waits for the activation for F1c1 from rank 0"));
  // Every message is there in time, but rank 1 must see its gradient of micro-batch 0 taken before it
  // may take an activation, and rank 0 posts that receive only at B1 (receives go ahead by one
  // forward and one backward: from B2 the next backward is B1): the runner's send-then-wait
  // semantics deadlock an order that unbounded buffering would run.
  CHECK_THROWS_MATCHES(check_schedule(by_hand(one_f_one_b, 2, 1, 3,
                                              {"F0 F1 F2 B2 B1 B0", "F0 B0 F1 B1 F2 B2"})),
                       InternalError, Says("rank 1 at F1c1 (action 3 of 6) waits for rank 0 to take the gradient for B0c0"));
  // A receive is posted before the wait for the rank's own sends: 1f1b's steady state, where both ranks
  // have sent and each needs the other's message, runs only so.
  CHECK_NOTHROW(check_schedule(by_hand(one_f_one_b, 2, 1, 4,
                                       {"F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"})));
}

TEST_CASE("bubble: the closed forms, and the simulated one against them", "[pipeline]") {
  CHECK(bubble_fraction(gpipe, 1, 1, 8) == 0);
  CHECK(bubble_fraction(gpipe, 4, 1, 8) == Approx(3.0 / 11));
  CHECK(bubble_fraction(one_f_one_b, 4, 1, 8) == Approx(3.0 / 11));
  CHECK(bubble_fraction(interleaved, 4, 2, 8) == Approx(3.0 / 19));
  CHECK(bubble_fraction(one_f_one_b, 8, 1, 1) == Approx(7.0 / 8));

  // Equal stages, backward = 2 x forward, no communication time: the simulation gives the theory.
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 16; ++M) {
      INFO("P " << P << " M " << M);
      const double theory = double(P - 1) / (M + P - 1);
      CHECK(simulated_bubble(build_schedule(gpipe, P, 1, M), 1, 2) == Approx(theory).epsilon(1e-12));
      CHECK(simulated_bubble(build_schedule(one_f_one_b, P, 1, M), 1, 2) == Approx(theory).epsilon(1e-12));
    }
  // Interleaved, each chunk a V-th of a stage: (P - 1) / (V M + P - 1).
  for (int P = 1; P <= 8; ++P)
    for (int V = 2; V <= 4; ++V)
      for (int M = P; M <= 16; M += P) {
        INFO("P " << P << " V " << V << " M " << M);
        const double sim = simulated_bubble(build_schedule(interleaved, P, V, M), 1.0 / V, 2.0 / V);
        CHECK(sim == Approx(double(P - 1) / (V * M + P - 1)).epsilon(1e-12));
      }
}

// The registry: what every entry owes its callers, and the answers train, plan and --help take.
TEST_CASE("registry: every schedule builds checked lists where its rules allow, its theory the simulation's",
          "[pipeline]") {
  std::vector<std::string> names;
  for (const PpScheduleDef* d : pp_schedules()) {
    INFO(d->name);
    const PpSchedule k(*d);
    REQUIRE((d->actions && d->bubble_fraction && d->bubble_stages && d->help[0] != '\0'));
    CHECK(parse_pp_schedule(d->name) == k);
    CHECK(std::find(names.begin(), names.end(), d->name) == names.end());
    names.push_back(d->name);
    for (int P = 1; P <= 4; ++P)
      for (int V : {1, 2, 3})
        for (int M = 1; M <= 8; ++M) {
          INFO("P " << P << " V " << V << " M " << M);
          if (!pp_schedule_allows(k, P, V, M)) {
            CHECK_THROWS_AS(require_pp_schedule(k, P, V, M), InputError);
            continue;
          }
          CHECK_NOTHROW(require_pp_schedule(k, P, V, M));
          const PipeSchedule s = build_schedule(k, P, V, M);
          const double sim = simulated_bubble(s, 1.0 / V, 2.0 / V);
          if (d->bubble_is_bound) CHECK(sim >= bubble_fraction(k, P, V, M) - 1e-12);
          else CHECK(sim == Approx(bubble_fraction(k, P, V, M)).margin(1e-12).epsilon(1e-12));
        }
  }
}

TEST_CASE("registry: defaults, planner labels, --help and the rules' messages", "[pipeline]") {
  CHECK(PpSchedule() == one_f_one_b);
  CHECK(default_pp_schedule(1) == one_f_one_b);
  CHECK(default_pp_schedule(4) == interleaved);
  CHECK(one_f_one_b->label(1) == "1f1b");
  CHECK(gpipe->label(1) == "gpipe");
  CHECK(interleaved->label(8) == "interleaved v8");
  CHECK(pp_schedule_help() ==
        "gpipe (every forward, then every backward: all micro-batches' activations held), 1f1b (one forward, one "
        "backward: at most pp - stage micro-batches held), interleaved-1f1b (--pp-virtual chunks per rank: a "
        "smaller bubble, more sends; micro-batches a multiple of --pp), zb-h1 (1f1b with the weights' gradients "
        "split off and run where 1f1b idles: its activations in flight plus the weight passes owed, a third of its "
        "bubble) or zb-v (--pp-virtual 2 chunks per rank in a V, backwards split as zb-h1: the smallest bubble, "
        "1f1b's first stage's micro-batches held on every stage)");
  CHECK_THROWS_MATCHES(require_pp_schedule(interleaved, 2, 1, 0), InputError,
                       Says("--pp-schedule interleaved-1f1b needs --pp-virtual 2 or more (got 1); with one chunk per "
                            "rank use 1f1b"));
  CHECK_THROWS_MATCHES(require_pp_schedule(gpipe, 2, 3, 0), InputError,
                       Says("--pp-virtual 3 with --pp-schedule gpipe: only interleaved-1f1b or zb-v runs virtual stages"));
  CHECK_NOTHROW(require_pp_schedule(interleaved, 2, 2, 0));  // micro-batches not known yet
  CHECK_FALSE(pp_schedule_allows(interleaved, 2, 2, 3));
  CHECK(pp_schedule_allows(one_f_one_b, 2, 1, 3));
  // 1f1b with fewer micro-batches than stages runs, with the train header's warning.
  CHECK(one_f_one_b->warning(2, 1, 2).empty());
  CHECK(one_f_one_b->warning(2, 1, 1) == "1 micro-batches for 2 stages: 1f1b holds as many activations as gpipe here "
                                         "and the bubble is 50%; give --micro-batches 2 or more");
}

// Zero-bubble ZB-H1 (Qi et al. 2024, section 3.1): the unit-cost makespans, 1F1B's
// activations on every stage, the order worked out by hand, and the check's rules for W.
TEST_CASE("zb-h1: makespans at unit costs, 1f1b's activations, the order by hand", "[pipeline][zb]") {
  // F = B = W = 1 at P 4, M 8: 1f1b runs B + W as one backward of 2 and takes (M + P - 1) x 3 = 33;
  // zb-h1 takes 3M + (P - 1)(F + B - W) = 27 (the paper's bubble).
  const PassTimes unit{1, 1, 1};
  CHECK(simulated_makespan(build_schedule(one_f_one_b, 4, 1, 8), unit) == 33);
  CHECK(simulated_makespan(build_schedule(zb_h1, 4, 1, 8), unit) == 27);
  // W costs nothing: no bubble to fill, both take 1f1b's (M + P - 1)(F + B).
  CHECK(simulated_makespan(build_schedule(zb_h1, 4, 1, 8), {1, 2, 0}) == 33);
  // Rank r: 1f1b's P - r - 1 warm-up forwards and F/B alternation; its first r weight passes held
  // back to the end, every other W right after a B (rank 0 none held, rank 3 three).
  const PipeSchedule s = build_schedule(zb_h1, 4, 1, 8);
  CHECK(s.ranks[0] == actions("F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7", 0));
  CHECK(s.ranks[3] == actions("F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7", 3));
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 16; ++M) {
      const PipeSchedule z = build_schedule(zb_h1, P, 1, M), f = build_schedule(one_f_one_b, P, 1, M);
      for (int r = 0; r < P; ++r) {
        INFO("P " << P << " M " << M << " rank " << r);
        CHECK(z.in_flight(r) == f.in_flight(r));  // forwards whose B has not run: 1f1b's min(M, P - r)
        CHECK(z.weights_owed(r) == std::min(M, r + 1));
        CHECK(f.weights_owed(r) == 0);
      }
      // Its theory is the simulation's at unit costs, M < P included.
      CHECK(simulated_bubble(z, unit) == Approx(bubble_fraction(zb_h1, P, 1, M)).margin(1e-12));
      if (M >= P) CHECK(bubble_fraction(zb_h1, P, 1, M) == Approx(double(P - 1) / (3 * M + P - 1)));
      if (P > 1 && M >= P) CHECK(simulated_bubble(z, unit) < simulated_bubble(f, unit));
    }
  CHECK(zb_h1->warning(4, 1, 4).empty());
  CHECK(zb_h1->warning(4, 1, 2) == "2 micro-batches for 4 stages: zb-h1 cannot fill its ramp and the bubble is "
                                   "45%; give --micro-batches 4 or more");
}

TEST_CASE("the check's rules for weight actions", "[pipeline][zb]") {
  const auto P2 = [](PpSchedule k, const std::string& r0, const std::string& r1) {
    return by_hand(k, 2, 1, 2, {r0, r1});
  };
  CHECK_NOTHROW(check_schedule(P2(zb_h1, "F0 F1 B0 W0 B1 W1", "F0 B0 F1 B1 W0 W1")));
  CHECK_THROWS_MATCHES(check_schedule(P2(zb_h1, "F0 F1 B0 W0 B1 W1", "F0 W0 B0 F1 B1 W1")), InternalError,
                       Says("rank 1 runs W0c1 before its backward"));
  CHECK_THROWS_MATCHES(check_schedule(P2(zb_h1, "F0 F1 B0 W0 B1 W1", "F0 B0 F1 B1 W1 W0")), InternalError,
                       Says("rank 1 runs W1c1 before W0c1: weight actions follow the order of the backwards"));
  CHECK_THROWS_MATCHES(check_schedule(P2(zb_h1, "F0 F1 B0 W0 B1", "F0 B0 F1 B1 W0 W1")), InternalError,
                       Says("no rank runs W1c0 (rank 0 should)"));
  CHECK_THROWS_MATCHES(check_schedule(P2(one_f_one_b, "F0 F1 B0 W0 B1", "F0 B0 F1 B1")), InternalError,
                       Says("rank 0 runs W0c0, but 1f1b does not split backwards"));
}

// ZB-V: two chunks per rank in a V, backwards split; its order from list scheduling (zb_v.cpp).
TEST_CASE("zb-v: chunks in a V, below zb-h1's bubble, 1f1b's first stage's memory on every rank", "[pipeline][zb]") {
  StageSplit v{4, 2, {1, 1, 1, 1, 1, 1, 1, 1}, true};
  CHECK(v.chunks_of(0) == std::vector<int>{0, 7});
  CHECK(v.chunks_of(3) == std::vector<int>{3, 4});
  CHECK(v.rank_of(5) == 2);
  CHECK(v.units_of(1) == std::vector<int>{1, 6});
  // Per chunk F = B = W = 1 every rank computes 6M; the last rank's first input arrives after
  // P - 1 forwards, so no order beats 6M + P - 1: 49 at P 2, M 8 (reached), 51 at P 4 (52 here).
  const PassTimes unit{1, 1, 1};
  CHECK(simulated_makespan(build_schedule(zb_v, 2, 2, 8), unit) == 49);
  CHECK(simulated_makespan(build_schedule(zb_v, 4, 2, 8), unit) == 52);
  const auto half = [](PassTimes t) { return PassTimes{t.forward / 2, t.input / 2, t.weight / 2}; };  // a chunk
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 16; ++M) {
      INFO("P " << P << " M " << M);
      const PipeSchedule s = build_schedule(zb_v, P, 2, M);  // checked: it runs under the runner's rules
      for (int r = 0; r < P; ++r) {
        int held = 0, most = 0;  // chunk-micro-batches whose forward has run and whose W has not
        for (const PipeAction& a : s.ranks[static_cast<size_t>(r)]) {
          held += a.kind == PipeAction::forward ? 1 : a.kind == PipeAction::weight ? -1 : 0;
          most = std::max(most, held);
        }
        CHECK(most <= 2 * P);  // 1f1b's first stage: P micro-batches of a whole stage (two chunks)
      }
      CHECK(simulated_bubble(s, half(unit)) >= bubble_fraction(zb_v, P, 2, M) - 1e-12);
      if (M < P || P == 1) continue;
      // Equal passes and the pass times it is built for (B 1.5 F, W 0.75 F): below 1f1b's bubble;
      // at the latter with P 2, 4, 8 and M = 2P or 4P, below zb-h1's too (elsewhere within 5.5 points).
      const PassTimes built{1, 1.5, 0.75};
      CHECK(simulated_bubble(s, half(unit)) < simulated_bubble(build_schedule(one_f_one_b, P, 1, M), unit));
      CHECK(simulated_bubble(s, half(built)) < simulated_bubble(build_schedule(one_f_one_b, P, 1, M), built));
      const double h1 = simulated_bubble(build_schedule(zb_h1, P, 1, M), built);
      CHECK(simulated_bubble(s, half(built)) < h1 + 0.055);
      if ((P == 2 || P == 4 || P == 8) && (M == 2 * P || M == 4 * P)) CHECK(simulated_bubble(s, half(built)) < h1);
    }
  CHECK_THROWS_MATCHES(build_schedule(zb_v, 4, 3, 8), InputError,
                       Says("--pp-schedule zb-v runs two chunks per rank, placed in a V: give --pp-virtual 2 (got 3)"));
  CHECK_THROWS_MATCHES(build_schedule(zb_v, 4, 1, 8), InputError, Says("give --pp-virtual 2 (got 1)"));
}
