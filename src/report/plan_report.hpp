// plan_report.hpp — `shardlab plan`'s renderings beside its text table (print_plan, plan.hpp): the
// configurations walked as JSON and as one HTML page.
#pragma once
#include <string>

#include "src/plan/plan.hpp"

namespace shardlab {

std::string plan_json(const PlanConfig& cfg, const PlanResult& plan);  // schema shardlab.plan/2
// One self-contained page (no scripts, no network): the rates and the ranked table with each
// configuration's time split as a stacked bar.
std::string plan_html(const PlanConfig& cfg, const PlanResult& plan);

}  // namespace shardlab
