#include <catch2/catch.hpp>

#include "memory/estimator.hpp"
#include "src/model/gpt2.hpp"

using namespace shardlab;

TEST_CASE("ZeRO's worked example: 7.5B parameters on 64 ranks", "[estimator]") {
  // ZeRO paper, figure 1: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB (K = 12, GB = 1e9 bytes).
  const double psi = 7.5e9;
  CHECK(zero_model_states("ddp", psi, 64) / 1e9 == Approx(120.0));
  CHECK(zero_model_states("zero1", psi, 64) / 1e9 == Approx(31.4).margin(0.05));
  CHECK(zero_model_states("zero2", psi, 64) / 1e9 == Approx(16.6).margin(0.05));
  CHECK(zero_model_states("zero3", psi, 64) / 1e9 == Approx(1.9).margin(0.05));

  // The step replay reproduces the formulas from its own bookkeeping (bf16 params and grads,
  // fp32 master and Adam), for 7.5B parameters in 100 units.
  std::vector<UnitMemDesc> units(100);
  for (size_t i = 0; i < units.size(); ++i) {
    units[i].name = fmt::format("unit {}", i);
    units[i].params = 75'000'000;
  }
  for (std::string s : {"ddp", "zero1", "zero2", "zero3"}) {
    EstimateConfig c;
    c.strategy = s;
    c.world = 64;
    c.param_dtype = c.reduce_dtype = DType::bf16;
    Estimate e = estimate_step(units, c);
    INFO(s);
    CHECK(double(e.model_state_total()) == Approx(zero_model_states(s, psi, 64)).epsilon(1e-9));
  }
}

TEST_CASE("the estimate of gpt2-xl on 64 ranks", "[estimator]") {
  ModelSpec spec = model_preset("gpt2-xl");
  auto units = gpt2_mem_desc(spec, 4, 1024);
  EstimateConfig c;
  c.world = 64;
  c.positions = 4 * 1024;
  c.vocab = spec.vocab;
  c.param_dtype = c.reduce_dtype = DType::bf16;
  c.strategy = "ddp";
  Estimate ddp = estimate_step(units, c);
  c.strategy = "zero3";
  Estimate z3 = estimate_step(units, c);
  // Activations do not shard: the same under both; model states shrink 64 times.
  CHECK(ddp.peak_by_category[static_cast<int>(Category::activations)] ==
        z3.peak_by_category[static_cast<int>(Category::activations)]);
  CHECK(double(ddp.model_state_total()) / z3.model_state_total() == Approx(64.0).epsilon(0.001));
  CHECK(z3.peak < ddp.peak);
  CHECK(ddp.peak_phase.rfind("backward", 0) == 0);
  CHECK_THROWS_AS(zero_model_states("fsdp", 1, 1), InputError);
}
