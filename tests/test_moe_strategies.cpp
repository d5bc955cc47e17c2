// Mixture-of-experts models under every strategy on real ranks (mpirun -np 1..4): parity with
// single-rank training (cross-entropy, the auxiliary loss and the parameters), dropless and past
// capacity, with activation checkpointing (bit for bit), and the memory prediction equal to what
// the run's ledger measures. The auxiliary loss's statistics are the global batch's: a rank
// balancing its own tokens alone would train another model, and these comparisons would fail.
#include <catch2/catch.hpp>

#include "tests/strategy_test_util.hpp"

using namespace shardlab;
using namespace shardlab::strategy_test;

namespace {

TrainConfig moe_config(const char* preset, StrategyKind s, int world) {
  TrainConfig cfg = parity_config(s, world);
  cfg.spec = model_preset(preset);
  cfg.spec.moe.aux_coef = 0.05;  // large enough to move the routers within the run
  return cfg;
}

}  // namespace

TEST_CASE("MoE: every strategy matches single-rank training, dropless and past capacity", "[moe][strategies]") {
  const int N = g_mpi->world();
  for (StrategyKind s : all_strategies()) {
    TrainConfig cfg = moe_config("qwen3-moe-tiny", s, N);
    check_parity(train_mpi(cfg), reference(cfg), std::string("qwen3-moe ") + strategy_name(s));
  }
  // Capacity drops are decided per micro-batch: the reference takes the ranks' micro-batches as its
  // micro-steps (--accum N). Its auxiliary loss would then be each micro-step's own (the ranks
  // balance one batch together), so this one trains without it.
  TrainConfig cfg = moe_config("mixtral-tiny", StrategyKind::zero3, N);
  cfg.spec.moe_capacity_factor = 1.0;
  cfg.spec.moe.aux_coef = 0;
  TrainConfig ref = cfg;
  ref.accum = N;
  RunOut got = train_mpi(cfg), want = reference(ref);
  got.aux.clear(), want.aux.clear();  // per micro-step there, per batch here
  check_parity(got, want, "mixtral zero3 F=1");
}

TEST_CASE("MoE: checkpointing gives the same training bit for bit; memory is predicted to the byte",
          "[moe][strategies][checkpointing][estimator]") {
  const int N = g_mpi->world();
  for (StrategyKind s : {StrategyKind::ddp, StrategyKind::zero3}) {
    TrainConfig cfg = moe_config("qwen3-moe-tiny", s, N);
    cfg.steps = 3;
    cfg.batch = 2 * N;
    RunOut plain = train_mpi(cfg);
    TrainConfig ck = cfg;
    ck.checkpointing = Checkpointing::blocks;
    INFO("qwen3-moe " << strategy_name(s) << " blocks, world " << N);
    RunOut got = train_mpi(ck);
    CHECK(got.losses == plain.losses);
    CHECK(got.aux == plain.aux);
    CHECK(got.params == plain.params);
    check_measured_is_predicted(cfg, fmt::format("qwen3-moe {}", strategy_name(s)));
    check_measured_is_predicted(ck, fmt::format("qwen3-moe {} blocks", strategy_name(s)));
  }
}
