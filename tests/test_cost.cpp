// The cost ledger (src/backend/cost.hpp) and the device model that prices it (src/backend/price.hpp)
// against references that share no code with them: GPT-2 124M's published parameter count (its
// GEMMs' FLOPs are 6 N per token), DDP's all-reduce volume 2 (n - 1) / n of the gradients, and
// timelines worked out by hand for the stream replay.
#include <catch2/catch.hpp>

#include <map>
#include <string_view>

#include "src/backend/cost.hpp"
#include "src/backend/price.hpp"
#include "src/comm/sim_comm.hpp"
#include "src/core/device_peaks.hpp"
#include "src/model/blocks/linear.hpp"
#include "src/model/gpt2/gpt2.hpp"
#include "src/train/predict.hpp"
#include "src/train/price_layout.hpp"
#include "src/train/trainer.hpp"

using namespace shardlab;

namespace {

TrainConfig gpt2_config(DType dt) {
  TrainConfig c;
  c.spec = model_preset("gpt2");
  c.strategy.kind = StrategyKind::ddp;
  c.strategy.precision.param_dtype = c.strategy.precision.reduce_dtype = dt;
  return c;
}

double gemm_flops(const CostLedger& l) {
  double f = 0;
  for (const OpCost& c : l.ops())
    if (std::string_view(c.name) == "gemm") f += c.flops + c.tensor_flops;
  return f;
}

// A device whose every op takes flops / 1e9 seconds and whose links move 1e9 bytes/s.
DeviceModel unit_device(double launch_s = 0) {
  DeviceModel d;
  d.name = "unit";
  d.vector_flops = {1e9, "test"};
  d.gemm = 1, d.knee = 0, d.memory = 1;
  d.launch_s = launch_s;
  d.link = {1e9, "test"};
  return d;
}

OpCost work(double ms, int launches = 1) { return {.name = "work", .flops = ms * 1e6, .launches = launches}; }
OpCost transfer(double ms) { return {.name = "all_reduce", .axis = "dp", .group = 2, .bus_bytes = ms * 1e6}; }

}  // namespace

TEST_CASE("a GPT-2 124M step's GEMMs are 6 N FLOPs per token", "[cost]") {
  // 124,439,808 parameters (Radford et al. 2019's 124M, as transformers counts GPT2LMHeadModel at
  // V 50,257); the ones outside GEMMs (positions, norms, biases) are 0.73% of them.
  const double N = 124439808, tokens = 4.0 * 1024;
  for (Device target : {Device::cpu, Device::cuda}) {
    CostLedger l = step_costs(gpt2_config(DType::bf16), 1, 0, 4, target);
    INFO(device_name(target));
    CHECK(gemm_flops(l) == Approx(6 * N * tokens).epsilon(0.01));
  }
}

TEST_CASE("bf16 GEMMs run on tensor cores only where the ledger stands for a GPU", "[cost]") {
  const CostLedger gpu = step_costs(gpt2_config(DType::bf16), 1, 0, 1, Device::cuda);
  const CostLedger cpu = step_costs(gpt2_config(DType::bf16), 1, 0, 1, Device::cpu);
  double gpu_tensor = 0, cpu_tensor = 0;
  int gpu_launches = 0, cpu_launches = 0;
  for (const OpCost& c : gpu.ops()) gpu_tensor += c.tensor_flops, gpu_launches += c.launches;
  for (const OpCost& c : cpu.ops()) cpu_tensor += c.tensor_flops, cpu_launches += c.launches;
  CHECK(gpu_tensor == Approx(gemm_flops(gpu)));  // every product: bf16 operands on the tensor cores
  CHECK(cpu_tensor == 0);
  CHECK(gpu_launches > 100);  // kernels, cuBLAS calls and copies, as the CUDA backend issues them
  CHECK(cpu_launches == 0);   // on the CPU an operation is a function call
}

