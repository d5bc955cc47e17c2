// report.cpp — MemoryRow's one operation on data (the rendering is src/report/memory_report.cpp).
#include "memory/report.hpp"

namespace shardlab {

void MemoryRow::take_measurement(const MemoryRow& m) {
  measured = m.measured;
  measured_states = m.measured_states;
  measured_at_peak = m.measured_at_peak;
  measured_peak_by_category = m.measured_peak_by_category;
  measured_peak = m.measured_peak;
  measured_phase = m.measured_phase;
  measured_host = m.measured_host;
  measured_timeline = m.measured_timeline;
  measured_comm = m.measured_comm;
  comm_bytes = m.comm_bytes;
}

}  // namespace shardlab
