// profile.hpp — `shardlab profile`: predicted (and with --measure, measured) memory per rank for
// every strategy at any world size, the savings against DDP and DP, and what fits a budget.
#pragma once
#include "memory/report.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {

struct ProfileConfig {
  TrainConfig train;          // model, dtypes, optimizer, accum; batch is derived from micro_batch
  int world = 8;              // the world size to profile
  int64_t micro_batch = 4;    // sequences per rank per micro-step
  std::vector<StrategyKind> strategies = all_strategies();
  uint64_t budget = 0;        // per rank, device tier (--device-memory); 0 = none. With it: the cheapest levers that fit
  bool measure = false;       // also run real steps and read the ledger
  uint64_t host_budget = 0;   // per rank, host tier (--host-memory); 0 = none
  PoolConfig pools;           // --device-memory and --host-memory for the measured runs (0 = none)
  int measure_steps = 2;
};

// Collective over the group. With --measure and one process (fewer than cfg.world), that process
// plays rank 0 (and, for DP, rank 1) through the sim communicator; with cfg.world processes the
// ranks are real. The report is complete on rank 0.
MemoryReport run_profile(Backend& be, const ProcessGroup& group, const ProfileConfig& cfg);

// Predicted memory of one rank for a strategy (rank 0, or 1 for DP's replicas).
Estimate predict(const ProfileConfig& cfg, StrategyKind strategy, int rank, int64_t micro_batch,
                 bool timeline = true);

}  // namespace shardlab
