// The time model of src/plan/plan_time.hpp against arithmetic done by hand (in the comments) and
// against the FLOP formulas of Narayanan et al. 2021 (eq. 3) and its training-time estimate; the
// device presets against their datasheets.
#include <catch2/catch.hpp>

#include "src/core/check.hpp"
#include "src/plan/plan_time.hpp"

using namespace shardlab;

namespace {

// The schedules these tests run, by the names --pp-schedule takes.
const PpSchedule interleaved = parse_pp_schedule("interleaved-1f1b");

ModelSpec gpt(int64_t layers, int64_t h, int64_t heads, int64_t seq, int64_t vocab) {
  ModelSpec m;
  m.family = FamilyId::gpt2;
  m.layers = layers, m.dim = h, m.heads = heads, m.seq = seq, m.vocab = vocab;
  return m;
}

DeviceRates rates(double flops, double hbm, double intra, double inter, int per_node) {
  DeviceRates r;
  r.flops = {flops, "test"}, r.hbm = {hbm, "test"}, r.intra = {intra, "test"}, r.inter = {inter, "test"};
  r.ranks_per_node = per_node;
  return r;
}

Achievable halves(double knee) {
  Achievable a;
  a.gemm = a.memory = a.intra = a.inter = 0.5;
  a.knee = knee;
  return a;
}

}  // namespace

TEST_CASE("plan time: a GEMM is the slower of its FLOPs and its bytes, with the shape's efficiency", "[plan]") {
  const DeviceRates r = rates(100e12, 1e12, 1, 1, 8);  // at half: 5e13 FLOP/s, 5e11 B/s
  // 1024^3: 2 x 1024^3 = 2147483648 FLOPs / 5e13 = 4.294967296e-5 s; bytes 2 x 3 x 1024^2 =
  // 6291456 / 5e11 = 1.26e-5 s: compute-bound.
  CHECK(gemm_seconds(1024, 1024, 1024, 1, 2, r, halves(0)) == Approx(4.294967296e-5).epsilon(1e-12));
  // 4096 x 4096 x 8: 268435456 FLOPs / 5e13 = 5.37e-6 s; bytes 2 (4096 x 8 + 8 x 4096 + 4096^2) =
  // 33685504 / 5e11 = 6.7371008e-5 s: memory-bound.
  CHECK(gemm_seconds(4096, 4096, 8, 1, 2, r, halves(0)) == Approx(6.7371008e-5).epsilon(1e-12));
  // 48^3 with knee 48: sat = 1/2 per dimension, eff 0.5 / 8 = 0.0625: 221184 FLOPs / 6.25e12 =
  // 3.538944e-8 s (bytes: 13824 / 5e11 = 2.76e-8); three of them 1.0616832e-7.
  CHECK(gemm_seconds(48, 48, 48, 3, 2, r, halves(48)) == Approx(1.0616832e-7).epsilon(1e-12));
}

