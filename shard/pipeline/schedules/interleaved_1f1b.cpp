// interleaved_1f1b.cpp — Megatron's interleaved 1F1B (Narayanan et al. 2021, section 2.2) over V
// chunks per rank: the k-th forward of rank r takes the micro-batch group k / (P V) (P
// micro-batches) through its chunks in turn, P micro-batches per chunk; backwards walk the chunks
// in reverse; the two lists merge 1f1b-style after a warm-up of (P - r - 1) * 2 + (V - 1) * P
// forwards (capped at V M). Needs M % P == 0. The bubble shrinks V-fold, for V times the sends.
//
// This order runs only because each action posts the receives of the next forward and the next
// backward that need one (Megatron's paired send/receive calls; check_schedule simulates it):
// posting a receive only at its own action, the waits for sent activations close on themselves
// around the ring of chunks (rank P - 1 feeds rank 0) whenever M > P.
#include "shard/pipeline/schedules/one_f_one_b.hpp"

namespace shardlab {
namespace {

std::vector<PipeAction> actions(int r, int P, int V, int M) {
  const int total = V * M;
  const auto micro = [=](int k) { return (k / (P * V)) * P + k % P; };
  const auto fwd = [=](int k) { return PipeAction{PipeAction::forward, ((k / P) % V) * P + r, micro(k)}; };
  const auto bwd = [=](int k) { return PipeAction{PipeAction::backward, (V - 1 - (k / P) % V) * P + r, micro(k)}; };
  return one_f_one_b_order(total, std::min(total, (P - r - 1) * 2 + (V - 1) * P), fwd, bwd);
}

double bubble_fraction(int P, int V, int M) {
  const double ramp = P - 1;
  return ramp / (double(V) * M + ramp);
}

}  // namespace

const PpScheduleDef& interleaved_1f1b_schedule() {
  static const PpScheduleDef def{
      .name = "interleaved-1f1b",
      .help = "--pp-virtual chunks per rank: a smaller bubble, more sends; micro-batches a multiple of --pp",
      .virtual_stages = true,
      .micro_batches_multiple_of_pp = true,
      .why_multiple = "micro-batches go through the chunks in groups of pp",
      .default_choice = true,
      .plan_virtual = {2, 3, 4, 6, 8},
      .plan_order = 2,
      .short_name = "interleaved",
      .actions = actions,
      .bubble_fraction = bubble_fraction,
      .bubble_formula = "(P-1)/(VM+P-1)",
      .bubble_stages = [](double p, double v, double) { return (p - 1) / v; },
  };
  return def;
}

}  // namespace shardlab
