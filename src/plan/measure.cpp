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
  std::vector<PlanEntry*> top;
  for (PlanEntry& e : plan)
    if (e.fits && static_cast<int>(top.size()) < k) top.push_back(&e);
  // In rounds, each configuration a share of the steps in turn (a fresh trainer, its first step a
  // warm-up), so a change in the machine's load while they run falls on all of them alike.
  const int64_t timed = steps - 1, rounds = std::clamp<int64_t>(timed / 5, 1, 4);
  std::vector<std::vector<double>> ms(top.size());
  std::vector<uint64_t> peak(top.size());
  for (int64_t r = 0; r < rounds; ++r)
    for (size_t i = 0; i < top.size(); ++i) {
      TrainConfig t = top[i]->config(pc);
      const int64_t n = timed / rounds + (r < timed % rounds) + 1;
      t.steps = n;
      t.schedule.kind = ScheduleKind::constant;
      Pool pool(be, pools);
      auto comm = connect(pool);
      {
        Trainer trainer(be, pool, *comm, t);
        for (int64_t s = 0; s < n; ++s) {
          StepStats st = trainer.step(s);
          if (s > 0) ms[i].push_back(st.ms);
          peak[i] = std::max(peak[i], st.peak_bytes);
        }
      }
      if (r + 1 < rounds) {  // progress: the results come with the last round
        if (i + 1 == top.size() && comm->rank() == 0)
          std::fprintf(stderr, "measure: round %lld of %lld done\n", static_cast<long long>(r + 1),
                       static_cast<long long>(rounds));
        continue;
      }
      // Rank 0 takes the slowest rank's time (in ns) and the largest peak.
      PlanEntry& e = *top[i];
      const std::vector<uint64_t> mine = {static_cast<uint64_t>(median(ms[i]) * 1e6), peak[i]};
      const std::vector<uint64_t> all = comm->gather_u64(mine, 0);
      uint64_t ns = 0, most = 0;
      for (size_t j = 0; j + 1 < all.size(); j += 2) ns = std::max(ns, all[j]), most = std::max(most, all[j + 1]);
      e.measured_step_ms = double(ns) / 1e6;
      e.measured_peak = most;
      if (comm->rank() == 0) {
        std::printf("measured %zu/%zu: %s, checkpointing %s, micro-batch %lld x %lld: %.1f ms (predicted %.1f), peak %s "
                    "(predicted %s)\n", i + 1, top.size(), e.label().c_str(), checkpointing_name(e.checkpointing),
                    static_cast<long long>(e.micro_batch), static_cast<long long>(e.accum), *e.measured_step_ms,
                    e.step_ms(), format_bytes(double(*e.measured_peak)).c_str(), format_bytes(double(e.peak)).c_str());
        std::fflush(stdout);
      }
    }
}

}  // namespace shardlab