TEST_CASE("plan time: every piece of a TP 2 x PP 2 x DP 2 step, compute-bound, by hand", "[plan]") {
  // GPT L=4 h=512 a=8 (d 64) s=256 V=1000 f=2048; tp 2, pp 2, dp 2, b 2, B 16: M = 16/(2 x 2) = 4.
  // 1e12 FLOP/s at half = 5e11; HBM 1e20 (memory work vanishes); NVLink 1e9 at half = 5e8 B/s,
  // network 2e8 at half = 1e8 B/s; 4 ranks per node: tp x dp = 4 fits one (DP on NVLink), the
  // pipeline's 8 do not (p2p on the network).
  const ModelSpec m = gpt(4, 512, 8, 256, 1000);
  const DeviceRates r = rates(1e12, 1e20, 1e9, 2e8, 4);
  TimeLayout l;
  l.tp = 2, l.pp = 2, l.dp = 2, l.micro_batch = 2, l.global_batch = 16;
  l.recompute = Checkpointing::blocks;
  l.dp_overlap = 0.5;
  l.flash_attention = false;  // the score products as GEMMs: backward 2x forward
  // Per layer, TP rank and micro-batch (n = 512 tokens): dense 24 n h^2 / t = 1610612736 FLOPs,
  // attention 4 b s^2 h / t = 134217728: forward 1744830464 FLOPs = 3.489660928e-3 s.
  // Last stage (2 layers and the head; it beats the first, whose embedding costs no FLOPs):
  //   compute   2 x 3 x 1744830464 + head 3 x 2 n h V / t (3 x 262144000) = 11255414784 FLOPs
  //             = 0.022510829568 s
  //   recompute 2 x 1744830464 = 3489660928 FLOPs = 0.006979321856 s
  //   TP        one all-reduce: 2 (t-1)/t n h x 2 bytes = 524288 / 5e8 = 1.048576e-3 s; 6 per layer
  //             (2 forward, 2 recompute, 2 backward) x 2 layers = 0.012582912 s
  //   stage     0.042073063424 s (the first: 0.041548775424, 13 all-reduces with the embedding's)
  const TimePrediction p = predict_step_time(m, l, r, halves(0));
  CHECK(p.stage_s == Approx(0.042073063424).epsilon(1e-9));
  CHECK(p.split.compute == Approx(4 * 0.022510829568).epsilon(1e-9));
  CHECK(p.split.recompute == Approx(4 * 0.006979321856).epsilon(1e-9));
  CHECK(p.split.exposed_on(CommAxis::tp) == Approx(4 * 0.012582912).epsilon(1e-9));
  // Bubble (p-1)/v x stage = 0.042073063424 s. p2p: b s h x 2 bytes = 524288 B / 1e8 = 5.24288e-3 s,
  // M x v x 2 = 8 messages: 0.04194304 s.
  CHECK(p.split.bubble == Approx(0.042073063424).epsilon(1e-9));
  CHECK(p.split.pp_p2p == Approx(0.04194304).epsilon(1e-9));
  // DP: the last stage's parameters per rank: 2 layers x 12 h^2 / t = 3145728, head V h / t = 256000:
  // 3401728, gradients 6803456 bytes; all-reduce bus bytes 2 (dp-1)/dp x that = 6803456 / 5e8 =
  // 0.013606912 s; half of it (0.006803456) hides in the last backward (window: backward
  // 0.013958643712 + recompute 0.006979321856 + the head's 0.001048576 s, more than enough).
  CHECK(p.split.exposed_on(CommAxis::dp) == Approx(0.006803456).epsilon(1e-9));
  CHECK(p.split.optimizer < 1e-9);  // 3401728 x 36 bytes at 5e19 B/s
  const double total = 4 * (0.022510829568 + 0.006979321856 + 0.012582912) + 0.042073063424 + 0.04194304 + 0.006803456;
  CHECK(p.split.total == Approx(total).epsilon(1e-9));
  CHECK(p.tokens_per_s == Approx(16 * 256 / total).epsilon(1e-9));

  SECTION("ZeRO-1: the gradients' reduce-scatter hides by half, the parameters' all-gather does not") {
    l.dp_strategy = StrategyKind::zero1;
    // reduce-scatter (dp-1)/dp x 6803456 / 5e8 = 0.006803456, half hidden; all-gather the same, exposed.
    CHECK(predict_step_time(m, l, r, halves(0)).split.exposed_on(CommAxis::dp) == Approx(0.010205184).epsilon(1e-9));
  }
  SECTION("selective recomputation: the attention core only, and no extra all-reduces") {
    l.recompute = Checkpointing::attention;
    const TimePrediction q = predict_step_time(m, l, r, halves(0));
    // 2 layers x 134217728 FLOPs / 5e11 = 5.36870912e-4 s per micro-batch; 4 all-reduces per layer.
    CHECK(q.split.recompute == Approx(4 * 5.36870912e-4).epsilon(1e-9));
    CHECK(q.split.exposed_on(CommAxis::tp) == Approx(4 * 8 * 1.048576e-3).epsilon(1e-9));
  }
  SECTION("flash attention: its backward is 2.5x its forward (the scores again), not 2x") {
    l.flash_attention = true;
    // 0.5 x 134217728 FLOPs more per layer: 2 layers, 4 micro-batches, 2.68435456e-4 s each.
    CHECK(predict_step_time(m, l, r, halves(0)).split.compute ==
          Approx(4 * (0.022510829568 + 2.68435456e-4)).epsilon(1e-9));
  }
  SECTION("interleaving divides the bubble by v and multiplies the messages by v") {
    l.schedule = interleaved, l.virtual_stages = 2;
    // 1 layer per chunk, 2 chunks per stage: the same stage time.
    const TimePrediction q = predict_step_time(m, l, r, halves(0));
    CHECK(q.split.bubble == Approx(0.042073063424 / 2).epsilon(1e-9));
    CHECK(q.split.pp_p2p == Approx(2 * 0.04194304).epsilon(1e-9));
  }
}