TEST_CASE("the ledger's collectives carry DDP's all-reduce volume", "[cost]") {
  // DDP all-reduces every f32 gradient once a step: 2 (n - 1) / n x 4 N bus bytes per rank.
  const int world = 8;
  const CostLedger l = step_costs(gpt2_config(DType::f32), world, 0, 1, Device::cuda);
  double bus = 0;  // the gradients' buckets, and the loss's and the norm's few bytes
  int on_comm_stream = 0;
  for (const OpCost& c : l.ops()) bus += c.bus_bytes;
  for (const CostCommand& c : l.commands())
    on_comm_stream += c.kind == CostCommand::Kind::op && c.stream == StreamKind::comm;
  CHECK(bus == Approx(2.0 * (world - 1) / world * 4 * 124439808).epsilon(0.001));
  CHECK(on_comm_stream > 0);
}

TEST_CASE("a copy to the host is a host wait on a GPU, not on the CPU", "[cost]") {
  for (Device target : {Device::cpu, Device::cuda}) {
    CostLedger l(target);
    auto be = make_meta_backend({}, &l);
    float host = 0;
    void* dev = be->raw_alloc(4);
    be->copy(Tensor::flat(&host, DType::f32, 1), Tensor::flat(dev, DType::f32, 1, Device::meta));
    int syncs = 0;
    for (const CostCommand& c : l.commands()) syncs += c.kind == CostCommand::Kind::host_sync;
    CHECK(syncs == (target == Device::cuda ? 1 : 0));
  }
}

TEST_CASE("an under-filled launch is flagged and priced at the bandwidth of the SMs it fills", "[cost]") {
  // A toy column sum planted in the ledger that runs a block per 256 columns: 3 blocks for 768
  // columns, of an H200's 132 SMs. The backend's own sum_rows (a bias gradient) and an axpy over
  // the same rows fill the device.
  CostLedger l(Device::cuda);
  auto be = make_meta_backend({}, &l);
  const int64_t rows = 8192, cols = 768;
  void* x = be->raw_alloc(rows * cols * 4);
  void* y = be->raw_alloc(rows * cols * 4);
  void* out = be->raw_alloc(cols * 4);
  l.add({.name = "toy_column_sum", .flops = double(rows * cols), .bytes = pass_bytes(rows * cols, 1, 0),
         .launches = 1, .kernels = 1, .blocks = 3});
  be->sum_rows(Tensor(x, DType::f32, {rows, cols}, Device::meta), Tensor::flat(out, DType::f32, cols, Device::meta),
               false);
  be->axpy(1.f, Tensor::flat(x, DType::f32, rows * cols, Device::meta),
           Tensor::flat(y, DType::f32, rows * cols, Device::meta));
  const StepPrice p = price_step(l, gpu_device_model(kH200));
  std::map<std::string, const PricedOp*> by_name;
  for (const PricedOp& op : p.ops) by_name[op.name] = &op;
  for (const char* name : {"toy_column_sum", "sum_rows", "axpy"}) REQUIRE(by_name.count(name) == 1);
  const PricedOp &toy = *by_name["toy_column_sum"], &sum_rows = *by_name["sum_rows"], &axpy = *by_name["axpy"];
  CHECK(toy.blocks == 3);
  CHECK(toy.underfilled == 1);
  CHECK(sum_rows.blocks >= 132);  // 24 column tiles x 22 chunks of rows, then the fold
  CHECK(sum_rows.underfilled == 0);
  CHECK(axpy.underfilled == 0);
  // One read of the rows each (axpy: two reads and a write): the toy at 3/132 of the bandwidth.
  CHECK(toy.seconds > 10 * axpy.seconds);
  CHECK(sum_rows.seconds < axpy.seconds);
}

TEST_CASE("the replay overlaps a collective with the compute it does not hold up", "[cost]") {
  // A (1 ms), then a collective on the comm stream, B (1 ms) beside it, then D waits for it.
  for (double comm_ms : {0.5, 2.0}) {
    CostLedger l(Device::cuda);
    l.add(work(1));
    const int done = l.collective(transfer(comm_ms));
    l.add(work(1));
    l.wait(StreamKind::compute, done);
    l.add(work(1));
    const StepPrice p = price_step(l, unit_device());
    INFO("collective of " << comm_ms << " ms");
    CHECK(p.compute == Approx(3e-3));
    CHECK(p.exposed_comm == Approx(std::max(0.0, 1e-3 + comm_ms * 1e-3 - 2e-3)).margin(1e-12));
    CHECK(p.total == Approx(p.compute + p.exposed_comm));
    CHECK(p.comm_busy == Approx(comm_ms * 1e-3));
  }
}

