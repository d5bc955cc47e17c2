// Tensor parallelism composed with the data-parallel strategies, on real ranks (mpirun -np 2 and
// 4), for GPT-2 and Llama: parity with single-rank training over 10 steps (losses within 1e-5
// relative; every element of every rank's part of the parameters against the whole model's), with
// and without sequence parallelism, the chunked loss head, and bf16 parameters and gradients against
// f32; memory measured = predicted at tp 2 x dp 2; and the bad inputs.
#include <catch2/catch.hpp>
#include <cmath>

#include "src/model/tp.hpp"
#include "tests/strategy_test_util.hpp"

using namespace shardlab;
using namespace shardlab::strategy_test;

namespace {

struct Layout {
  int tp;
  StrategyKind kind;
};

// The layouts the issue lists, those that fit the world: tp = world (dp 1), and tp 2 x dp 2.
std::vector<Layout> layouts(int world) {
  std::vector<Layout> out;
  if (world == 2) out = {{2, StrategyKind::ddp}, {2, StrategyKind::zero3}};
  if (world == 4) out = {{4, StrategyKind::zero3}, {2, StrategyKind::zero3}, {2, StrategyKind::zero1},
                         {2, StrategyKind::ddp}};
  return out;
}

ModelSpec gpt2_spec() {
  ModelSpec s = model_preset("tiny");
  s.heads = 4;      // so that tp 4 divides them
  s.vocab = 255;    // divided by neither 2 nor 4: padded
  s.name = "tiny-tp";
  return s;
}

ModelSpec llama_spec() {
  ModelSpec s = model_preset("llama-tiny");
  s.kv_heads = 4;   // so that tp 4 divides them
  s.vocab = 255;
  s.name = "llama-tiny-tp";
  return s;
}

TrainConfig tp_config(const ModelSpec& spec, Layout l, bool sp) {
  TrainConfig cfg = parity_config(l.kind, g_mpi->world());
  cfg.spec = spec;
  cfg.batch = 4;
  cfg.layout.dims.tp = l.tp;
  cfg.layout.sequence_parallel = sp;
  return cfg;
}

// The same run on one rank holding the whole model: the parity reference.
TrainConfig whole_model(TrainConfig c) {
  c.layout.dims = ParallelDims{};
  c.layout.sequence_parallel = false;
  return c;
}

std::string label(const TrainConfig& c) {
  return fmt::format("{} tp {} {}{} {}{}{}", c.spec.name, c.layout.dims.tp, strategy_name(c.strategy.kind),
                     c.layout.sequence_parallel ? " sp" : "", dtype_name(c.strategy.precision.param_dtype),
                     c.strategy.offload != Offload::none ? std::string(" off:") + offload_name(c.strategy.offload) : "",
                     c.spec.loss_chunk ? fmt::format(" chunk {}", c.spec.loss_chunk) : "");
}

// Losses as check_parity has them; the parameters of this rank's part against the whole model's
// at the places tp_runs gives (padding: zero).
void check_tp_parity(const RunOut& got, const RunOut& want, const TrainConfig& cfg, double param_tol = 2e-5) {
  const int T = cfg.layout.dims.tp, r = g_mpi->rank() % T;  // tp innermost
  const std::vector<UnitLayout> part = family_of(cfg.spec).layout(cfg.spec, TpConfig{T, r});
  const std::vector<UnitLayout> whole = family_of(cfg.spec).layout(cfg.spec);
  double worst_loss = 0, worst_param = 0, padding = 0;
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i)
    worst_loss = std::max(worst_loss, double(std::fabs(got.losses[i] - want.losses[i]) / std::fabs(want.losses[i])));
  REQUIRE(got.params.size() == part.size());
  for (size_t u = 0; u < part.size(); ++u)
    for (const TensorDecl& t : part[u].tensors) {
      const TensorDecl& full = whole[u].find(t.name);
      for (const TpRun& run : tp_runs(t, T, r))
        for (int64_t i = 0; i < run.len; ++i) {
          const double v = got.params[u][static_cast<size_t>(t.offset + run.local + i)];
          if (run.full < 0)
            padding = std::max(padding, std::fabs(v));
          else
            worst_param = std::max(worst_param, std::fabs(v - want.params[u][static_cast<size_t>(full.offset + run.full + i)]));
        }
    }
  if (g_mpi->rank() == 0)
    std::printf("parity %-34s world %d: max loss rel diff %.2e, max param abs diff %.2e\n", label(cfg).c_str(),
                g_mpi->world(), worst_loss, worst_param);
  INFO(label(cfg));
  CHECK(worst_loss <= 1e-5);
  CHECK(worst_param <= param_tol);
  CHECK(padding == 0);
}

void check_family(const ModelSpec& spec) {
  for (const Layout& l : layouts(g_mpi->world()))
    for (bool sp : {false, true}) {
      TrainConfig cfg = tp_config(spec, l, sp);
      check_tp_parity(train_mpi(cfg), reference(whole_model(cfg)), cfg);
    }
}

}  // namespace

