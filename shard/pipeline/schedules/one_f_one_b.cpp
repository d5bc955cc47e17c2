// one_f_one_b.cpp — 1F1B (PipeDream-Flush, Narayanan et al. 2021; Megatron's default): rank r runs
// min(M, P - r) warm-up forwards, then alternates one forward and one backward, then drains the
// backwards. A stage holds at most min(M, P - r) micro-batches; the bubble is gpipe's.
#include <fmt/format.h>

#include "shard/pipeline/schedules/one_f_one_b.hpp"

namespace shardlab {
namespace {

std::vector<PipeAction> actions(int r, int P, int /*V*/, int M) {
  const auto fwd = [=](int k) { return PipeAction{PipeAction::forward, r, k}; };
  const auto bwd = [=](int k) { return PipeAction{PipeAction::backward, r, k}; };
  return one_f_one_b_order(M, std::min(M, P - r) - 1, fwd, bwd);
}

double bubble_fraction(int P, int /*V*/, int M) {
  const double ramp = P - 1;
  return ramp / (M + ramp);
}

// Fewer micro-batches than stages: every forward runs before the first backward anyway.
std::string warning(int P, int V, int M) {
  if (M >= P) return "";
  return fmt::format("{} micro-batches for {} stages: 1f1b holds as many activations as gpipe here and the bubble is "
                     "{:.0f}%; give --micro-batches {} or more", M, P, 100 * bubble_fraction(P, V, M), P);
}

}  // namespace

const PpScheduleDef& one_f_one_b_schedule() {
  static const PpScheduleDef def{
      .name = "1f1b",
      .help = "one forward, one backward: at most pp - stage micro-batches held",
      .default_choice = true,
      .plan_order = 0,
      .actions = actions,
      .bubble_fraction = bubble_fraction,
      .bubble_formula = "(P-1)/(M+P-1)",
      .bubble_stages = [](double p, double v, double) { return (p - 1) / v; },
      .warning = warning,
  };
  return def;
}

}  // namespace shardlab
