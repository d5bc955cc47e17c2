// gpipe.cpp — GPipe (Huang et al. 2019): every forward of the step (micro-batches 0..M-1), then
// every backward (0..M-1). A stage holds all M micro-batches' activations at once; the bubble is
// the ramp of P - 1 stage times at each end.
#include "shard/pipeline/registry.hpp"

namespace shardlab {
namespace {

std::vector<PipeAction> actions(int r, int /*P*/, int /*V*/, int M) {
  std::vector<PipeAction> l;
  for (int m = 0; m < M; ++m) l.push_back({PipeAction::forward, r, m});
  for (int m = 0; m < M; ++m) l.push_back({PipeAction::backward, r, m});
  return l;
}

double bubble_fraction(int P, int /*V*/, int M) {
  const double ramp = P - 1;
  return ramp / (M + ramp);
}

}  // namespace

const PpScheduleDef& gpipe_schedule() {
  static const PpScheduleDef def{
      .name = "gpipe",
      .help = "every forward, then every backward: all micro-batches' activations held",
      .plan_order = 1,  // as fast as 1f1b in the time model, holding more
      .actions = actions,
      .bubble_fraction = bubble_fraction,
      .bubble_formula = "(P-1)/(M+P-1)",
      .bubble_stages = [](double p, double v, double) { return (p - 1) / v; },
  };
  return def;
}

}  // namespace shardlab
