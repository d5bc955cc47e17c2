// ledger_price.hpp — plan --ledger-top K: the top K layouts that fit priced from their own steps
// (src/train/price_layout.hpp: the meta step's cost ledger on every pipeline stage, the device
// model, the schedule's bubble), beside the search's model. The search itself still ranks by the
// model of plan_time.hpp; this is the step pricing itself, for the layouts plan recommends.
#pragma once
#include "src/backend/price.hpp"
#include "src/plan/plan.hpp"

namespace shardlab {

// Sets ledger_step_ms and ledger_top_op of the first `top` fitting entries, priced on `device` (its
// ranks_per_node set to the plan's).
void price_from_ledgers(const PlanConfig& pc, std::vector<PlanEntry>& entries, size_t top, DeviceModel device);

}  // namespace shardlab
