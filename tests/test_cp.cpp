// Context parallelism (--cp) on real ranks (mpirun -np 2 and 4), both methods (allgather, ring):
// the attention of every rank's pieces against the whole sequence's, computed by the naive kernel
// (forward, and backward with the K/V gradients summed over the group); the causal pairs each rank
// computes; training parity with single-rank training over 10 steps for GPT-2 and Llama, alone and
// with ZeRO-3 data parallelism, tensor and pipeline parallelism; memory measured = predicted; bf16.
#include <catch2/catch.hpp>
#include <cmath>

#include "src/backend/ops/attention.hpp"
#include "src/comm/mesh.hpp"
#include "src/core/rng.hpp"
#include "src/model/parallel/cp.hpp"
#include "src/model/parallel/cp_attention.hpp"
#include "tests/strategy_test_util.hpp"

using namespace shardlab;
using namespace shardlab::strategy_test;

namespace {

std::vector<float> random_values(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  const Rng rng(seed, "cp test");
  for (size_t i = 0; i < n; ++i) v[i] = rng.normal(i);
  return v;
}

// Rows of a (B, T, W) buffer at this rank's pieces, (B, Tl, W).
std::vector<float> local_rows(const std::vector<float>& whole, const CpContext& cp, int64_t B, int64_t W) {
  std::vector<float> out(static_cast<size_t>(B * cp.local() * W));
  for (int64_t b = 0; b < B; ++b)
    for (const CpPiece& p : cp.pieces)
      std::copy_n(whole.begin() + (b * cp.seq + p.pos0) * W, p.len * W, out.begin() + (b * cp.local() + p.row0) * W);
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  return worst;
}

}  // namespace

TEST_CASE("context-parallel attention matches the whole sequence's, forward and backward", "[cp][cp-attention]") {
  const int C = g_mpi->world();
  if (C < 2) return;  // registered at 2 and 4 ranks
  const int64_t B = 2, T = 2048, H = 4, KV = 2, hd = 16, W = (H + 2 * KV) * hd;
  auto be = test::test_backend();
  Pool pool(*be);
  auto comm = test::test_communicator(pool);
  const std::vector<float> qkv = random_values(static_cast<size_t>(B * T * W), 7);
  const std::vector<float> dy = random_values(static_cast<size_t>(B * T * H * hd), 8);
  // The reference: the naive kernels over whole sequences (every rank computes it).
  std::vector<float> y(dy.size()), att(static_cast<size_t>(B * H * T * T)), dqkv(qkv.size());
  std::vector<float> scratch(static_cast<size_t>(attention_scratch_elems(T, H)));
  ops::attention_forward(*be, Tensor::of(std::span<float>(y)).reshape(std::vector<int64_t>{B * T, H * hd}),
                         Tensor::of(std::span<float>(att)), Tensor(const_cast<float*>(qkv.data()), DType::f32, {B, T, W}),
                         H, KV);
  ops::attention_backward(*be, Tensor(dqkv.data(), DType::f32, {B, T, W}), Tensor::of(std::span<const float>(dy)),
                          Tensor(const_cast<float*>(qkv.data()), DType::f32, {B, T, W}),
                          Tensor::of(std::span<float>(att)), H, KV, Tensor::of(std::span<float>(scratch)));
  ModelSpec spec = model_preset("llama-tiny");
  spec.seq = T;
  for (CpMethod method : {CpMethod::allgather, CpMethod::ring})
    for (CpBalance balance : {CpBalance::head_tail, CpBalance::contiguous}) {
      CpContext cp;
      cp.degree = C, cp.rank = comm->rank(), cp.config = {method, balance}, cp.comm = comm.get(), cp.seq = T;
      cp.pieces = cp_pieces(T, C, cp.rank, balance);
      std::vector<float> mine = local_rows(qkv, cp, B, W);
      const std::vector<float> my_dy = local_rows(dy, cp, B, H * hd);
      Batch batch;
      batch.B = B, batch.T = cp.local(), batch.cp = &cp;
      UnitContext c{*be, pool, spec, batch, Checkpointing::none, TpContext{}};
      const blocks::AttentionShape a{B, cp.local(), H, KV, hd};
      Saved s;
      Tensor q = s.add(pool, "qkv", {B, cp.local(), W});
      be->copy(q, Tensor::of(std::span<const float>(mine)));
      Tensor out = cp::attention_forward(c, s, q, a);
      std::vector<float> got(static_cast<size_t>(out.numel())), dgot(mine.size());
      be->copy(Tensor::of(std::span<float>(got)), out);
      Block ws = pool.alloc(DType::f32, cp::attention_scratch_elems(c, a), Category::workspace, "tiles");
      cp::attention_backward(c, s, Tensor(dgot.data(), DType::f32, {B, cp.local(), W}),
                             Tensor::of(std::span<const float>(my_dy)), ws.flat(DType::f32), a);
      const double fwd = max_abs_diff(got, local_rows(y, cp, B, H * hd));
      const double bwd = max_abs_diff(dgot, local_rows(dqkv, cp, B, W));
      INFO(cp_method_name(method) << " " << cp_balance_name(balance) << " rank " << cp.rank << " of " << C
                                  << ": forward " << fwd << ", backward " << bwd);
      CHECK(fwd <= 2e-5);
      CHECK(bwd <= 1e-4);
      // Pairs: those of the pieces, per sequence and head (what the kernel calls were given).
      CHECK(cp.pairs == cp_causal_pairs(cp.pieces));
      if (C == 4) {
        const int64_t contiguous[] = {131328, 393472, 655616, 917760};
        CHECK(cp.pairs == (balance == CpBalance::head_tail ? 524544 : contiguous[cp.rank]));
      }
    }
}

