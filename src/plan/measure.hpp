// measure.hpp — plan --measure-top: the top configurations of a plan run for a few steps each on
// the real ranks, their measured step time and peak beside the predicted ones.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "src/plan/plan.hpp"

namespace shardlab {

// The world's communicator over the real transport, on a pool (every rank calls it together).
using ConnectWorld = std::function<std::unique_ptr<Communicator>(Pool&)>;

// Runs the top `k` fitting entries of the plan for `steps` steps each and fills their measured step
// time (the median of all but warm-ups, the slowest rank's) and the largest peak of any rank (under
// --pp the stages differ); rank 0 prints a line per configuration. The steps - 1 timed steps go in
// up to 4 rounds of at least 5 over the configurations in turn, each round's first step a warm-up.
// Collective over the world.
void measure_plan(Backend& be, const ConnectWorld& connect, const PlanConfig& pc, const PoolConfig& pools,
                  std::vector<PlanEntry>& plan, int k, int64_t steps);

}  // namespace shardlab
