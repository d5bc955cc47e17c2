// profile.hpp — `shardlab profile`: predicted (and with --measure, measured) memory per rank for
// every strategy at any world size, the savings against DDP and DP, and what fits a budget.
#pragma once
#include <mpi.h>

#include "memory/report.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {

struct ProfileConfig {
  TrainConfig train;          // model, dtypes, optimizer, accum; batch is derived from micro_batch
  int world = 8;              // the world size to profile
  int64_t micro_batch = 4;    // sequences per rank per micro-step
  std::vector<std::string> strategies = {"dp", "ddp", "zero1", "zero2", "zero3"};
  uint64_t budget = 0;        // per rank; 0 = none
  bool measure = false;       // also run real steps and read the ledger
  uint64_t pool_budget = 0;   // --device-memory for the measured runs (0 = none)
  int measure_steps = 2;
};

// Collective over `world_comm`. With --measure and fewer processes than cfg.world, one process
// plays rank 0 (and, for DP, rank 1) through the sim communicator.
MemoryReport run_profile(Backend& be, MPI_Comm world_comm, const ProfileConfig& cfg);

// Predicted memory of one rank for a strategy (rank 0, or 1 for DP's replicas).
Estimate predict(const ProfileConfig& cfg, const std::string& strategy, int rank, int64_t micro_batch);

}  // namespace shardlab
