// memory_row.hpp — one rank's memory row of a report (memory/report.hpp's MemoryRow) from a
// trainer that has run its steps: predicted for the run's configuration (src/train/predict) and
// measured by its ledger (model states after set-up; the last step's peak, composition and phase;
// with record_step its timeline and collectives). compare, profile and train's reports read it.
#pragma once
#include <string>

#include "memory/report.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {

MemoryRow memory_row(Trainer& trainer, const std::string& label);

}  // namespace shardlab
