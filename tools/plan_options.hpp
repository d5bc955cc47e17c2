// plan_options.hpp — plan's option group: its own flags beside the groups it shares (options.hpp),
// and what they set in a PlanConfig (pins, device rates and memory).
#pragma once
#include <string>

#include "src/plan/plan.hpp"
#include "tools/options.hpp"

namespace shardlab::cli {

// plan's flags beside the option groups it shares with the other commands.
struct PlanFlags {
  RunOptions run;
  MemoryOptions memory;
  ModelOptions model;
  StrategyOptions strategy;
  MeshOptions mesh;
  ReportOptions reports;
  DeviceRateOptions device;
  std::string family, kind, ckpt, offload, optimizer = "adamw";
  bool calibrate = false;
  int measure_top = 0, measure_steps = 6, show = 15, ledger_top = 0;
  int64_t micro_batch = 0;
};

Desc plan_options(PlanFlags& f, PlanConfig& pc);
// The registry's families joined by `sep` ("gpt2 or llama"), each with the preset --family starts
// from ("gpt2: from small") when `with_preset`.
std::string family_names(const char* sep, bool with_preset = false);
// Pins: every mesh flag given, and the levers.
void set_pins(PlanPins& pins, const PlanFlags& f, const po::variables_map& vm);
// The ZeRO++ levers tried beside plain zero3 across nodes (PlanConfig::zeropp), checked as train would.
void set_zeropp(PlanConfig& pc, const PlanFlags& f);
// The device: a preset's rates (overridden by the rate flags) and memory, or --calibrate's budget.
void set_device(PlanConfig& pc, const PlanFlags& f, const po::variables_map& vm);

}  // namespace shardlab::cli