TEST_CASE("the replay charges launch gaps and a mid-step host wait", "[cost]") {
  // The host takes 0.1 ms a launch: the first kernel starts at 0.1 ms; a host synchronisation after
  // it leaves the device idle while the host issues the next (0.1 ms more).
  CostLedger l(Device::cuda);
  l.add(work(1));
  l.host_sync();
  l.add(work(1));
  const StepPrice p = price_step(l, unit_device(1e-4));
  CHECK(p.launch_gaps == Approx(1e-4));
  CHECK(p.host_waits == Approx(1e-4));
  CHECK(p.host_syncs == 1);
  CHECK(p.host_syncs_mid_step == 1);
  CHECK(p.total == Approx(2.2e-3));
  // Many short kernels: the host is the bottleneck (launch-bound).
  CostLedger many(Device::cuda);
  for (int i = 0; i < 100; ++i) many.add(work(0.01));
  const StepPrice q = price_step(many, unit_device(1e-4));
  CHECK(q.total == Approx(100 * 1e-4 + 1e-5));
  CHECK(q.launch_gaps == Approx(q.total - q.compute));
}

TEST_CASE("work done for bookkeeping is not the step's", "[cost]") {
  CostLedger l(Device::cuda);
  {
    CostLedger::Pause paused(&l);
    l.add(work(1));
    CHECK(l.record(StreamKind::compute) == -1);
  }
  l.add(work(1));
  CHECK(l.ops().size() == 1);
  const int before = l.record(StreamKind::compute);
  l.clear();
  l.wait(StreamKind::compute, before);  // an event from before the clear: ignored
  CHECK(l.commands().empty());
}

TEST_CASE("a pipelined layout's step adds the schedule's bubble, (p - 1) / (M + p - 1) under 1F1B", "[cost]") {
  // Narayanan et al. 2021, eq. 1: 1F1B over p stages and M micro-batches idles (p - 1) / (M + p - 1)
  // of a step; every stage is priced (the sim's sends and receives never wait).
  TrainConfig c;
  c.spec = model_preset("tiny");
  c.strategy.kind = StrategyKind::ddp;
  c.layout.dims.pp = 2;
  c.layout.pipeline.schedule = default_pp_schedule(1);
  c.accum = 4;
  const LayoutPrice p = price_layout(c, 2, 1, Device::cuda, gpu_device_model(kH100_80GB));
  REQUIRE(p.stages.size() == 2);
  CHECK(p.stages[1].rank == 1);
  CHECK(p.bubble_share == Approx(1.0 / 5));
  for (const StagePrice& s : p.stages) CHECK(p.step_s(s) == Approx(s.price.total / (1 - 1.0 / 5)));
  CHECK(p.step_s() == Approx(std::max(p.step_s(p.stages[0]), p.step_s(p.stages[1]))));
}

TEST_CASE("a collective orders the compute stream where it is waited for, not where it is polled", "[cost]") {
  CostLedger l(Device::cuda);
  auto be = make_meta_backend({}, &l);
  Pool pool(*be);
  auto comm = make_sim_communicator(0, 4, pool, SimTransport::gpu);
  comm->stats().cost = &l;
  Block buf = pool.alloc(DType::f32, 1024, Category::comm_buffer, "buf");
  Work w = comm->all_reduce(buf.flat(DType::f32));
  auto waits = [&] {
    int n = 0;
    for (const CostCommand& c : l.commands()) n += c.kind == CostCommand::Kind::wait && c.stream == StreamKind::compute;
    return n;
  };
  CHECK_FALSE(w.progress());  // the sim's call is done at once; a GPU's would not be
  CHECK(waits() == 0);
  w.wait();
  CHECK(waits() == 1);
  REQUIRE(l.ops().size() == 1);
  CHECK(l.ops()[0].bus_bytes == Approx(2.0 * 3 / 4 * 4096));
  CHECK(std::string_view(l.ops()[0].name) == "all_reduce");
}