TEST_CASE("plan time: a calibrated whole-step rate is the layout's micro-batch's", "[plan]") {
  DeviceRates r = rates(1e12, 1e20, 1e9, 2e8, 4);
  r.flops_by_micro_batch = {{2, 10e9}, {4, 20e9}, {8, 40e9}};
  CHECK(r.flops_at(1) == 10e9);  // below every measured one: the smallest's
  CHECK(r.flops_at(2) == 10e9);
  CHECK(r.flops_at(6) == 20e9);  // the largest measured not above it
  CHECK(r.flops_at(64) == 40e9);
  // Whole-step compute at micro-batch 4 runs at 20 GFLOP/s: as with that one rate and no table.
  const ModelSpec m = gpt(4, 512, 8, 256, 1000);
  TimeLayout l;
  l.dp = 1, l.micro_batch = 4, l.global_batch = 8;
  Achievable a;
  a.whole_step = true;
  const TimePrediction by_mb = predict_step_time(m, l, r, a);
  const TimePrediction plain = predict_step_time(m, l, rates(20e9, 1e20, 1e9, 2e8, 4), a);
  CHECK(by_mb.split.compute == Approx(plain.split.compute).epsilon(1e-12));
  CHECK(by_mb.split.compute > 0);
  l.micro_batch = 2;  // twice the micro-batches at half the rate: twice the compute time
  CHECK(predict_step_time(m, l, r, a).split.compute == Approx(2 * plain.split.compute).epsilon(1e-12));
}

TEST_CASE("plan time: memory-bound work in bytes, on a model small enough to count by hand", "[plan]") {
  // GPT L=1 h=4 a=1 (d 4) s=4 V=4 f=16, one rank, b = B = 1; FLOP/s 1e30 (nothing is compute-bound);
  // HBM 2 B/s at half: 1 byte per second, so seconds are bytes.
  const ModelSpec m = gpt(1, 4, 1, 4, 4);
  const DeviceRates r = rates(1e30, 2, 1, 1, 8);
  TimeLayout l;
  l.flash_attention = false;
  // GEMM bytes 2 (mk + kn + mn), symmetric, so each backward product moves as much as its forward:
  //   QKV (4,12,4) 224, out (4,4,4) 96, up (4,16,4) 288, down (4,4,16) 288: forward 896, backward 1792
  //   scores (4,4,4) 96 and context 96: forward 192, backward 384
  // Element-wise: 4 x 4 x 11 + 4 x 16 x 2 = 304 accesses = 608 bytes forward, 1216 backward;
  //   scores 16 x 4.5 x 2 = 144 forward, 16 x 5.5 x 2 = 176 backward
  // Layer: 1504 + 3008 + 336 + 560 = 5408. Embedding 4 x 4 x 3 x 2 = 96. Head: GEMM (4,4,4) 96,
  //   backward 192; cross-entropy 16 logits x 12 = 192 forward, x 8 = 128 backward: 608.
  // Compute 5408 + 96 + 608 = 6112. Optimizer: 12 h^2 + V h + s h = 224 parameters x 36 = 8064.
  const TimePrediction p = predict_step_time(m, l, r, halves(0));
  CHECK(p.split.compute == Approx(6112).epsilon(1e-12));
  CHECK(p.split.optimizer == Approx(8064).epsilon(1e-12));
  CHECK(p.split.total == Approx(6112 + 8064).epsilon(1e-12));
  // Flash attention: no scores in memory, its products at GEMM speed (here free): 6112 - 336 - 560.
  l.flash_attention = true;
  CHECK(predict_step_time(m, l, r, halves(0)).split.compute == Approx(5216).epsilon(1e-12));
}

