// The Llama family under every strategy on real ranks (mpirun -np 1..4), as GPT-2 is tested in
// test_strategies*.cpp and test_hybrid.cpp: parity with single-rank training for dp, ddp, zero1-3
// and hybrid sharding, in f32 and with bf16 parameters and gradients, with activation
// checkpointing (bit for bit) and offload; and the memory prediction (meta backend, sim) equal to
// what the MPI run's ledger measures, allocation by allocation, on both tiers.
#include <catch2/catch.hpp>
#include <cmath>

#include "tests/strategy_test_util.hpp"

using namespace shardlab;
using namespace shardlab::strategy_test;

namespace {

// The tiny Llama: grouped-query heads (H/KV = 2), an untied head, rotary positions.
TrainConfig llama_config(StrategyKind s, int world) {
  TrainConfig cfg = parity_config(s, world);
  cfg.spec = model_preset("llama-tiny");
  return cfg;
}

}  // namespace

TEST_CASE("Llama: every strategy and hybrid sharding match single-rank training", "[llama][strategies]") {
  const int N = g_mpi->world();
  for (StrategyKind s : all_strategies()) {
    TrainConfig cfg = llama_config(s, N);
    check_parity(train_mpi(cfg), reference(cfg), std::string("llama ") + strategy_name(s));
  }
  for (int S = 1; S < N; ++S) {
    if (N % S != 0) continue;
    TrainConfig cfg = llama_config(StrategyKind::zero3, N);
    cfg.layout.dims.dp_shard = S;
    check_parity(train_mpi(cfg), reference(cfg), fmt::format("llama zero3 S={}", S));
  }
}

TEST_CASE("Llama: bf16 parameters and gradients train as f32 does, and memory is predicted to the byte",
          "[llama][strategies][bf16][estimator]") {
  const int N = g_mpi->world();
  RunOut ref = reference(llama_config(StrategyKind::ddp, N));  // f32, one rank
  for (StrategyKind s : all_strategies()) {
    TrainConfig cfg = llama_config(s, N);
    cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = DType::bf16;
    RunOut got = train_mpi(cfg);
    double worst = 0;
    for (size_t k = 0; k < got.losses.size() && k < ref.losses.size(); ++k)
      worst = std::max(worst, std::fabs(double(got.losses[k]) - ref.losses[k]) / ref.losses[k]);
    INFO("llama bf16 " << strategy_name(s) << " world " << N << ": losses within " << worst << " of f32");
    CHECK(got.losses.size() == ref.losses.size());
    CHECK(worst < 1e-3);  // bf16 storage rounds parameters and gradients; 10 steps stay this close
    for (DType dt : {DType::f32, DType::bf16}) {
      TrainConfig m = llama_config(s, N);
      m.batch = 4 * N;
      m.accum = 2;
      m.steps = 2;
      m.strategy.precision.param_dtype = m.strategy.precision.reduce_dtype = dt;
      check_measured_is_predicted(m, fmt::format("llama {} {}", strategy_name(s), dtype_name(dt)));
    }
  }
}

TEST_CASE("Llama: activation checkpointing gives the same training bit for bit, with its memory predicted",
          "[llama][strategies][checkpointing]") {
  const int N = g_mpi->world();
  for (StrategyKind s : {StrategyKind::ddp, StrategyKind::zero3}) {
    TrainConfig cfg = llama_config(s, N);
    cfg.steps = 3;
    cfg.batch = 2 * N;
    RunOut plain = train_mpi(cfg);
    for (Checkpointing c : {Checkpointing::attention, Checkpointing::blocks}) {
      TrainConfig ck = cfg;
      ck.checkpointing = c;
      INFO("llama " << strategy_name(s) << " " << checkpointing_name(c) << " world " << N);
      RunOut got = train_mpi(ck);
      CHECK(got.losses == plain.losses);
      CHECK(got.params == plain.params);
      check_measured_is_predicted(ck, fmt::format("llama {} {}", strategy_name(s), checkpointing_name(c)));
    }
  }
}

TEST_CASE("Llama: offload gives the same training, both memory tiers predicted to the byte",
          "[llama][strategies][offload]") {
  const int N = g_mpi->world();
  for (Offload o : {Offload::optimizer, Offload::params}) {
    TrainConfig cfg = llama_config(StrategyKind::zero3, N);
    cfg.steps = 3;
    cfg.batch = 2 * N;
    TrainConfig off = cfg;
    off.strategy.offload = o;
    INFO("llama zero3 offload " << offload_name(o) << " world " << N);
    RunOut plain = train_mpi(cfg);
    RunOut got = train_mpi(off);
    double worst = 0;  // the loss is summed on the other tier in another order; parameters are not
    for (size_t i = 0; i < got.losses.size() && i < plain.losses.size(); ++i)
      worst = std::max(worst, double(std::fabs(got.losses[i] - plain.losses[i]) / std::fabs(plain.losses[i])));
    CHECK(got.losses.size() == plain.losses.size());
    CHECK(worst <= 1e-6);
    CHECK(got.params == plain.params);
    check_measured_is_predicted(off, fmt::format("llama zero3 offload {}", offload_name(o)));
  }
}