TEST_CASE("cuDNN attention's products run on tensor cores: two of the causal scores forward, five backward",
          "[cost]") {
  // GPT-2 124M (12 layers, 12 heads of 64) at T 1,024: each product of the scores' half a causal
  // mask leaves is 2 B H T^2 hd / 2 FLOPs (Dao 2023's count for a causal FlashAttention-2).
  TrainConfig c = gpt2_config(DType::bf16);
  c.spec.attention = AttentionKernel::cudnn;
  const int64_t B = 2;
  const double product = 2.0 * B * 12 * 1024.0 * 1024.0 * 64 / 2;
  const CostLedger l = step_costs(c, 1, 0, B, Device::cuda);
  double forward = 0, backward = 0, gemm = 0;
  int calls = 0, launches = 0, casts = 0;
  for (const OpCost& op : l.ops()) {
    const std::string_view name = op.name;
    if (name == "cudnn_attention_forward") forward += op.tensor_flops, ++calls, launches += op.launches;
    if (name == "cudnn_attention_backward") backward += op.tensor_flops, ++calls, launches += op.launches;
    if (name == "gemm") gemm += op.tensor_flops;
    if (name == "cast") ++casts;
    CHECK(name.substr(0, 5) != "flash");
  }
  CHECK(calls == 24);
  CHECK(launches == 24);  // one cuDNN graph each
  CHECK(forward == Approx(12 * 2 * product));
  CHECK(backward == Approx(12 * 5 * product));
  CHECK(gemm == Approx(6 * 124439808.0 * B * 1024).epsilon(0.01));  // the rest of the step as before
  // Against the fused kernel's step: the same GEMMs, three casts fewer a layer. cuDNN has none of
  // its own: c_attn's product writes q, k, v in bf16 (blocks::attention_operand_dtype) and c_proj's
  // backward product d(atty) in bf16. Three the fused kernel's step has and cuDNN's does not: the
  // output projection's products round the f32 output forward and for the weight gradient (cuDNN's
  // is saved in bf16), and c_attn's backward rounds the f32 d(q k v) (cuDNN writes it in bf16,
  // which the products read and the bias gradient's sum widens).
  c.spec.attention = AttentionKernel::flash;
  const CostLedger flash = step_costs(c, 1, 0, B, Device::cuda);
  int flash_casts = 0;
  for (const OpCost& op : flash.ops()) flash_casts += std::string_view(op.name) == "cast";
  CHECK(casts == flash_casts - 12 * 3);
  // Refused on the CPU, as a run there is.
  c.spec.attention = AttentionKernel::cudnn;
  CHECK_THROWS_WITH(step_costs(c, 1, 0, B, Device::cpu), Catch::Contains("--attention cudnn runs on CUDA devices"));
}

TEST_CASE("the naive attention's products run on tensor cores where the activations are bf16 on a GPU, as "
          "Megatron's", "[cost]") {
  // GPT-2 124M at T 1,024: each of the four forward products (scores and output) is 2 B H T^2 hd
  // over the whole square (the naive kernel computes the masked half too): two forward, four
  // backward, per layer.
  TrainConfig c = gpt2_config(DType::bf16);
  c.spec.attention = AttentionKernel::naive;
  const int64_t B = 2;
  const double product = 2.0 * B * 12 * 1024.0 * 1024.0 * 64;
  auto products = [&](Device target, double& tensor, double& vector, double& att_bytes) {
    tensor = vector = att_bytes = 0;
    const CostLedger l = step_costs(c, 1, 0, B, target);
    for (const OpCost& op : l.ops()) {
      if (std::string_view(op.name) == "attention_products") tensor += op.tensor_flops, vector += op.flops;
      if (std::string_view(op.name) == "attention_softmax") att_bytes += op.bytes;
    }
  };
  double tensor = 0, vector = 0, bytes = 0;
  products(Device::cuda, tensor, vector, bytes);
  CHECK(tensor == 0);  // f32 activations: f32 probabilities, f32 products
  CHECK(vector == Approx(12 * 6 * product));
  const double f32_bytes = bytes;
  c.spec.activation_dtype = DType::bf16;
  products(Device::cuda, tensor, vector, bytes);
  CHECK(tensor == Approx(12 * 6 * product));
  CHECK(vector == 0);
  CHECK(bytes == Approx(f32_bytes / 2));  // the softmax reads and writes bf16 scores
  products(Device::cpu, tensor, vector, bytes);  // the CPU computes in f32, bf16 activations or not
  CHECK(tensor == 0);
  CHECK(vector == Approx(12 * 6 * product));
}