TEST_CASE("plan time: FLOPs as Megatron counts them are eq. 3 of Narayanan et al. 2021", "[plan]") {
  // Table 1's shapes (h, L, heads) at s 2048, V 51200, each at its global batch.
  const int64_t rows[][4] = {{2304, 24, 24, 512},     {3072, 30, 32, 512},     {4096, 36, 32, 512},
                             {6144, 40, 48, 1024},    {8192, 48, 64, 1536},    {10240, 60, 80, 1792},
                             {12288, 80, 96, 2304},   {16384, 96, 128, 2160},  {20480, 105, 128, 2520},
                             {25600, 128, 160, 3072}};
  for (const auto& row : rows) {
    const double h = double(row[0]), L = double(row[1]), B = double(row[3]), s = 2048, V = 51200;
    const ModelSpec m = gpt(row[1], row[0], row[2], 2048, 51200);
    const double with = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h));
    const double without = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h));
    CHECK(megatron_flops(m, row[3], Checkpointing::blocks) == Approx(with).epsilon(1e-12));
    CHECK(megatron_flops(m, row[3], Checkpointing::none) == Approx(without).epsilon(1e-12));
  }
  // Section 5.1's estimate: GPT-3 175B (h 12288, L 96) on 300B tokens on 1024 A100s at 140 TFLOP/s
  // takes 34 days (8 T P / (n X), P = 175e9). Our count per token (with recomputation) gives the same
  // within 3% (eq. 3 has the s/6h and V/16lh terms that 8P leaves out).
  const ModelSpec gpt3 = gpt(96, 12288, 96, 2048, 51200);
  const double per_token = megatron_flops(gpt3, 1, Checkpointing::blocks) / 2048;
  CHECK(per_token * 300e9 / (1024 * 140e12) / 86400 == Approx(34).epsilon(0.03));
}

TEST_CASE("plan time: device presets carry their datasheet figures", "[plan]") {
  const DevicePeaks& a100 = device_preset("a100-80gb");
  CHECK(a100.dense_bf16_tflops == 312);
  CHECK(a100.hbm_gbs == 2039);
  CHECK(a100.nvlink_gbs == 300);  // 600 GB/s bidirectional
  CHECK(a100.nic_gbits == 200);
  CHECK(a100.nics_per_node == 8);
  const DevicePeaks& h100 = device_preset("h100-80gb");
  CHECK(h100.dense_bf16_tflops == 989.4);
  CHECK(h100.hbm_gbs == 3350);
  CHECK(h100.nvlink_gbs == 450);
  CHECK(h100.nic_gbits == 400);
  const DevicePeaks& h200 = device_preset("h200");
  CHECK(h200.dense_bf16_tflops == 989.4);
  CHECK(h200.hbm_gbs == 4800);
  // Memory: the totals nvidia-smi lists (MiB), not the datasheets' decimal GB.
  CHECK(a100.memory_bytes() == uint64_t{81920} << 20);
  CHECK(h100.memory_bytes() == uint64_t{81559} << 20);
  CHECK(h200.memory_bytes() == uint64_t{143771} << 20);
  const DevicePeaks& b200 = device_preset("b200");  // HGX B200 at 1,000 W: 4.5 PFLOP/s with sparsity
  CHECK(b200.dense_bf16_tflops == 2250);
  CHECK(b200.hbm_gbs == 8000);
  CHECK(b200.nvlink_gbs == 900);
  CHECK(b200.sms == 148);
  CHECK(b200.memory_bytes() == uint64_t{183359} << 20);
  // 8 x 200 Gb/s for 8 GPUs: 25 GB/s each.
  CHECK(device_rates(a100).inter.value == 25e9);
  CHECK(device_rates(h100).flops.value == 989.4e12);
  // bench-train's MFU stays on the rounded figure.
  CHECK(kH100.dense_bf16_tflops == 989);
  CHECK_THROWS_WITH(device_preset("v100"), Catch::Contains("expected one of a100-80gb, h100-80gb, h200, b200"));
  CHECK(&device_preset("h100") == &h100);  // the short names: the 80 GB parts
  CHECK(&device_preset("a100") == &a100);
}