TEST_CASE("head-tail pieces balance causal work exactly; bad sequence lengths are refused", "[cp][cp-pieces]") {
  for (int r = 0; r < 4; ++r) CHECK(cp_causal_pairs(cp_pieces(2048, 4, r, CpBalance::head_tail)) == 524544);
  CHECK(cp_pieces(2048, 4, 1, CpBalance::head_tail) == std::vector<CpPiece>{{0, 256, 256}, {256, 1536, 256}});
  CHECK(cp_pieces(2048, 4, 3, CpBalance::contiguous) == std::vector<CpPiece>{{0, 1536, 512}});
  CHECK_THROWS_WITH(check_cp_seq(100, 4, CpBalance::head_tail), Catch::Contains("100 positions") &&
                                                                     Catch::Contains("8 equal pieces"));
  CHECK_NOTHROW(check_cp_seq(100, 4, CpBalance::contiguous));
}

namespace {

TrainConfig cp_config(const std::string& preset, StrategyKind kind, int cp, int tp = 1, int pp = 1,
                      CpMethod method = CpMethod::allgather) {
  TrainConfig cfg = parity_config(kind, g_mpi->world());
  cfg.layout.cp.method = method;
  cfg.spec = model_preset(preset);
  cfg.spec.seq = 256;
  cfg.batch = 4;
  cfg.layout.dims.cp = cp;
  cfg.layout.dims.tp = tp;
  cfg.layout.dims.pp = pp;
  if (pp > 1) cfg.accum = 2;
  return cfg;
}

TrainConfig one_rank(TrainConfig c) {
  c.layout = ParallelLayout{};
  return c;
}

// Losses and every parameter this rank holds (its stage's units, its tensor-parallel part) against
// single-rank training's.
void check_cp(const TrainConfig& cfg) {
  const std::string what =
      fmt::format("{} {} {} ({}){}{}", cfg.spec.name, strategy_name(cfg.strategy.kind),
                  cfg.layout.dims.resolved(g_mpi->world()).describe(), cp_method_name(cfg.layout.cp.method),
                  cfg.layout.sequence_parallel ? " sp" : "",
                  cfg.strategy.offload != Offload::none ? std::string(" off:") + offload_name(cfg.strategy.offload) : "");
  const PartsRun got = train_parts(cfg);
  const PartsWorst w = compare_parts(got, reference(one_rank(cfg)), cfg.spec);
  if (g_mpi->rank() == 0)
    std::printf("parity %-72s: max loss rel diff %.2e, max param abs diff %.2e (%zu params)\n",
                what.c_str(), w.loss, w.param, w.compared);
  INFO(what << " world " << g_mpi->world() << " rank " << g_mpi->rank());
  CHECK(got.losses.size() == size_t(cfg.steps));
  CHECK(w.compared > 0);
  CHECK(w.loss <= 1e-5);
  CHECK(w.param <= 2e-5);
}

}  // namespace

