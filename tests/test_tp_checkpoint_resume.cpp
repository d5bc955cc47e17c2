// Checkpoints of tensor-parallel runs through the Trainer (mpirun -np 4): a run at tp 2 x zero3 dp 2
// checkpoints at step 5 and 10; step 5 resumed at tp 1 x dp 4 and at tp 4 x dp 1 (and under DDP at
// tp 2 x dp 2) continues the run, each loss within 1e-5 relative of the uninterrupted run's; the
// run's --save (its tensor-parallel parts gathered) holds the same tensors as the export of its
// step-10 checkpoint.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "src/model/safetensors.hpp"
#include "src/checkpoint/checkpoint.hpp"
#include "tests/strategy_test_util.hpp"

using namespace shardlab;
using namespace shardlab::strategy_test;
namespace fs = std::filesystem;

namespace {

struct Layout {
  int tp;
  StrategyKind kind;
};

// Shapes tp 1, 2 and 4 divide; a vocabulary neither 2 nor 4 divides (padded).
ModelSpec gpt2_spec() {
  ModelSpec s = model_preset("tiny");
  s.heads = 4;
  s.vocab = 255;
  s.name = "tiny-tp";
  return s;
}
ModelSpec llama_spec() {
  ModelSpec s = model_preset("llama-tiny");
  s.kv_heads = 4;
  s.vocab = 255;
  s.name = "llama-tiny-tp";
  return s;
}

TrainConfig config(const ModelSpec& spec, Layout l) {
  TrainConfig cfg = parity_config(l.kind, g_mpi->world());
  cfg.spec = spec;
  cfg.batch = 4;
  cfg.layout.dims.tp = l.tp;
  return cfg;
}

std::string label(const ModelSpec& spec, Layout l) {
  return fmt::format("{} tp {} x {} dp {}", spec.name, l.tp, strategy_name(l.kind), g_mpi->world() / l.tp);
}

// A directory every rank sees, emptied by rank 0 before anyone uses it.
fs::path fresh_dir(Communicator& comm, const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("shardlab_test_tp_resume_{}", name);
  if (comm.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  comm.barrier().wait();
  return dir;
}

// Runs `written` for 10 steps with checkpoints at 5 and 10 and a final --save; resumes step 5
// under each of `resumed` and compares steps 5..9 with the uninterrupted run.
void check_resume(const ModelSpec& spec, Layout written, const std::vector<Layout>& resumed) {
  auto be = test::test_backend();
  Pool pool(*be);
  auto comm = test::test_communicator(pool);
  const fs::path dir = fresh_dir(*comm, spec.name);
  TrainConfig cfg = config(spec, written);
  cfg.comm = test::test_comm();
  cfg.save_dir = (dir / "ckpt").string();
  cfg.save_every = 5;
  cfg.save_path = (dir / "final.safetensors").string();
  cfg.record_step = true;  // keeps the steps' stats (history)
  std::vector<float> full;
  {
    std::FILE* devnull = std::fopen("/dev/null", "w");
    Trainer t(*be, pool, *comm, cfg);
    t.run(devnull);
    std::fclose(devnull);
    for (const StepStats& s : t.history()) full.push_back(s.loss);
  }
  REQUIRE(full.size() == 10);
  for (const Layout& l : resumed) {
    TrainConfig r = config(spec, l);
    r.comm = test::test_comm();
    r.resume = (dir / "ckpt" / "step_00000005").string();
    Trainer t(*be, pool, *comm, r);
    REQUIRE(t.start_step() == 5);
    double worst = 0;
    for (int64_t s = 5; s < 10; ++s)
      worst = std::max(worst, std::fabs(double(t.step(s).loss) - full[static_cast<size_t>(s)]) / full[static_cast<size_t>(s)]);
    if (comm->rank() == 0)
      std::printf("resume %s from %s: max loss rel diff %.2e\n", label(spec, l).c_str(), label(spec, written).c_str(),
                  worst);
    INFO(label(spec, l) << " resumed from " << label(spec, written));
    CHECK(worst <= 1e-5);
  }
  if (comm->rank() == 0) {  // --save of the parts, gathered, against the export of the same step
    const std::string exported = (dir / "exported.safetensors").string();
    export_checkpoint((dir / "ckpt" / "step_00000010").string(), exported);
    SafetensorsReader a(cfg.save_path), b(exported);
    REQUIRE(a.entries().size() == b.entries().size());
    for (const auto& [name, e] : a.entries()) {
      INFO(name);
      REQUIRE(b.has(name));
      std::vector<float> x(static_cast<size_t>(e.numel())), y(x.size());
      a.read_f32(name, x, &e.shape);
      b.read_f32(name, y, &e.shape);
      CHECK(x == y);
    }
  }
  comm->barrier().wait();
  if (comm->rank() == 0) fs::remove_all(dir);
}

}  // namespace

TEST_CASE("a checkpoint of tp 2 x dp 2 resumes at tp 1 x dp 4 and tp 4 x dp 1", "[tp][tp-ckpt]") {
  if (g_mpi->world() != 4) return;
  const std::vector<Layout> resumed{{1, StrategyKind::zero3}, {4, StrategyKind::zero3}, {2, StrategyKind::ddp}};
  check_resume(gpt2_spec(), {2, StrategyKind::zero3}, resumed);
  check_resume(llama_spec(), {2, StrategyKind::zero3}, resumed);
}

TEST_CASE("a checkpoint of tp 1 x dp 4 resumes at tp 2 x dp 2 and tp 4 x dp 1", "[tp][tp-ckpt]") {
  if (g_mpi->world() != 4) return;
  check_resume(gpt2_spec(), {1, StrategyKind::zero3}, {{2, StrategyKind::zero3}, {4, StrategyKind::ddp}});
}