TEST_CASE("plan time: a layout the model cannot run is refused with its values", "[plan]") {
  const ModelSpec m = gpt(4, 512, 8, 256, 1000);
  TimeLayout l;
  l.tp = 3;
  CHECK_THROWS_AS(predict_step_time(m, l, rates(1, 1, 1, 1, 8)), InputError);
  l.tp = 1, l.pp = 2, l.schedule = interleaved, l.virtual_stages = 2, l.global_batch = 3;
  CHECK_THROWS_WITH(predict_step_time(m, l, rates(1, 1, 1, 1, 8)),
                    Catch::Contains("--micro-batches 3 is not a multiple of --pp 2"));
}

TEST_CASE("plan time: hybrid sharding reduces in the node and across nodes; offload crosses the host link", "[plan]") {
  // GPT L=4 h=512 a=8 s=256 V=1000 (tied head), one stage holding everything: 4 x 12 h^2 + V h + s h =
  // 12582912 + 512000 + 131072 = 13225984 parameters, bf16: p = g = 26451968 bytes.
  const ModelSpec m = gpt(4, 512, 8, 256, 1000);
  DeviceRates r = rates(1e12, 1e20, 1e9, 2e8, 4);  // NVLink 5e8 B/s at half, network 1e8
  r.host = {1e9, "test"};
  r.host_adamw = {1e6, "test"};
  TimeLayout l;
  l.dp = 8, l.dp_shard = 4, l.micro_batch = 1, l.global_batch = 16;  // M = 2
  l.dp_strategy = StrategyKind::zero1;
  l.dp_overlap = 0;
  // zero1, S = 4 in a node of 4 (NVLink), 2 replicas across nodes (network):
  //   reduce-scatter 3/4 g = 19838976 B / 5e8 = 0.039677952 s
  //   all-reduce of the 1/4 shard across 2 groups: 1/2 x 2 g / 4 = 6612992 B / 1e8 = 0.06612992 s
  //   all-gather of the parameters after the update: 3/4 p / 5e8 = 0.039677952 s (exposed)
  CHECK(predict_step_time(m, l, r, halves(0)).split.exposed_on(CommAxis::dp) == Approx(0.145485824).epsilon(1e-9));
  // zero2 with the optimizer offloaded, the whole 8 sharding (S = 8): each micro-batch's gradient
  // shard down (2 x g / 8) and the updated parameter shard up (p / 8): 9919488 B / 1e9 B/s; AdamW on
  // the host over 13225984 / 8 = 1653248 parameters at 1e6 per second.
  l.dp_shard = 0;
  l.dp_strategy = StrategyKind::zero2;
  l.offload = Offload::optimizer;
  const TimePrediction q = predict_step_time(m, l, r, halves(0));
  CHECK(q.split.offload == Approx(9.919488e-3).epsilon(1e-9));
  CHECK(q.split.optimizer == Approx(1.653248).epsilon(1e-9));
  // ddp cannot offload.
  l.dp_strategy = StrategyKind::ddp;
  CHECK_THROWS_WITH(predict_step_time(m, l, r, halves(0)), Catch::Contains("offload optimizer needs a ZeRO strategy"));
}