TEST_CASE("context parallelism matches single-rank training", "[cp][cp-train]") {
  const int N = g_mpi->world();
  if (N < 2) return;
  for (CpMethod m : {CpMethod::allgather, CpMethod::ring})
    for (const char* preset : {"tiny", "llama-tiny"}) {
      check_cp(cp_config(preset, StrategyKind::zero3, N, 1, 1, m));
      if (N == 2) check_cp(cp_config(preset, StrategyKind::ddp, 2, 1, 1, m));
      if (N == 4) {
        check_cp(cp_config(preset, StrategyKind::zero3, 2, 1, 1, m));  // dp 2 x cp 2
        check_cp(cp_config(preset, StrategyKind::zero3, 2, 2, 1, m));  // cp 2 x tp 2
        check_cp(cp_config(preset, StrategyKind::zero3, 2, 1, 2, m));  // pp 2 x cp 2
        TrainConfig hybrid = cp_config(preset, StrategyKind::zero2, 2, 1, 1, m);  // 2 replicas of a cp 2 shard group
        hybrid.layout.dims.dp_replicate = 2, hybrid.layout.dims.dp_shard = 1;
        check_cp(hybrid);
        TrainConfig sp = cp_config(preset, StrategyKind::zero3, 2, 2, 1, m);  // cp 2 x tp 2 + sequence parallelism
        sp.layout.sequence_parallel = true;
        check_cp(sp);
      }
      if (N == 2) {
        TrainConfig off = cp_config(preset, StrategyKind::zero3, 2, 1, 1, m);  // offloaded optimizer
        off.strategy.offload = Offload::optimizer;
        check_cp(off);
      }
    }
  // A mixture of experts: routing is per token, its balancing statistics add up over dp x cp.
  check_cp(cp_config("qwen3-moe-tiny", StrategyKind::zero3, N));
  if (N == 4) check_cp(cp_config("mixtral-tiny", StrategyKind::ddp, 2));  // dp 2 x cp 2
}

TEST_CASE("context parallelism: memory measured = predicted on every rank", "[cp][cp-memory]") {
  const int N = g_mpi->world();
  if (N < 2) return;
  for (CpMethod m : {CpMethod::allgather, CpMethod::ring})
    for (const char* preset : {"tiny", "llama-tiny"}) {
      const std::string what = std::string(preset) + " " + cp_method_name(m);
      check_measured_is_predicted(cp_config(preset, StrategyKind::zero3, N, 1, 1, m), what + " zero3 cp");
      if (N == 4) check_measured_is_predicted(cp_config(preset, StrategyKind::ddp, 2, 1, 1, m), what + " ddp dp 2 x cp 2");
    }
}

