// zb_v.cpp — ZB-V (Qi et al. 2024, section 6; DeepSeek-V3's DualPipe-V is its relative): two chunks
// per rank placed in a V (rank r holds chunks r and 2P - 1 - r: schedule.hpp), each backward split
// into B and W as in zb-h1. The first rank holds the embedding and the head, so the loss never
// waits for a message and every rank does the same work.
//
// The order is built by list scheduling, in the spirit of the paper's automatic scheduler: whenever
// a rank is free it runs, in this order of preference, a forward whose input is there (the rank's
// later chunk first: it finishes a micro-batch's forward), unless the rank already holds 2P
// chunk-micro-batches whose W has not run (1F1B's first stage's P micro-batches of a whole stage:
// the memory cap); else a B whose gradient is there (the earlier chunk first: its gradient is the
// one the previous rank waits for); else the oldest W it owes. Every rank computes 6M chunk passes
// and the last rank's first input needs P - 1 forwards, so no order beats 6M + P - 1 at equal
// passes (the theory's bound). The passes it is built for are not equal (kBuiltFor): orders built
// for equal ones fall apart when B is longer; this one stays below 1f1b's bubble at equal passes
// and at its own, and below zb-h1's at its own for P 2-8 with M = 2P or 4P
// (tests/test_pipeline_schedule.cpp).
#include <fmt/format.h>

#include <deque>
#include <limits>
#include <mutex>
#include <optional>

#include "src/core/check.hpp"
#include "shard/pipeline/schedule.hpp"

namespace shardlab {
namespace {

// List scheduling under the runner's rules (check_schedule; this schedule posts its receives per
// chunk): on reaching an action a rank posts the receives of each of its chunks' next kPostAhead
// forwards and backwards; an action whose output goes to another rank runs only once that rank has
// posted its receive (may_send), so every send is received as it is made and no cycle of waits can
// close. build_schedule checks the result.
// With one receive ahead a sender may run only a message ahead of its receiver, and the steady
// state idles; two cost more posted buffers (a receive posted brings the earlier ones from the same
// sender with it; the prediction counts them).
constexpr int kPostAhead = 2;

class Greedy {
 public:
  Greedy(int P, int M, double f, double b, double w)
      : P_(P), M_(M), C_(2 * P), cost_{f, b, w}, done_(3 * static_cast<size_t>(C_ * M), -1),
        ranks_(static_cast<size_t>(P)) {}

  std::vector<std::vector<PipeAction>> run() {
    const int64_t total = 3LL * C_ * M_;
    int64_t count = 0;
    for (double t = 0; count < total;) {
      for (Rank& k : ranks_)  // a free rank has reached its next action and posted its receives
        if (k.free <= t)
          for (int li : {0, 1}) k.post_f[li] = k.next_f[li] + kPostAhead, k.post_b[li] = k.next_b[li] + kPostAhead;
      for (int r = 0; r < P_; ++r)
        if (ranks_[static_cast<size_t>(r)].free <= t && pick(r, t)) ++count;
      double next = std::numeric_limits<double>::infinity();  // the next time a rank is free
      for (const Rank& k : ranks_)
        if (k.free > t) next = std::min(next, k.free);
      SHARD_CHECK(count == total || next < std::numeric_limits<double>::infinity(),
                  "zb-v: list scheduling of pp {} over {} micro-batches stops at {} of {} actions", P_, M_, count, total);
      t = next;
    }
    std::vector<std::vector<PipeAction>> lists;
    for (Rank& k : ranks_) lists.push_back(std::move(k.list));
    return lists;
  }

 private:
  struct Rank {
    double free = 0;
    int next_f[2] = {0, 0}, next_b[2] = {0, 0};  // per local chunk (0: r, 1: 2P - 1 - r)
    // The micro-batches below these have their receives posted (at the rank's last arrival at an
    // action: the next kPostAhead forwards and backwards of each chunk from there).
    int post_f[2] = {0, 0}, post_b[2] = {0, 0};
    int held = 0;                                // forwards whose W has not run
    std::deque<PipeAction> owed;                 // B's awaiting their W, in order
    std::vector<PipeAction> list;
  };