TEST_CASE("a GPU's gradient norm reads the bf16 gradients as they are; the CPU's widens them first", "[cost]") {
  const TrainConfig c = gpt2_config(DType::bf16);
  // The norm's reads, and the largest cast (the CPU's f32 copy of every gradient: 6 bytes each).
  auto norm = [&](Device target, double& bytes, double& largest_cast) {
    const CostLedger l = step_costs(c, 1, 0, 2, target);
    bytes = largest_cast = 0;
    for (const OpCost& op : l.ops()) {
      if (std::string_view(op.name) == "sum_squares") bytes += op.bytes;
      if (std::string_view(op.name) == "cast") largest_cast = std::max(largest_cast, op.bytes);
    }
  };
  double gpu = 0, cpu = 0, gpu_cast = 0, cpu_cast = 0;
  norm(Device::cuda, gpu, gpu_cast);
  norm(Device::cpu, cpu, cpu_cast);
  // The same gradients: 2 bytes each read on the GPU, 4 (the f32 copy) on the CPU.
  CHECK(gpu == 124439808.0 * 2);  // every gradient once
  CHECK(gpu * 2 == cpu);
  CHECK(cpu_cast == Approx(1.5 * cpu));
  CHECK(gpu_cast < 1.5 * cpu);  // no copy of them on the GPU
}

TEST_CASE("a GPU's cross-entropy writes the logits' gradient in bf16 for the head's products: no rounding pass",
          "[cost]") {
  // GPT-2 124M, 2 x 1,024 positions: the loss reads the f32 logits once and writes bf16 gradients
  // (6 bytes a logit) and no cast rounds N V values after it; the same under DP (the gradient comes
  // back over the logits in f32, then rounded) and on the last stage of a pipeline.
  TrainConfig c = gpt2_config(DType::bf16);
  const double NV = 2.0 * 1024 * 50257;
  auto loss_bytes = [&](const CostLedger& l, double& largest_cast) {
    double b = 0;
    largest_cast = 0;
    for (const OpCost& op : l.ops()) {
      if (std::string_view(op.name) == "cross_entropy") b += op.bytes;
      if (std::string_view(op.name) == "cast") largest_cast = std::max(largest_cast, op.bytes);
    }
    return b;
  };
  double cast = 0;
  CHECK(loss_bytes(step_costs(c, 1, 0, 2, Device::cuda), cast) == Approx(6 * NV));
  CHECK(cast < 6 * NV);
  CHECK(loss_bytes(step_costs(c, 1, 0, 2, Device::cpu), cast) == Approx(8 * NV));  // f32, in place
  c.strategy = c.strategy.under(StrategyKind::dp);
  // Rank 0: both ranks' rows in place in f32, then its own rows' gradient rounded after the scatter.
  CHECK(loss_bytes(step_costs(c, 2, 0, 2, Device::cuda), cast) == Approx(2 * 8 * NV));
  CHECK(cast == Approx(6 * NV));
  c.strategy = c.strategy.under(StrategyKind::ddp);
  c.layout.dims.pp = 2;
  c.accum = 2;
  c.batch = 2 * 2;
  CHECK(loss_bytes(step_costs(c, 2, 1, 1, Device::cuda), cast) == Approx(2 * 6 * NV / 2));  // 2 micro-batches of 1
  CHECK(cast < 6 * NV / 2);
}

