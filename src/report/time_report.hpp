// time_report.hpp — `profile --time` rendered: the terminal tables and a versioned JSON document
// (schema shardlab.profile_time/1, docs/commands.md).
#pragma once
#include <cstdio>
#include <string>

#include "src/compare/profile_time.hpp"

namespace shardlab {

// Per row the step and its split; then, for each row, the operations that take the time (at most
// `top`, 0 = all), a flag on those with under-filled launches.
void print_time_report(const TimeReport& r, std::FILE* out, int top = 20);
std::string time_report_json(const TimeReport& r);

}  // namespace shardlab