TEST_CASE("plan time: ZeRO++ prices each of zero3's collectives on its own link", "[plan]") {
  // The model above (13225984 parameters, bf16: p = g = 26451968 bytes), zero3 over 8 ranks in 2
  // nodes of 4 (L = 4, N = 2): NVLink 5e8 B/s at half, network 1e8; M = 2 micro-batches, no overlap.
  const ModelSpec m = gpt(4, 512, 8, 256, 1000);
  const DeviceRates r = rates(1e12, 1e20, 1e9, 2e8, 4);
  TimeLayout l;
  l.dp = 8, l.micro_batch = 1, l.global_batch = 16;
  l.dp_strategy = StrategyKind::zero3;
  l.dp_overlap = 0;
  // Plain: 7/8 (g + 2p) = 69436416 B per micro-batch over the network: 2 x 0.69436416 s.
  CHECK(predict_step_time(m, l, r, halves(0)).split.exposed_on(CommAxis::dp) == Approx(1.38872832).epsilon(1e-9));
  // All three, blocks of 256 (q8 = 65 x 4 / 256 = 1.015625 B, q4 = 33 x 4 / 256 = 0.515625 B per element):
  //   forward gather 7/8 x 13225984 x 1.015625 = 11753560 B / 1e8        = 0.1175356 s
  //   backward gather in the node 3/4 x p = 19838976 B / 5e8              = 0.039677952 s
  //   gradients in the node 3/4 x 13225984 x 0.515625 = 5114736 B / 5e8   = 0.010229472 s
  //   and across 1/2 x 13225984 / 4 x 0.515625 = 852456 B / 1e8          = 0.00852456 s
  l.zeropp = ZeroPP{8, 4, true, 256};
  CHECK(predict_step_time(m, l, r, halves(0)).split.exposed_on(CommAxis::dp) == Approx(2 * 0.175967584).epsilon(1e-9));
  // hpZ alone: the backward gather moves to NVLink, 2 x (2 x 0.23145472 + 0.039677952).
  l.zeropp = ZeroPP{0, 0, true, 256};
  CHECK(predict_step_time(m, l, r, halves(0)).split.exposed_on(CommAxis::dp) == Approx(2 * (2 * 0.23145472 + 0.039677952)).epsilon(1e-9));
}

TEST_CASE("plan time: calibrated rates run every GEMM at the whole step's rate and nothing apart", "[plan]") {
  // GPT L=1 h=4 a=1 s=4 V=4 f=16, one rank: forward FLOPs per layer 2 n (12 h^2... as products):
  //   QKV 2x4x12x4 = 384, out 128, up 512, down 512, scores 128, context 128: 1792; x3 passes = 5376
  //   head 2x4x4x4 = 128, x3 = 384: 5760 FLOPs at 1e3 FLOP/s = 5.76 s; the optimizer: 224 parameters
  //   at 32 per second = 7 s.
  const ModelSpec m = gpt(1, 4, 1, 4, 4);
  DeviceRates r = rates(1e3, 1, 1, 1, 8);  // HBM 1 B/s would dominate if element-wise work counted
  r.adamw = {32, "test"};
  Achievable a;
  a.whole_step = true;
  TimeLayout l;
  l.flash_attention = false;
  const TimePrediction p = predict_step_time(m, l, r, a);
  CHECK(p.split.compute == Approx(5.76).epsilon(1e-12));
  CHECK(p.split.optimizer == Approx(7).epsilon(1e-12));
  CHECK(p.split.total == Approx(12.76).epsilon(1e-12));
}

TEST_CASE("plan time: a calibrated wait per data-parallel collective inside the passes, by hand", "[plan]") {
  // GPT L=3 on dp 2, 1 s per wait: the units are 3 blocks, the embedding and the head (5). zero2
  // waits for each one's reduce-scatter in every micro-step's backward (M = 2: 10 s); zero3 also
  // for its gathers in the forward and the backward (15 per micro-step: 30 s), and once more in a
  // recomputed forward (20: 40 s); ddp and zero1 wait after the backward (nothing added). Under
  // pp 3 the slowest stage holds one block and an end (2 units), and the gradients reduce once.
  const ModelSpec m = gpt(3, 4, 1, 4, 4);
  DeviceRates r = rates(1e3, 1e3, 1e3, 1e3, 8);
  TimeLayout l;
  l.dp = 2, l.micro_batch = 1, l.global_batch = 4;
  auto dp_s = [&](StrategyKind k, double sync, Checkpointing ck = Checkpointing::none, int pp = 1) {
    r.sync = {sync, "test"};
    TimeLayout x = l;
    x.dp_strategy = k, x.recompute = ck, x.pp = pp;
    return predict_step_time(m, x, r).split.exposed_on(CommAxis::dp);
  };
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero1}) CHECK(dp_s(k, 1) == dp_s(k, 0));
  CHECK(dp_s(StrategyKind::zero2, 1) - dp_s(StrategyKind::zero2, 0) == Approx(10).epsilon(1e-9));
  CHECK(dp_s(StrategyKind::zero3, 1) - dp_s(StrategyKind::zero3, 0) == Approx(30).epsilon(1e-9));
  CHECK(dp_s(StrategyKind::zero3, 1, Checkpointing::blocks) - dp_s(StrategyKind::zero3, 0, Checkpointing::blocks) ==
        Approx(40).epsilon(1e-9));
  l.dp = 2, l.global_batch = 4;
  CHECK(dp_s(StrategyKind::zero2, 1, Checkpointing::none, 3) - dp_s(StrategyKind::zero2, 0, Checkpointing::none, 3) ==
        Approx(2).epsilon(1e-9));
  CHECK(dp_s(StrategyKind::zero3, 1, Checkpointing::none, 3) - dp_s(StrategyKind::zero3, 0, Checkpointing::none, 3) ==
        Approx(6).epsilon(1e-9));
}