// bf16 parameters and gradients: against single-rank training in bf16 (the same roundings of sums
// taken in another order: the cp ranks' gradients are reduced in bf16 across them), and within
// 1e-3 of f32 training; with --activation-checkpointing blocks (forward's gather runs again).
TEST_CASE("context parallelism: bf16 parameters and gradients train as on one rank", "[cp][cp-bf16]") {
  const int N = g_mpi->world();
  if (N < 2) return;
  for (const char* preset : {"tiny", "llama-tiny"}) {
    TrainConfig cfg = cp_config(preset, StrategyKind::zero3, N, 1, 1, N == 4 ? CpMethod::ring : CpMethod::allgather);
    cfg.checkpointing = Checkpointing::blocks;
    const RunOut f32 = reference(one_rank(cfg));
    cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = DType::bf16;
    const RunOut got = train_mpi(cfg), ref = reference(one_rank(cfg));
    double worst = 0, worst_f32 = 0;
    for (size_t k = 0; k < got.losses.size() && k < ref.losses.size(); ++k) {
      worst = std::max(worst, std::fabs(double(got.losses[k]) - ref.losses[k]) / ref.losses[k]);
      worst_f32 = std::max(worst_f32, std::fabs(double(got.losses[k]) - f32.losses[k]) / f32.losses[k]);
    }
    if (g_mpi->rank() == 0)
      std::printf("bf16 %-24s cp %d: losses within %.2e of bf16 on one rank, %.2e of f32\n", preset, N, worst,
                  worst_f32);
    INFO(preset << " cp " << N << ": losses within " << worst << " of one rank's bf16, " << worst_f32 << " of f32");
    CHECK(got.losses.size() == ref.losses.size());
    CHECK(worst <= 3e-5);
    CHECK(worst_f32 < 1e-3);
  }
}

// The cp axis's bus bytes against cp::micro_step_bus_bytes (compare's theory), to the byte, for both
// methods, with and without forward run again (--activation-checkpointing blocks), over 2 micro-steps.
TEST_CASE("context parallelism: the cp axis carries what its formula says", "[cp][cp-bytes]") {
  const int N = g_mpi->world();
  if (N < 2) return;
  // qwen3-moe-tiny: heads of 16 where hidden / heads is 8.
  for (const char* preset : {"llama-tiny", "qwen3-moe-tiny"})
  for (CpMethod m : {CpMethod::allgather, CpMethod::ring})
    for (Checkpointing ck : {Checkpointing::none, Checkpointing::blocks}) {
      CompareConfig cc;
      cc.train = cp_config(preset, StrategyKind::zero3, N, 1, 1, m);
      cc.train.steps = 1;
      cc.train.accum = 2;
      cc.train.checkpointing = ck;
      cc.strategies = {StrategyKind::zero3};
      std::FILE* sink = std::fopen("/dev/null", "w");
      auto be = test::test_backend();
      const CompareResult r = run_compare(*be, world_group(), cc, sink);
      std::fclose(sink);
      REQUIRE(r.runs.size() == 1);
      const AxisTraffic* cp_axis = r.runs[0].traffic_on(CommAxis::cp);
      REQUIRE(cp_axis != nullptr);
      INFO(preset << " " << cp_method_name(m) << " " << checkpointing_name(ck) << ": cp axis " << cp_axis->bytes
                  << " theory " << cp_axis->theory);
      CHECK(cp_axis->degree == N);
      CHECK(cp_axis->bytes > 0);
      CHECK(cp_axis->bytes == cp_axis->theory);
    }
}

// The memory target: Llama 3 8B at 64K over cp 8 holds the activations per rank that cp 1
// holds at 8K (the same 8,192 positions per rank), predicted (ZeRO-3, bf16, blocks checkpointing).
TEST_CASE("context parallelism keeps activations per rank flat as T x cp grows", "[cp][cp-flat]") {
  auto predicted = [](int64_t seq, int cp) {
    StepConfig step;
    step.spec = model_preset("llama3-8b");
    step.spec.seq = seq;
    step.strategy.kind = StrategyKind::zero3;
    step.strategy.precision.param_dtype = step.strategy.precision.reduce_dtype = DType::bf16;
    step.checkpointing = Checkpointing::blocks;
    step.layout.dims = ParallelDims{1, 0, 0, 1, cp}.resolved(8);
    return predict_step(step, 8, 0, 1, false);
  };
  const Estimate whole = predicted(8192, 1), split = predicted(65536, 8);
  const auto act = static_cast<size_t>(Category::activations);
  const double a = double(whole.at_peak[act]), b = double(split.at_peak[act]);
  INFO("activations at the peak: cp 1 at 8K " << a << " B, cp 8 at 64K " << b << " B; peaks " << whole.peak << ", "
                                              << split.peak);
  CHECK(std::fabs(b - a) <= 0.05 * a);
  CHECK(double(split.peak) <= 1.05 * double(whole.peak));  // the layer's gathered K/V on top
}
