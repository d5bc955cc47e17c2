// measure.cpp — plan --measure-top (measure.hpp).
#include "src/plan/measure.hpp"

#include <algorithm>
#include <cstdio>

#include "src/core/stats.hpp"
#include "src/core/units.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {

void measure_plan(Backend& be, const ConnectWorld& connect, const PlanConfig& pc, const PoolConfig& pools,
                  std::vector<PlanEntry>& plan, int k, int64_t steps) {
  int done = 0;
  for (PlanEntry& e : plan) {
    if (!e.fits || done == k) break;
    ++done;
    TrainConfig t = e.config(pc);
    t.steps = steps;
    t.schedule.kind = ScheduleKind::constant;
    Pool pool(be, pools);
    auto comm = connect(pool);
    std::vector<double> ms;
    uint64_t peak = 0;
    {
      Trainer trainer(be, pool, *comm, t);
      for (int64_t s = 0; s < steps; ++s) {
        StepStats st = trainer.step(s);
        if (s > 0) ms.push_back(st.ms);
        peak = std::max(peak, st.peak_bytes);
      }
    }
    // Rank 0 takes the slowest rank's time (in ns) and the largest peak.
    const std::vector<uint64_t> mine = {static_cast<uint64_t>(median(ms) * 1e6), peak};
    const std::vector<uint64_t> all = comm->gather_u64(mine, 0);
    uint64_t ns = 0, most = 0;
    for (size_t i = 0; i + 1 < all.size(); i += 2) ns = std::max(ns, all[i]), most = std::max(most, all[i + 1]);
    e.measured_step_ms = double(ns) / 1e6;
    e.measured_peak = most;
    if (comm->rank() == 0) {
      std::printf("measured %d/%d: %s, checkpointing %s, micro-batch %lld x %lld: %.1f ms (predicted %.1f), peak %s "
                  "(predicted %s)\n", done, k, e.label().c_str(), checkpointing_name(e.checkpointing),
                  static_cast<long long>(e.micro_batch), static_cast<long long>(e.accum), *e.measured_step_ms,
                  e.step_ms(), format_bytes(double(*e.measured_peak)).c_str(), format_bytes(double(e.peak)).c_str());
      std::fflush(stdout);
    }
  }
}


}  // namespace shardlab