TEST_CASE("plan time: expert parallelism's all-to-alls and dense all-reduce, by hand", "[plan][ep]") {
  // Mixtral shape, small: L=2 h=64 a=4 (g 2, d 16) s=32 V=100, 8 experts of width 32, top 2; b 1,
  // B 8 over dp 8 (M 1); 1e12 FLOP/s, HBM 1e20, NVLink 1e9 and network 2e8 at half: 5e8 and 1e8 B/s;
  // 8 ranks per node, so the ep group (E x cp x tp <= 8) is on NVLink.
  ModelSpec m = model_preset("mixtral-tiny");
  m.layers = 2, m.dim = 64, m.heads = 4, m.kv_heads = 2, m.seq = 32, m.vocab = 100, m.tied_head = false;
  m.moe.experts = 8, m.moe.top_k = 2, m.moe.ffn_dim = 32;
  const DeviceRates r = rates(1e12, 1e20, 1e9, 2e8, 8);
  TimeLayout one, ep;
  one.dp = ep.dp = 8, one.global_batch = ep.global_batch = 8;
  one.dp_strategy = ep.dp_strategy = StrategyKind::zero3;
  ep.ep = 4, ep.dp_shard = 2;  // ep 4 of the 8, zero3 over the other 2
  const TimePrediction a = predict_step_time(m, one, r, halves(0));
  const TimePrediction b = predict_step_time(m, ep, r, halves(0));
  // Per layer four all-to-alls of (E-1)/E n k h x 2 bytes: 3/4 x 32 x 2 x 64 x 2 = 6144 B / 5e8 s.
  // Dense parameters per rank: 2 layers x (64 x (4 + 4) x 16 + 64 x 64 + 8 x 64 router) + 2 x 100 x
  // 64 (embedding, head) = 25600 + 12800 = 38400, sharded over S = 2 under zero3: all-reduced once,
  // 2 (E-1)/E x 19200 x 2 bytes = 57600 B / 5e8 s.
  const double dense = 2 * (64.0 * 8 * 16 + 64 * 64 + 8 * 64) + 2 * 100 * 64;
  const double expect = 2 * 4 * 6144 / 5e8 + 2 * 0.75 * dense / 2 * 2 / 5e8;
  CHECK(b.split.exposed_on(CommAxis::ep) == Approx(expect).epsilon(1e-12));
  CHECK(a.split.exposed_on(CommAxis::ep) == 0);
  // The same FLOPs in fewer, larger expert GEMMs (at a knee of 0 the same seconds).
  CHECK(b.split.compute == Approx(a.split.compute).epsilon(1e-12));
  CHECK(b.hardware_flops == a.hardware_flops);
  // A rank updates its 2 of the 8 experts and the dense part, each over its shard group of 2:
  // expert parameters 2 layers x 8 x 3 x 64 x 32 / 4 = 24576; (dense + experts) / 2 at the AdamW
  // rate (36 bytes per parameter at half HBM).
  CHECK(b.split.optimizer == Approx((dense + 24576) / 2 * 36 / 5e19).epsilon(1e-12));
  ep.ep = 3;
  CHECK_THROWS_WITH(predict_step_time(m, ep, r, halves(0)), Catch::Contains("ep 3"));
}
