// phase.hpp — what a step is doing when memory moves: the kind of work and the unit it runs.
// The runtime sets a Phase (an enum and an index, no strings); labels such as "backward h.3" are
// built only when a report prints, from the unit names the report carries.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shardlab {

// weight: a zero-bubble pipeline schedule's W pass of a unit (its held weight-gradient GEMMs).
enum class PhaseKind : uint8_t { idle, begin_step, forward, loss, backward, optimizer, weight };

struct Phase {
  PhaseKind kind = PhaseKind::idle;
  int unit = -1;  // forward and backward: the unit's index; -1 otherwise
  bool operator==(const Phase&) const = default;
  static Phase forward(size_t u) { return {PhaseKind::forward, static_cast<int>(u)}; }
  static Phase backward(size_t u) { return {PhaseKind::backward, static_cast<int>(u)}; }
  static Phase weight(size_t u) { return {PhaseKind::weight, static_cast<int>(u)}; }
};

// "forward h.3", "loss", "backward head", "weight grads h.3", "optimizer step", "begin step", or "" when idle.
std::string phase_label(const Phase& p, const std::vector<std::string>& unit_names);

}  // namespace shardlab
