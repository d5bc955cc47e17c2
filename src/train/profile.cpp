#include "src/train/profile.hpp"

#include <nlohmann/json.hpp>

#include "src/comm/mpi_comm.hpp"
#include "src/comm/mpi_runtime.hpp"
#include "src/comm/sim_comm.hpp"

namespace shardlab {
namespace {

// The largest micro-batch whose predicted peak fits the budget (0 if even one does not).
int64_t largest_fitting(const ProfileConfig& cfg, const std::string& s, int rank) {
  auto fits = [&](int64_t mb) { return predict(cfg, s, rank, mb).peak <= cfg.budget; };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 2;
  while (hi <= (1 << 16) && fits(hi)) lo = hi, hi *= 2;
  if (hi > (1 << 16)) return lo;
  while (hi - lo > 1) {
    int64_t mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

// Runs a few real steps as `rank` of cfg.world and reads the ledger: model states after set-up,
// then the last step's peak, its composition and its allocation timeline.
void measure(Backend& be, MPI_Comm world_comm, const ProfileConfig& cfg, const std::string& s, int rank,
             MemoryRow& row) {
  int procs = 1;
  MPI_CHECK(MPI_Comm_size(world_comm, &procs));
  Pool pool(be, PoolConfig{cfg.pool_budget});
  std::unique_ptr<Communicator> comm = procs == cfg.world ? make_mpi_communicator(world_comm, pool)
                                                          : make_sim_communicator(rank, cfg.world, pool);
  TrainConfig tc = cfg.train;
  tc.strategy.name = s;
  tc.batch = cfg.micro_batch * tc.accum * cfg.world;
  tc.steps = cfg.measure_steps;
  tc.log_path.clear();
  tc.save_path.clear();
  tc.record_step = true;
  Trainer t(be, pool, *comm, tc);
  for (int64_t k = 0; k < tc.steps; ++k) t.step(k);
  MemoryRow m = t.memory_row(row.label);
  m.predicted = row.predicted;
  m.fits = row.fits;
  m.max_micro_batch = row.max_micro_batch;
  row = std::move(m);
}

}  // namespace

Estimate predict(const ProfileConfig& cfg, const std::string& strategy, int rank, int64_t micro_batch) {
  TrainConfig t = cfg.train;
  t.strategy.name = strategy;
  return predict_step(t, cfg.world, rank, micro_batch);
}

MemoryReport run_profile(Backend& be, MPI_Comm world_comm, const ProfileConfig& cfg) {
  SHARD_REQUIRE(cfg.world >= 1, "--world {}: expected at least one rank", cfg.world);
  SHARD_REQUIRE(cfg.micro_batch >= 1, "--micro-batch {}: expected at least one sequence", cfg.micro_batch);
  cfg.train.spec.validate();
  for (const auto& s : cfg.strategies) {
    StrategyConfig probe = cfg.train.strategy;
    probe.name = s;
    probe.validate();
  }
  int procs = 1;
  MPI_CHECK(MPI_Comm_size(world_comm, &procs));
  SHARD_REQUIRE(!cfg.measure || procs == 1 || procs == cfg.world,
                "--measure with {} processes: start 1 (the sim communicator stands in for the others) or --world {}",
                procs, cfg.world);
  const auto& t = cfg.train;
  MemoryReport r;
  r.budget = cfg.budget;
  r.title = fmt::format("{}, world {}, micro-batch {} x {} tokens, accum {}, params {}, grads {}, {}",
                        t.spec.describe(), cfg.world, cfg.micro_batch, t.spec.seq, t.accum,
                        dtype_name(t.strategy.param_dtype), dtype_name(t.strategy.reduce_dtype), t.optim.kind);
  nlohmann::json c = {{"model", {{"name", t.spec.name}, {"layers", t.spec.layers}, {"dim", t.spec.dim},
                                 {"heads", t.spec.heads}, {"seq", t.spec.seq}, {"vocab", t.spec.vocab}}},
                      {"world", cfg.world},
                      {"micro_batch", cfg.micro_batch},
                      {"accum", t.accum},
                      {"param_dtype", dtype_name(t.strategy.param_dtype)},
                      {"reduce_dtype", dtype_name(t.strategy.reduce_dtype)},
                      {"optimizer", t.optim.kind},
                      {"prefetch", t.strategy.prefetch},
                      {"bucket_mb", t.strategy.bucket_mb},
                      {"measured", cfg.measure}};
  r.config_json = c.dump();
  MemoryRow dp_others;  // with real ranks, DP rank 1's measurement, received by rank 0
  for (const auto& s : cfg.strategies) {
    std::vector<std::pair<std::string, int>> ranks = {{s, 0}};
    if (s == "dp" && cfg.world > 1) ranks = {{"dp rank 0", 0}, {"dp others", 1}};
    for (const auto& [label, rank] : ranks) {
      MemoryRow row;
      row.label = label;
      row.predicted = predict(cfg, s, rank, cfg.micro_batch);
      if (cfg.budget) {
        row.fits = row.predicted.peak <= cfg.budget;
        row.max_micro_batch = largest_fitting(cfg, s, rank);
      }
      // Measured on the rank the row describes: with real ranks every process runs the step and
      // the row keeps rank 0's figures (DP's others: rank 1's, sent to rank 0).
      if (cfg.measure) {
        if (procs == 1) {
          measure(be, world_comm, cfg, s, rank, row);
        } else if (rank == 0) {
          measure(be, world_comm, cfg, s, 0, row);  // every process runs it; rank 0 reports
          int me = 0;
          MPI_CHECK(MPI_Comm_rank(world_comm, &me));
          if (s == "dp" && cfg.world > 1) {
            // Rank 1 sends its peak figures to rank 0 for the "dp others" row.
            std::array<uint64_t, 3 * kNumCategories + 1> buf{};
            if (me == 1) {
              for (int k = 0; k < kNumCategories; ++k) {
                buf[k] = row.measured_states[k];
                buf[kNumCategories + k] = row.measured_at_peak[k];
                buf[2 * kNumCategories + k] = row.measured_peak_by_category[k];
              }
              buf[3 * kNumCategories] = row.measured_peak;
              MPI_CHECK(MPI_Send(buf.data(), static_cast<int>(buf.size()), MPI_UINT64_T, 0, 7, world_comm));
            } else if (me == 0) {
              MPI_CHECK(MPI_Recv(buf.data(), static_cast<int>(buf.size()), MPI_UINT64_T, 1, 7, world_comm,
                                 MPI_STATUS_IGNORE));
              dp_others.measured = true;
              for (int k = 0; k < kNumCategories; ++k) {
                dp_others.measured_states[k] = buf[k];
                dp_others.measured_at_peak[k] = buf[kNumCategories + k];
                dp_others.measured_peak_by_category[k] = buf[2 * kNumCategories + k];
              }
              dp_others.measured_peak = buf[3 * kNumCategories];
              dp_others.measured_phase = "(rank 1)";
            }
          }
        } else {
          const MemoryRow& o = dp_others;
          row.measured = o.measured;
          row.measured_states = o.measured_states;
          row.measured_at_peak = o.measured_at_peak;
          row.measured_peak_by_category = o.measured_peak_by_category;
          row.measured_peak = o.measured_peak;
          row.measured_phase = o.measured_phase;
        }
      }
      r.rows.push_back(std::move(row));
    }
  }
  return r;
}

}  // namespace shardlab
