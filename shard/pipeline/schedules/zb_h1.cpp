// zb_h1.cpp — ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 3.1): 1F1B with
// each backward split into B (the input's gradient, which the previous stage waits for) and W (the
// weights' gradients, which nobody waits for). Rank r runs 1F1B's min(M, P - r) - 1 warm-up
// forwards and its forward/B alternation, and holds back its first min(r, M) weight passes: from
// then on each B is followed by the oldest W still owed, and the ones held back run at the end,
// where 1F1B's later ranks idle waiting for gradients. Micro-batches whose forward has run and B
// has not stay at 1F1B's min(M, P - r); with the W's held back, every rank owes at most P
// micro-batches a W (1F1B's first stage's count).
//
// With F = B = W the step takes max(3M + P - 1, 2(M + P) - 1) pass times against 1F1B's 3(M + P - 1):
// the bubble shrinks from (P - 1)(F + B + W) to (P - 1)(F + B - W).
#include <fmt/format.h>

#include <algorithm>

#include "shard/pipeline/registry.hpp"

namespace shardlab {
namespace {

std::vector<PipeAction> actions(int r, int P, int /*V*/, int M) {
  const int warmup = std::min(M, P - r) - 1, held = std::min(r, M);
  std::vector<PipeAction> l;
  int next_w = 0;
  const auto b_then_w = [&](int k) {
    l.push_back({PipeAction::backward, r, k});
    if (k >= held) l.push_back({PipeAction::weight, r, next_w++});
  };
  for (int k = 0; k < warmup; ++k) l.push_back({PipeAction::forward, r, k});
  for (int k = 0; k + warmup < M; ++k) {
    l.push_back({PipeAction::forward, r, k + warmup});
    b_then_w(k);
  }
  for (int k = M - warmup; k < M; ++k) b_then_w(k);
  while (next_w < M) l.push_back({PipeAction::weight, r, next_w++});
  return l;
}

// Every rank computes 3M pass times; the step is the last rank's (P - 1 forwards before its first,
// then never idle) or, for M < P, the first rank's last B and W after the gradient's walk back.
double bubble_fraction(int P, int /*V*/, int M) {
  const double span = std::max(3.0 * M + P - 1, 2.0 * (M + P) - 1);
  return 1 - 3.0 * M / span;
}

std::string warning(int P, int V, int M) {
  if (M >= P) return "";
  return fmt::format("{} micro-batches for {} stages: zb-h1 cannot fill its ramp and the bubble is {:.0f}%; give "
                     "--micro-batches {} or more", M, P, 100 * bubble_fraction(P, V, M), P);
}

}  // namespace

const PpScheduleDef& zb_h1_schedule() {
  static const PpScheduleDef def{
      .name = "zb-h1",
      .help = "1f1b with the weights' gradients split off and run where 1f1b idles: its activations in flight "
              "plus the weight passes owed, a third of its bubble",
      .splits_backward = true,
      .plan_order = 3,
      .actions = actions,
      .bubble_fraction = bubble_fraction,
      .bubble_formula = "(P-1)/(3M+P-1)",
      // In stage times (F + B + W): the ramp of (P - 1)(F + B - W), a third of 1f1b's with B = W = F;
      // for M < P the span's 2(M + P) - 1 passes less the 3M computed.
      .bubble_stages = [](double p, double, double m) { return std::max(p - 1, 2 * p - 1 - m) / 3; },
      .warning = warning,
  };
  return def;
}

}  // namespace shardlab