TEST_CASE("GPT-2: tensor parallelism with every data-parallel layout matches single-rank training", "[tp][gpt2]") {
  check_family(gpt2_spec());
}

TEST_CASE("Llama: tensor parallelism with every data-parallel layout matches single-rank training", "[tp][llama]") {
  check_family(llama_spec());
}

// A mixture of experts under --tp: attention split as Llama's, each expert split as the dense MLP
// (every rank routes all rows, with SP gathered first, through its slices of the experts; the
// routing weights' gradients summed over the group, the partial outputs reduced). Top-k
// routing is discontinuous: the tensor-parallel sums round differently from one rank's, which
// flips a near tie of HF's 0.02-scale routers; the transformers-written models (routers N(0, 1),
// tests/reference/make_hf_moe_dirs.py) keep every choice clear.
TEST_CASE("MoE: tensor parallelism on attention matches single-rank training", "[tp][moe]") {
  const std::string ref = std::string(SHARDLAB_SOURCE_DIR) + "/tests/reference/";
  for (const char* dir : {"hf_qwen3_moe_tiny", "hf_mixtral_tiny"})
    for (const Layout& l : layouts(g_mpi->world())) {
      if (l.tp != 2) continue;  // their 2 K/V heads
      for (bool sp : {false, true}) {
        TrainConfig cfg = tp_config(read_hf_config(ref + dir), l, sp);
        cfg.init = ref + dir;
        // Qwen3's layer 1 expert 3 ends 6.1e-5 off in a few elements of its gate_proj (the losses within
        // 1.5e-7): the experts' inputs differ in the last bits (the group's attention sums), which the
        // discrete routing and Adam's normalisation amplify; 1e-4 still tells a wrong gradient.
        check_tp_parity(train_mpi(cfg), reference(whole_model(cfg)), cfg, 1e-4);
      }
    }
}

TEST_CASE("tensor parallelism with offload and recomputation matches single-rank training", "[tp][offload]") {
  for (const ModelSpec& spec : {gpt2_spec(), llama_spec()}) {
    TrainConfig cfg = tp_config(spec, Layout{2, StrategyKind::zero3}, true);
    cfg.strategy.offload = Offload::params;
    cfg.checkpointing = Checkpointing::attention;
    check_tp_parity(train_mpi(cfg), reference(whole_model(cfg)), cfg);
    cfg = tp_config(spec, Layout{2, StrategyKind::zero2}, false);
    cfg.strategy.offload = Offload::optimizer;
    cfg.checkpointing = Checkpointing::blocks;
    check_tp_parity(train_mpi(cfg), reference(whole_model(cfg)), cfg);
  }
}

// bf16 parameters and gradients: against single-rank training in bf16 (the same roundings of the
// same sums up to their order), and within 1e-3 of f32 training.
TEST_CASE("tensor parallelism: bf16 parameters and gradients train as on one rank, with checkpointing",
          "[tp][bf16]") {
  const int N = g_mpi->world();
  for (const ModelSpec& spec : {gpt2_spec(), llama_spec()})
    for (bool sp : {false, true}) {
      TrainConfig cfg = tp_config(spec, Layout{2, StrategyKind::zero3}, sp);
      cfg.checkpointing = Checkpointing::blocks;
      RunOut f32 = reference(whole_model(cfg));
      cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = DType::bf16;
      RunOut got = train_mpi(cfg), ref = reference(whole_model(cfg));
      double worst = 0, worst_f32 = 0;
      for (size_t k = 0; k < got.losses.size() && k < ref.losses.size(); ++k) {
        worst = std::max(worst, std::fabs(double(got.losses[k]) - ref.losses[k]) / ref.losses[k]);
        worst_f32 = std::max(worst_f32, std::fabs(double(got.losses[k]) - f32.losses[k]) / f32.losses[k]);
      }
      if (g_mpi->rank() == 0)
        std::printf("bf16 %-34s world %d: losses within %.2e of bf16 on one rank, %.2e of f32\n", label(cfg).c_str(),
                    N, worst, worst_f32);
      INFO(label(cfg) << " world " << N << ": losses within " << worst << " of one rank's bf16, " << worst_f32
                      << " of f32");
      CHECK(got.losses.size() == ref.losses.size());
      // With data-parallel ranks too (N = 4) the gradients are also reduced in bf16 across them, in
      // another order than one rank's sum: measured 8.3e-6 on AVX-512, bounded at 3e-5.
      CHECK(worst <= (N == 2 ? 1e-5 : 3e-5));
      CHECK(worst_f32 < 1e-3);
    }
}

// The chunked loss head (--loss-chunk) under tensor parallelism: each chunk's vocabulary-parallel
// cross-entropy (the rank's vocabulary rows, maxima and sums reduced over the group), against
// single-rank training with the whole logits; 5 positions a chunk divides none of the batches.
TEST_CASE("tensor parallelism with the chunked loss head matches single-rank training", "[tp][loss]") {
  for (const ModelSpec& base : {gpt2_spec(), llama_spec()})
    for (bool sp : {false, true}) {
      ModelSpec spec = base;
      spec.loss_chunk = 5;
      TrainConfig cfg = tp_config(spec, Layout{2, StrategyKind::zero3}, sp);
      TrainConfig whole = whole_model(cfg);
      whole.spec.loss_chunk = 0;
      check_tp_parity(train_mpi(cfg), reference(whole), cfg);
    }
}

