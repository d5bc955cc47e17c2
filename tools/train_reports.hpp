// train_reports.hpp — train's --json / --html / --trace of a finished run.
#pragma once
#include "src/comm/mpi_runtime.hpp"
#include "src/train/trainer.hpp"
#include "tools/options.hpp"

namespace shardlab {

// Rank 0's memory report, the run report, and every rank's last step on the trace (collective).
void write_train_reports(Trainer& trainer, Communicator& comm, const cli::ReportOptions& reports, const StepStats& last,
                         const MpiRuntime& mpi);

}  // namespace shardlab
