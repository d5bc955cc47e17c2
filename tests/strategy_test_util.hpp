// strategy_test_util.hpp — what the multi-rank strategy tests share: the parity configuration,
// training on the test's transport and on one rank, the parity check, and measured = predicted.
#pragma once
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "src/comm/mpi_comm.hpp"
#include "src/comm/sim_comm.hpp"
#include "src/model/model.hpp"
#include "src/compare/compare.hpp"
#include "src/train/predict.hpp"
#include "src/compare/profile.hpp"
#include "src/train/trainer.hpp"
#include "tests/mpi_test_env.hpp"

namespace shardlab::strategy_test {

using shardlab::test::g_mpi;

struct RunOut {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;  // per unit, gathered
  std::vector<double> comm_bytes;          // per step, this rank
  std::vector<float> aux;                  // per step: a mixture of experts' auxiliary loss
};

inline TrainConfig parity_config(StrategyKind strategy, int world) {
  TrainConfig cfg;
  cfg.spec = model_preset("tiny");
  cfg.strategy.kind = strategy;
  cfg.steps = 10;
  cfg.batch = 12 % world == 0 ? 12 : 2 * world;
  cfg.schedule.lr = 1e-3f;
  cfg.schedule.warmup_steps = 2;
  cfg.seed = 4242;
  return cfg;
}

inline ProcessGroup world_group() {
  return {g_mpi->rank(), g_mpi->world(), [](Pool& pool) { return test::test_communicator(pool); }};
}

inline RunOut train(Communicator& comm, Pool& pool, const TrainConfig& cfg) {
  Trainer t(pool.backend(), pool, comm, cfg);
  RunOut out;
  for (int64_t s = 0; s < cfg.steps; ++s) {
    StepStats st = t.step(s);
    out.losses.push_back(st.loss);
    out.comm_bytes.push_back(st.comm_bytes);
    if (st.aux_loss) out.aux.push_back(*st.aux_loss);
  }
  for (size_t u = 0; u < t.units().size(); ++u) out.params.push_back(t.strategy().gather_unit_params(u));
  return out;
}

// A Trainer on this rank over the test's device and transport (cfg.comm set to it), with its
// backend, pool and communicator kept alive beside it.
struct RankTrainer {
  explicit RankTrainer(TrainConfig cfg, std::shared_ptr<const TokenStream> tokens = nullptr)
      : be(test::test_backend()), pool(*be), comm(test::test_communicator(pool)),
        trainer(*be, pool, *comm, on_test_comm(std::move(cfg)), std::move(tokens)) {}
  static TrainConfig on_test_comm(TrainConfig c) {
    c.comm = test::test_comm();
    return c;
  }
  std::unique_ptr<Backend> be;
  Pool pool;
  std::unique_ptr<Communicator> comm;
  Trainer trainer;
};

// Single-rank training on this process (every rank computes the same reference), on the test's
// device.
inline RunOut reference(const TrainConfig& cfg) {
  auto be = test::test_backend();
  Pool pool(*be);
  auto comm = make_sim_communicator(0, 1, pool);
  TrainConfig c = cfg;
  c.use_strategy(StrategyKind::ddp);  // without what only ZeRO takes (shard groups, offload)
  return train(*comm, pool, c);
}

// N ranks over the test's transport (mpi unless $SHARDLAB_TEST_COMM says otherwise).
inline RunOut train_mpi(const TrainConfig& cfg, uint64_t budget = 0) {
  auto be = test::test_backend();
  Pool pool(*be, PoolConfig{budget});
  auto comm = test::test_communicator(pool);
  TrainConfig c = cfg;
  c.comm = test::test_comm();
  return train(*comm, pool, c);
}

// Losses: relative difference <= 1e-5 per step. Parameters: |difference| <= 2e-5 (10 AdamW steps
// of lr 1e-3 on f32 values whose gradients were summed in a different order).
// Local only (no collective): CHECK, never REQUIRE, so a failing rank stays in step with the others.
inline void check_parity(const RunOut& got, const RunOut& want, const std::string& what) {
  CHECK(got.losses.size() == want.losses.size());
  CHECK(got.params.size() == want.params.size());
  double worst_loss = 0, worst_param = 0;
  for (size_t i = 0; i < got.losses.size() && i < want.losses.size(); ++i)
    worst_loss = std::max(worst_loss, double(std::fabs(got.losses[i] - want.losses[i]) / std::fabs(want.losses[i])));
  CHECK(got.aux.size() == want.aux.size());
  for (size_t i = 0; i < got.aux.size() && i < want.aux.size(); ++i)
    worst_loss = std::max(worst_loss, double(std::fabs(got.aux[i] - want.aux[i]) / std::fabs(want.aux[i])));
  for (size_t u = 0; u < got.params.size() && u < want.params.size(); ++u)
    for (size_t i = 0; i < got.params[u].size() && i < want.params[u].size(); ++i)
      worst_param = std::max(worst_param, double(std::fabs(got.params[u][i] - want.params[u][i])));
  if (g_mpi->rank() == 0)
    std::printf("parity %-22s world %d: max loss rel diff %.2e, max param abs diff %.2e\n", what.c_str(),
                g_mpi->world(), worst_loss, worst_param);
  CHECK(worst_loss <= 1e-5);
  CHECK(worst_param <= 2e-5);
}
// Measured (MPI, both tiers) = predicted (meta + sim) for one configuration: model states, peaks,
// composition and phase at the peak, and the step allocation by allocation, on both tiers.
inline void check_measured_is_predicted(const TrainConfig& base, const std::string& what) {
  const int N = g_mpi->world();
  TrainConfig cfg = base;
  cfg.record_step = true;
  cfg.comm = test::test_comm();  // the prediction holds what this transport holds
  auto be = test::test_backend();
  cfg.device = be->device();  // predicted as that device computes ($SHARDLAB_TEST_DEVICE)
  Pool pool(*be);
  auto comm = test::test_communicator(pool);
  Trainer t(*be, pool, *comm, cfg);
  t.step(0);
  t.step(1);
  Estimate m = t.measured_step();
  Estimate e = predict_step(cfg, N, g_mpi->rank(), cfg.batch / cfg.layout.dims.resolved(N).dp() / cfg.accum);
  INFO(what << " world " << N << " rank " << g_mpi->rank() << ": device peak predicted " << e.peak << " measured "
            << m.peak << ", host peak predicted " << e.host.peak << " measured " << m.host.peak);
  CHECK(m.model_states == e.model_states);
  CHECK(m.peak == e.peak);
  CHECK(m.peak_by_category == e.peak_by_category);
  CHECK(m.at_peak == e.at_peak);
  CHECK(m.peak_phase == e.peak_phase);
  CHECK(m.host == e.host);
  bool same = m.timeline.size() == e.timeline.size();
  for (size_t i = 0; same && i < m.timeline.size(); ++i)
    same = m.timeline[i].live == e.timeline[i].live && m.timeline[i].host_live == e.timeline[i].host_live &&
           m.timeline[i].phase == e.timeline[i].phase;
  CHECK(same);
}


// This rank's run under any layout: losses, and its units' parameters (gathered over the
// data-parallel group) with their layouts (the stage's units, the tensor-parallel part, tied copies).
struct PartsRun {
  std::vector<float> losses;
  std::vector<float> aux;  // a mixture of experts' auxiliary loss, each step
  std::vector<std::vector<float>> params;
  std::vector<UnitLayout> layouts;
  int tp = 1, tp_rank = 0;
  bool head_apart = false;  // the rank holds the head but not the embedding (a tied head's copy)
};

inline PartsRun train_parts(const TrainConfig& cfg) {
  auto be = test::test_backend();
  Pool pool(*be);
  auto comm = test::test_communicator(pool);
  TrainConfig c = cfg;
  c.comm = test::test_comm();
  Trainer t(*be, pool, *comm, c);
  PartsRun out;
  for (int64_t s = 0; s < c.steps; ++s) {
    const StepStats st = t.step(s);
    out.losses.push_back(st.loss);
    if (st.aux_loss) out.aux.push_back(*st.aux_loss);
  }
  for (size_t u = 0; u < t.units().size(); ++u) {
    out.params.push_back(t.strategy().gather_unit_params(u));
    out.layouts.push_back(t.units()[u]->layout());
  }
  out.tp = t.mesh().size(CommAxis::tp);
  out.tp_rank = t.mesh().rank(CommAxis::tp);
  const std::vector<UnitLayout> whole = family_of(c.spec).layout(c.spec);
  const auto holds = [&](const std::string& name) {
    return std::any_of(out.layouts.begin(), out.layouts.end(), [&](const UnitLayout& l) { return l.name == name; });
  };
  out.head_apart = holds(whole.back().name) && !holds(whole.front().name);
  return out;
}

struct PartsWorst {
  double loss = 0, param = 0;
  size_t compared = 0, tied = 0;  // parameters compared, of them in tied copies
};

// Every element this rank holds against the whole model's: units matched by name, a tied copy
// against its owner's tensor (wherever that unit is), tensor-parallel parts through tp_runs.
inline PartsWorst compare_parts(const PartsRun& got, const RunOut& want, const ModelSpec& spec) {
  const std::vector<UnitLayout> whole = family_of(spec).layout(spec);
  auto find_unit = [&](const std::string& name) {
    for (size_t w = 0; w < whole.size(); ++w)
      if (whole[w].name == name) return w;
    FAIL("unit " << name << " is not in the model");
    return size_t{0};
  };
  auto find_owner = [&](const std::string& tensor) -> std::pair<size_t, const TensorDecl*> {
    for (size_t w = 0; w < whole.size(); ++w)
      for (const TensorDecl& t : whole[w].tensors)
        if (t.name == tensor) return {w, &t};
    FAIL("tied tensor " << tensor << " has no owner in the model");
    return {0, nullptr};
  };
  PartsWorst worst;
  for (size_t i = 0; i < got.losses.size() && i < want.losses.size(); ++i)
    worst.loss = std::max(worst.loss, std::fabs(double(got.losses[i]) - want.losses[i]) / std::fabs(want.losses[i]));
  for (size_t u = 0; u < got.layouts.size(); ++u) {
    const size_t w = find_unit(got.layouts[u].name);
    for (const TensorDecl& t : got.layouts[u].tensors) {
      const auto [owner, full] = t.tied_copy ? find_owner(t.name) : std::pair{w, &whole[w].find(t.name)};
      for (const TpRun& run : tp_runs(t, got.tp, got.tp_rank)) {
        if (run.full < 0) continue;  // vocabulary padding
        for (int64_t i = 0; i < run.len; ++i) {
          const double v = got.params[u][static_cast<size_t>(t.offset + run.local + i)];
          const double r = want.params[owner][static_cast<size_t>(full->offset + run.full + i)];
          worst.param = std::max(worst.param, std::fabs(v - r));
        }
        worst.compared += static_cast<size_t>(run.len);
        if (t.tied_copy) worst.tied += static_cast<size_t>(run.len);
      }
    }
  }
  return worst;
}

}  // namespace shardlab::strategy_test