TEST_CASE("tensor parallelism: memory measured equals predicted at tp 2 x dp 2", "[tp][estimator]") {
  if (g_mpi->world() != 4) return;
  ModelSpec moe = model_preset("qwen3-moe-tiny");  // the experts split as the dense MLP
  moe.kv_heads = 4;
  for (const ModelSpec& spec : {gpt2_spec(), llama_spec(), moe})
    for (StrategyKind k : {StrategyKind::zero3, StrategyKind::ddp})
      for (bool sp : {false, true}) {
        TrainConfig cfg = tp_config(spec, Layout{2, k}, sp);
        cfg.steps = 2;
        cfg.accum = 2;
        check_measured_is_predicted(cfg, label(cfg));
      }
  for (bool sp : {false, true}) {  // the chunked loss head's chunk and its reduced statistics
    ModelSpec spec = llama_spec();
    spec.loss_chunk = 5;
    TrainConfig cfg = tp_config(spec, Layout{2, StrategyKind::zero3}, sp);
    cfg.steps = 2;
    check_measured_is_predicted(cfg, label(cfg));
  }
}

TEST_CASE("tensor parallelism: bad layouts are input errors naming the values", "[tp][errors]") {
  auto be = test::test_backend();
  Pool pool(*be);
  auto comm = test::test_communicator(pool);
  const int N = g_mpi->world();
  TrainConfig cfg = tp_config(gpt2_spec(), Layout{N, StrategyKind::zero3}, false);
  cfg.spec.heads = 2;
  cfg.spec.dim = 32;
  if (N == 4) CHECK_THROWS_WITH(Trainer(*be, pool, *comm, cfg), Catch::Contains("--tp 4 must divide the attention heads (2)"));
  cfg = tp_config(gpt2_spec(), Layout{N, StrategyKind::dp}, false);
  CHECK_THROWS_WITH(Trainer(*be, pool, *comm, cfg), Catch::Contains("with --strategy dp"));
  cfg = tp_config(gpt2_spec(), Layout{3, StrategyKind::zero3}, false);
  CHECK_THROWS_WITH(Trainer(*be, pool, *comm, cfg), Catch::Contains("does not divide the world"));
  cfg = tp_config(gpt2_spec(), Layout{1, StrategyKind::zero3}, true);
  CHECK_THROWS_WITH(Trainer(*be, pool, *comm, cfg), Catch::Contains("--sequence-parallel"));
}

// The tensor-parallel axis moves exactly what tp_micro_step_bus_bytes says per micro-step (plus
// the gradient norm's one float per step), for both families, with and without sequence
// parallelism, with and without recomputation; with --activation-dtype bf16 the regions' rows cross
// in bf16 (half the bytes; the loss, the norms' gradients and the routing weights' stay f32).
TEST_CASE("tensor parallelism: bus bytes on the tp axis equal the theory", "[tp][comm]") {
  const int N = g_mpi->world();
  ModelSpec moe = model_preset("qwen3-moe-tiny");  // q/k norms, experts split, routing weights' gradients summed
  moe.kv_heads = 4;
  for (DType act : {DType::f32, DType::bf16})
  for (ModelSpec spec : {gpt2_spec(), llama_spec(), moe})
    for (const Layout& l : layouts(N))
      for (bool sp : {false, true})
        for (Checkpointing ck : {Checkpointing::none, Checkpointing::blocks}) {
          spec.activation_dtype = act;
          TrainConfig cfg = tp_config(spec, l, sp);
          cfg.accum = 2;
          cfg.batch = 2 * 2 * (N / l.tp);
          cfg.checkpointing = ck;
          auto be = test::test_backend();
          Pool pool(*be);
          auto comm = test::test_communicator(pool);
          Trainer t(*be, pool, *comm, cfg);
          t.step(0);
          const double measured = t.mesh().last_step_bytes()[static_cast<int>(CommAxis::tp)];
          const TpConfig tp{l.tp, t.mesh().rank(CommAxis::tp), sp};
          const int64_t micro = cfg.batch / t.mesh().dp_size() / cfg.accum;
          const double theory =
              cfg.accum * tp_micro_step_bus_bytes(family_of(spec).layout(spec, tp), spec, tp, micro, spec.seq, ck) +
              2.0 * (l.tp - 1) / l.tp * sizeof(float);  // the gradient norm's all-reduce
          INFO(label(cfg) << " checkpointing " << checkpointing_name(ck) << " activations " << dtype_name(act)
                          << ": measured " << measured << " theory " << theory);
          CHECK(measured == Approx(theory).epsilon(1e-12));
        }
}
