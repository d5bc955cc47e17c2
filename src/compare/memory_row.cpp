// memory_row.cpp — memory_row.hpp.
#include "src/compare/memory_row.hpp"

#include <chrono>

#include "src/train/predict.hpp"

namespace shardlab {

MemoryRow memory_row(Trainer& trainer, const std::string& label) {
  const TrainConfig& cfg = trainer.config();
  Communicator& comm = trainer.comm();
  const int64_t micro = cfg.batch / trainer.mesh().dp_size() / cfg.accum;
  MemoryRow row;
  row.label = label;
  row.predicted = predict_step(cfg, comm.world_size(), comm.rank(), micro);
  const Estimate m = trainer.measured_step();
  row.measured = true;
  row.measured_states = m.model_states;
  row.measured_peak = m.peak;
  row.measured_at_peak = m.at_peak;
  row.measured_peak_by_category = m.peak_by_category;
  row.measured_phase = m.peak_phase;
  row.measured_host = m.host;
  if (cfg.record_step) {
    const Ledger& L = trainer.ledger();
    row.measured_timeline = L.timeline();  // cleared at the start of each step
    for (const CommEvent& e : comm.stats().events)
      row.measured_comm.push_back(
          {std::chrono::duration<double, std::milli>(e.issued - L.start()).count(), comm_op_name(e.op), e.bytes});
  }
  if (comm.stats().steps > 0) row.comm_bytes = comm.stats().last_step_bytes;
  return row;
}

}  // namespace shardlab