  int rank_of(int c) const { return chunk_rank(c, P_, true); }
  int local(int c) const { return c < P_ ? 0 : 1; }  // the chunk's place on its rank
  size_t index(PipeAction::Kind k, int chunk, int micro) const {
    return static_cast<size_t>(k) * static_cast<size_t>(C_ * M_) + static_cast<size_t>(chunk * M_ + micro);
  }
  bool ready(PipeAction::Kind k, int chunk, int micro, double t) const {
    const double at = done_[index(k, chunk, micro)];
    return at >= 0 && at <= t;
  }
  // The receive of the message `x` consumes (named by x), posted by its rank: x is among its chunk's
  // next forwards or backwards as of the rank's last arrival at an action, or an earlier one.
  bool posted(const PipeAction& x) const {
    const Rank& q = ranks_[static_cast<size_t>(rank_of(x.chunk))];
    const int li = local(x.chunk);
    return x.micro < (x.kind == PipeAction::forward ? q.post_f[li] : q.post_b[li]);
  }
  // An action whose output goes to another rank runs only once that rank has posted its receive
  // (so no send ever waits, and no order of sends can close a cycle of waits: posted receives stay
  // posted, so the runner's wait for this rank's own sends never holds it).
  bool may_send(int r, const PipeAction& a) const {
    if (a.kind == PipeAction::forward && a.chunk < C_ - 1 && rank_of(a.chunk + 1) != r)
      return posted({PipeAction::forward, a.chunk + 1, a.micro});
    if (a.kind == PipeAction::backward && a.chunk > 0 && rank_of(a.chunk - 1) != r)
      return posted({PipeAction::backward, a.chunk - 1, a.micro});
    return true;
  }
  // Whether the message `a` takes has arrived by t (the first chunk's forward and the loss's
  // backward take none).
  bool message_there(const PipeAction& a, double t) const {
    if (a.kind == PipeAction::forward) return a.chunk == 0 || ready(PipeAction::forward, a.chunk - 1, a.micro, t);
    return a.chunk == C_ - 1 || ready(PipeAction::backward, a.chunk + 1, a.micro, t);
  }

  // The action rank r runs at time t, if any, recorded with its end time.
  bool pick(int r, double t) {
    Rank& k = ranks_[static_cast<size_t>(r)];
    const int chunks[2] = {r, C_ - 1 - r};
    std::optional<PipeAction> a;
    for (int li : {1, 0}) {  // forward: the later chunk first
      const PipeAction f{PipeAction::forward, chunks[li], k.next_f[li]};
      if (!a && f.micro < M_ && k.held < 2 * P_ && message_there(f, t) && may_send(r, f))
        a = f, ++k.next_f[li], ++k.held;
    }
    for (int li : {0, 1}) {  // B: the earlier chunk first
      const PipeAction b{PipeAction::backward, chunks[li], k.next_b[li]};
      if (!a && b.micro < k.next_f[li] && message_there(b, t) && may_send(r, b))
        a = b, ++k.next_b[li], k.owed.push_back(b);
    }
    if (!a && !k.owed.empty()) {
      a = PipeAction{PipeAction::weight, k.owed.front().chunk, k.owed.front().micro};
      k.owed.pop_front();
      --k.held;
    }
    if (!a) return false;
    k.free = t + cost_[a->kind];
    done_[index(a->kind, a->chunk, a->micro)] = k.free;
    k.list.push_back(*a);
    return true;
  }

  const int P_, M_, C_;
  const double cost_[3];      // F, B, W
  std::vector<double> done_;  // per action: when it ends, -1 before it runs
  std::vector<Rank> ranks_;
};

// The pass times the order is built for, per chunk: F 1, B 1.5, W 0.75, a transformer block's on
// this project's CPU machines (bench-train: B carries attention's backward, the norms' and the
// biases', W only the weight GEMMs). Built for equal passes, the order idles 17-18% of the step at
// P 2, M 8 or 16 when B = 1.5 F, W = 0.75 F; built so, 2.8% and 1.4% (2.0% and 1.0% at equal passes).
constexpr double kBuiltFor[3] = {1, 1.5, 0.75};

// Rank r's list. The registry asks rank by rank, and one scheduling run gives every rank's: the last
// (P, M)'s lists are kept, so building a schedule schedules once, not P times.
std::vector<PipeAction> actions(int r, int P, int /*V*/, int M) {
  static std::mutex mu;
  static std::pair<int, int> key{0, 0};
  static std::vector<std::vector<PipeAction>> lists;
  const std::lock_guard<std::mutex> lock(mu);
  if (key != std::pair{P, M}) {
    lists = Greedy(P, M, kBuiltFor[0], kBuiltFor[1], kBuiltFor[2]).run();
    key = {P, M};
  }
  return lists.at(static_cast<size_t>(r));
}

// The bound: each rank computes 6M chunk passes, and the last rank's first input arrives after P - 1.
double bubble_fraction(int P, int /*V*/, int M) { return double(P - 1) / (6.0 * M + P - 1); }

std::string warning(int P, int /*V*/, int M) {
  if (M >= P) return "";
  return fmt::format("{} micro-batches for {} stages: zb-v cannot fill its ramp; give --micro-batches {} or more", M, P,
                     P);
}

}  // namespace

const PpScheduleDef& zb_v_schedule() {
  static const PpScheduleDef def{
      .name = "zb-v",
      .help = "--pp-virtual 2 chunks per rank in a V, backwards split as zb-h1: the smallest bubble, 1f1b's "
              "first stage's micro-batches held on every stage",
      .virtual_stages = true,
      .splits_backward = true,
      .v_shape = true,
      .post_per_chunk = kPostAhead,
      .plan_virtual = {2},
      .plan_order = 4,
      .actions = actions,
      .bubble_fraction = bubble_fraction,
      .bubble_formula = ">= (P-1)/(6M+P-1)",
      .bubble_is_bound = true,
      // In stage times (a stage's F + B + W, two chunks'): the ramp of P - 1 chunk forwards (the
      // bound: optimistic where the order does not reach it, and for M < P).
      .bubble_stages = [](double p, double, double) { return (p - 1) / 6; },
      .warning = warning,
  };
  return def;
}

}  // namespace shardlab
