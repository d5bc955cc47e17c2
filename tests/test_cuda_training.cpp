// GPT-2 training on CUDA against the same run on the CPU backend (the reference), and the CUDA
// pool's ledger against the prediction (meta backend + sim), to the byte.
#include <catch2/catch.hpp>
#include <cmath>

#include "src/comm/sim_comm.hpp"
#include "src/model/hf_dir.hpp"
#include "src/train/predict.hpp"
#include "src/train/trainer.hpp"

using namespace shardlab;

namespace {

// Odd shapes on purpose: V not a multiple of 32, T not a multiple of 32, head size 16.
TrainConfig small_config(DType param_dtype, StrategyKind strategy = StrategyKind::ddp) {
  TrainConfig cfg;
  cfg.spec = model_preset("tiny");
  cfg.spec.layers = 2, cfg.spec.dim = 64, cfg.spec.heads = 4, cfg.spec.seq = 47, cfg.spec.vocab = 203;
  cfg.spec.name = "tiny+custom";
  cfg.strategy.kind = strategy;
  cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = param_dtype;
  cfg.steps = 10;
  cfg.batch = 4;
  cfg.schedule.lr = 1e-3f;
  cfg.schedule.warmup_steps = 2;
  cfg.seed = 77;
  cfg.comm = CommKind::staged;  // what a GPU transport holds: nothing in the rank's pool
  return cfg;
}

std::vector<float> losses_on(Backend& be, const TrainConfig& cfg) {
  Pool pool(be);
  auto comm = make_sim_communicator(0, 1, pool, sim_transport(cfg.comm));
  Trainer t(be, pool, *comm, cfg);
  std::vector<float> out;
  for (int64_t s = 0; s < cfg.steps; ++s) out.push_back(t.step(s).loss);
  return out;
}

}  // namespace

TEST_CASE("GPT-2: 10 AdamW steps on CUDA give the CPU's losses (f32 1e-4, bf16 parameters 2e-2)", "[cuda]") {
  auto gpu = make_cuda_backend(BackendConfig{});
  auto cpu = make_cpu_backend(BackendConfig{1});
  for (DType dt : {DType::f32, DType::bf16}) {
    const TrainConfig cfg = small_config(dt);
    const std::vector<float> want = losses_on(*cpu, cfg), got = losses_on(*gpu, cfg);
    REQUIRE(got.size() == want.size());
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - want[i]) / want[i]));
    INFO(dtype_name(dt) << ": first losses cpu " << want.front() << " cuda " << got.front() << ", last cpu "
                        << want.back() << " cuda " << got.back() << ", worst relative difference " << worst);
    CHECK(worst <= (dt == DType::f32 ? 1e-4 : 2e-2));
    CHECK(want.back() < want.front());  // it trains
  }
}

// The mixture of experts on the device: routing decided on the host from the device's logits, the
// row moves and the per-head norms (Qwen3) as CUDA kernels, the experts' GEMMs through cuBLAS. The
// transformers-written models: their routers (N(0, 1)) keep every top-k choice clear of ties that
// the device's rounding could flip.
TEST_CASE("MoE: 10 AdamW steps of Qwen3-MoE and Mixtral on CUDA give the CPU's losses", "[cuda][moe]") {
  auto gpu = make_cuda_backend(BackendConfig{});
  auto cpu = make_cpu_backend(BackendConfig{1});
  for (const char* dir : {"hf_qwen3_moe_tiny", "hf_mixtral_tiny"}) {
    const std::string preset = std::string(SHARDLAB_SOURCE_DIR) + "/tests/reference/" + dir;
    TrainConfig cfg = small_config(DType::f32);
    cfg.spec = read_hf_config(preset);
    cfg.init = preset;
    const std::vector<float> want = losses_on(*cpu, cfg), got = losses_on(*gpu, cfg);
    REQUIRE(got.size() == want.size());
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - want[i]) / want[i]));
    INFO(preset << ": worst relative difference " << worst);
    CHECK(worst <= 1e-4);
  }
}

TEST_CASE("the CUDA pool's ledger equals the prediction, every category, to the byte", "[cuda]") {
  auto gpu = make_cuda_backend(BackendConfig{});
  for (StrategyKind s : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3})
    for (DType dt : {DType::f32, DType::bf16}) {
      TrainConfig cfg = small_config(dt, s);
      cfg.steps = 2;
      cfg.record_step = true;
      cfg.device = Device::cuda;  // predicted as the GPU computes: operands rounded once where two products read them
      Pool pool(*gpu);
      auto comm = make_sim_communicator(0, 1, pool, sim_transport(cfg.comm));
      Trainer t(*gpu, pool, *comm, cfg);
      t.step(0);
      t.step(1);
      const Estimate m = t.measured_step();
      const Estimate e = predict_step(cfg, 1, 0, cfg.batch);
      INFO(strategy_name(s) << " " << dtype_name(dt) << ": peak predicted " << e.peak << " measured " << m.peak);
      CHECK(m.model_states == e.model_states);
      CHECK(m.peak == e.peak);
      CHECK(m.peak_by_category == e.peak_by_category);
      CHECK(m.at_peak == e.at_peak);
      CHECK(m.timeline.size() == e.timeline.size());
    }
}

TEST_CASE("the CUDA backend reports its memory and the pool's share of it", "[cuda]") {
  auto gpu = make_cuda_backend(BackendConfig{});
  const Backend::DeviceMemory before = gpu->device_memory();
  REQUIRE(before.total > 0);
  CHECK(before.free <= before.total);
  Pool pool(*gpu);
  {
    Block b = pool.alloc(DType::f32, int64_t{64} << 20, Category::workspace, "256 MiB");
    const Backend::DeviceMemory during = gpu->device_memory();
    CHECK(during.reserved >= (uint64_t{256} << 20));  // the block came from the backend's own pool
  }
}
