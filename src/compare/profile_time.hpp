// profile_time.hpp — `shardlab profile --time`: how long a step takes, predicted from the step
// itself. The same step the memory profile runs on the meta backend writes its cost ledger
// (src/backend/cost.hpp) as it would run on the target device (the CPU, or a GPU: the CUDA
// backend's launches and tensor cores, without a GPU or a CUDA build), and the device model
// (src/backend/price.hpp) prices it: per rank, the step split into compute, exposed communication,
// launch gaps and host waits, and the operations that take the time.
#pragma once
#include <string>
#include <vector>

#include "src/backend/price.hpp"
#include "src/compare/profile.hpp"

namespace shardlab {

struct TimeRow {
  std::string label;  // the strategy (and stage)
  StrategyKind kind = StrategyKind::ddp;
  int rank = 0;
  StepPrice price;
  double bubble_s = 0;     // under --pp: what the schedule's bubble adds to this stage's step
  double step_s() const { return price.total + bubble_s; }
};

struct TimeReport {
  std::string model;
  int world = 1;
  int64_t micro_batch = 1, seq = 0;
  int accum = 1;
  Device target = Device::cpu;
  DeviceModel device;
  std::vector<TimeRow> rows;
  double tokens = 0;       // the job's tokens per step
  double model_flops = 0;  // the family's model FLOPs for them (6N + attention per token), per rank
  double peak() const;     // the device's tensor peak (its vector peak without one), FLOP/s
  double mfu(const TimeRow& row) const;  // a rank's model FLOP/s over that peak, at the row's step
};

// This CPU's rates for the device model, measured on `be` (a CPU backend) in about a second: the
// best of a few 1,024^3 sgemms (FLOP/s) and of a few axpy passes over 64 MiB (bytes/s).
DeviceModel measure_cpu_model(Backend& be);

// Every strategy of cfg at rank 0 (every stage's first rank under --pp), on `target`, priced by `d`
// (src/train/price_layout.hpp: links across nodes of d.ranks_per_node ranks at d.inter).
TimeReport run_time_profile(const ProfileConfig& cfg, Device target, DeviceModel d);

}  // namespace shardlab
