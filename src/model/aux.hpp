// aux.hpp — the auxiliary channel: what a model's units report beside the loss during one
// micro-step's forward (a mixture of experts' routing statistics behind its balancing loss), carried
// by the runner and the pipeline executor without knowing what it holds.
//
// The family makes one per training micro-step (ModelFamily::aux_channel; none for a model without
// one) and the units' forwards add to it (UnitContext::aux; not while checkpointing recomputes a
// forward). Before any backward the runner sums it over the ranks that share the objective
// (UnitHooks::reduce_aux: the data- and context-parallel group) and calls finish(), which computes
// the auxiliary loss and what the backward reads. Under --pp it travels behind the activations from
// the first chunk to the last, and back behind the gradients (pack, unpack).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace shardlab {

class AuxChannel {
 public:
  virtual ~AuxChannel() = default;
  // The values summed over ranks (f32, as the communicator reduces them) and sent between stages.
  virtual int64_t packed_size() const = 0;
  virtual std::vector<float> pack() const = 0;
  virtual void unpack(std::span<const float> packed) = 0;
  // After the sum: the auxiliary loss and its gradient's factors. dlogit_scale is the runner's
  // (1 / the global batch's positions): with it the channel weighs this micro-step's share.
  virtual void finish(float dlogit_scale) = 0;
  virtual double loss() const = 0;  // finish()'s auxiliary loss (what the objective adds, before its coefficient)
  // The step's statistics, added up over micro-steps (stats_size() values; the family's own reading
  // of them: blocks/moe.hpp's MoeRouting for a mixture of experts).
  virtual int64_t stats_size() const = 0;
  virtual void add_stats(std::vector<double>& totals) const = 0;
};

}  // namespace shardlab