TEST_CASE("a GPU's ledger fuses GPT-2's biases and GELU into the products' epilogues; the CPU's does not",
          "[cost]") {
  // Per block: c_attn and c_fc (column-parallel) and both row-parallel projections at tp 1 carry
  // their bias in the product, c_fc its GELU too, and c_proj's backward product GELU's derivative.
  const CostLedger gpu = step_costs(gpt2_config(DType::bf16), 1, 0, 1, Device::cuda);
  const CostLedger cpu = step_costs(gpt2_config(DType::bf16), 1, 0, 1, Device::cpu);
  auto count = [](const CostLedger& l, std::string_view name) {
    int n = 0;
    for (const OpCost& c : l.ops()) n += std::string_view(c.name) == name;
    return n;
  };
  for (const char* fused : {"add_bias", "gelu_forward", "gelu_backward"}) {
    INFO(fused);
    CHECK(count(gpu, fused) == 0);
  }
  CHECK(count(cpu, "add_bias") == 12 * 4);
  CHECK(count(cpu, "gelu_forward") == 12);
  CHECK(count(cpu, "gelu_backward") == 12);
  CHECK(count(gpu, "gemm") == count(cpu, "gemm"));  // the same products
  CHECK(gemm_flops(gpu) == Approx(gemm_flops(cpu)));
  // An f32 run's products are f32: they keep their kernels (cuBLASLt's GELU may be approximate).
  const CostLedger gpu32 = step_costs(gpt2_config(DType::f32), 1, 0, 1, Device::cuda);
  CHECK(count(gpu32, "add_bias") == 12 * 4);
  CHECK(count(gpu32, "gelu_forward") == 12);
}

TEST_CASE("a GPU's weight-gradient products write the bias gradients of the bf16 gradients they read, into zeros",
          "[cost]") {
  // c_fc's and c_attn's output gradients arrive in bf16 (GELU's backward epilogue, the attention's
  // backward): their weight-gradient products write the bias gradient too (BGRADA) into the
  // unit's fresh f32 gradient workspace. Both projections' arrive in f32 and are rounded for the
  // products: their bias gradients still sum the f32 values (sum_rows), as the CPU's all do.
  auto count = [](const CostLedger& l, std::string_view name) {
    int n = 0;
    for (const OpCost& c : l.ops()) n += std::string_view(c.name) == name;
    return n;
  };
  TrainConfig gpu = gpt2_config(DType::bf16);  // CUDA's defaults with bf16 parameters
  gpu.spec.activation_dtype = DType::bf16;
  gpu.spec.attention = AttentionKernel::cudnn;
  CHECK(count(step_costs(gpu, 1, 0, 1, Device::cuda), "sum_rows") == 12 * 2);
  CHECK(count(step_costs(gpt2_config(DType::bf16), 1, 0, 1, Device::cpu), "sum_rows") == 12 * 4);
  // f32 gradients (--reduce-dtype f32) are the storage itself, summed into over micro-batches: no
  // zeros to write into, every bias gradient a sum added.
  TrainConfig f32_grads = gpu;
  f32_grads.strategy.precision.reduce_dtype = DType::f32;
  CHECK(count(step_costs(f32_grads, 1, 0, 1, Device::cuda), "sum_rows") == 12 * 4);
}

TEST_CASE("a GPU's compute copies widen what is read in f32 (norms, biases), not the projections' weights",
          "[cost]") {
  // A GPT-2 block holds 12 C^2 + 13 C parameters: the four projections' 12 C^2 weights, which the
  // GEMMs read in bf16 as stored, and 13 C of norms and biases, read in f32. The CPU widens the
  // whole block before its forward and its backward; a GPU only the 13 C (one cast_ranges each).
  // The CPU casts the updated f32 master copy into the bf16 parameters after the step; a GPU's
  // AdamW writes them in its own pass.
  const double C = 768, block = 12 * C * C + 13 * C, small = 13 * C;
  auto casts_of = [](const CostLedger& l, double elems) {
    int n = 0;
    for (const OpCost& c : l.ops()) n += std::string_view(c.name) == "cast" && c.bytes == elems * (2 + 4);
    return n;
  };
  const CostLedger cpu = step_costs(gpt2_config(DType::bf16), 1, 0, 1, Device::cpu);
  const CostLedger gpu = step_costs(gpt2_config(DType::bf16), 1, 0, 1, Device::cuda);
  CHECK(casts_of(cpu, block) == 12 * 3);
  CHECK(casts_of(gpu, block) == 0);
  CHECK(casts_of(gpu, small) == 12 * 2);
  // The embedding unit (wte, wpe): the CPU widens it for its forward and backward and for the tied
  // head's (which borrows wte), and casts it after the update; a GPU for its forward only (its
  // backward reads no parameter, the head's products read wte in bf16, AdamW writes it).
  const double embedding = static_cast<double>(gpt2_layout(model_preset("gpt2"))[0].numel);
  CHECK(casts_of(cpu, embedding) == 5);
  CHECK(casts_of(gpu, embedding) == 1);
}

// nn.Linear's backward reads its output gradient twice, in the input-gradient product and in the
// weight-gradient one. Where products round f32 operands to bf16 (a GPU), it is rounded once and
// both read that copy: two casts (dout, and the layer's f32 input for the weight gradient), not
// three. Where they do not (the CPU), nothing is rounded and nothing is allocated for it.
TEST_CASE("a GPU's linear backward rounds its output gradient once for both products", "[cost]") {
  const int64_t N = 64, IC = 32, OC = 48;
  ModelSpec spec = model_preset("tiny");
  for (Device target : {Device::cuda, Device::cpu}) {
    CostLedger ledger(target);
    auto be = make_meta_backend({}, &ledger);
    Pool pool(*be);
    Block dout = pool.alloc(DType::f32, N * OC, Category::workspace, "dout"),
          inp = pool.alloc(DType::f32, N * IC, Category::workspace, "inp"),
          w = pool.alloc(DType::bf16, OC * IC, Category::workspace, "w"),
          dw = pool.alloc(DType::f32, OC * IC, Category::workspace, "dw"),
          dinp = pool.alloc(DType::f32, N * IC, Category::workspace, "dinp");
    UnitContext c{*be, pool, spec, Batch{}, Checkpointing::none, TpContext{}};
    ledger.clear();
    const uint64_t before = pool.ledger().peak_total();
    blocks::linear_backward(c, dinp.view(DType::f32, {N, IC}), dw.view(DType::f32, {OC, IC}),
                            dout.view(DType::f32, {N, OC}), inp.view(DType::f32, {N, IC}),
                            w.view(DType::bf16, {OC, IC}), N);
    int casts = 0, gemms = 0;
    double cast_bytes = 0;
    for (const OpCost& op : ledger.ops()) {
      casts += std::string_view(op.name) == "cast";
      gemms += std::string_view(op.name) == "gemm";
      if (std::string_view(op.name) == "cast") cast_bytes += op.bytes;
    }
    INFO(device_name(target));
    CHECK(gemms == 2);
    if (target == Device::cuda) {
      CHECK(casts == 2);
      CHECK(cast_bytes == Approx(6.0 * (N * OC + N * IC)));  // read 4 bytes, write 2, each element once
      CHECK(pool.ledger().peak_total() == before + uint64_t(2 * N * OC));  // the rounded copy, freed after
    } else {
      CHECK(casts == 0);
      CHECK(pool.ledger().peak_total() == before);
    }
  }
}

// AdamW over a rank's share of each unit in one launch on a GPU (ops::adamw_update_segments): a
// GPT-2 124M step on one rank updates its 148 tensors in 14 launches, one per unit (the embedding,
// 12 blocks, the head holds only its norm: the tied wte is the embedding's), with every parameter's
// 16 FLOPs.
TEST_CASE("a GPU's AdamW updates each unit's tensors in one launch", "[cost]") {
  const CostLedger l = step_costs(gpt2_config(DType::bf16), 1, 0, 1, Device::cuda);
  int calls = 0, launches = 0;
  double flops = 0;
  for (const OpCost& op : l.ops())
    if (std::string_view(op.name) == "adamw_update") ++calls, launches += op.launches, flops += op.flops;
  CHECK(calls == 14);
  CHECK(launches == 14);
  CHECK(flops == Approx(16.0 * 124439808));
}
