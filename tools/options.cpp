#include "tools/options.hpp"

#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <tuple>

#include "src/core/outputs.hpp"
#include "src/core/suggest.hpp"
#include "src/core/units.hpp"
#include "src/model/family.hpp"
#include "src/model/hf_dir.hpp"
#include "src/model/resolve.hpp"
#include "src/checkpoint/checkpoint_format.hpp"
#include "src/train/sgemm_ceiling.hpp"
#include "tools/runtime.hpp"

namespace shardlab::cli {

void add_switch(Desc& d, const char* name, bool& value, const char* help) {
  d.add_options()(name,
                  po::value<bool>(&value)
                      ->default_value(value, value ? "true" : "false")
                      ->implicit_value(true, "")  // shown as the value name: "--flag [true|false] (=false)"
                      ->value_name("[true|false]"),
                  help);
}

// ---- run ----------------------------------------------------------------------------------------

void RunOptions::add(Desc& d, bool with_device, bool with_comm, const char* comm_note) {
  Desc g("run");
  g.add_options()("threads", po::value(&threads)->default_value(threads),
                  "CPU threads per rank; 0 = this node's idle cores / its ranks (at least 1; docs/strategies-and-mesh.md, \"Threads\")")(
      "cpu-gemm", po::value(&cpu_gemm)->default_value(cpu_gemm),
      "sgemm library of the cpu backend: auto (picked per product by the host's ISA and the product's shape; "
      "docs/performance.md, \"CPU GEMM\"), onednn or openblas (that one for every product)")(
      "collective-timeout", po::value(&collective_timeout)->default_value(collective_timeout),
      "seconds a rank may wait in one collective before the job ends (exit 5), naming the rank(s) that "
      "never reached it; 0 = off. Progress records live in $SHARDLAB_WATCHDOG_DIR (default /dev/shm): "
      "point it at a shared directory for jobs across nodes");
  if (with_device)
    g.add_options()("device", po::value(&device)->default_value(device), "cpu or cuda: the backend, where buffers live");
  if (with_comm)
    g.add_options()("comm", po::value(&comm)->default_value(comm),
                    fmt::format("collective transport: auto (mpi on the cpu; on cuda nccl when each rank on a node "
                                "has its own GPU, staged when ranks share one), mpi (host buffers), nccl (one rank "
                                "per GPU), staged (device buffers over MPI through host copies){}{}",
                                comm_note ? "; " : "", comm_note ? comm_note : "")
                        .c_str());
  d.add(g);
}

// ---- memory -------------------------------------------------------------------------------------

void MemoryOptions::add(Desc& d, bool with_levers, const char* lever_note) {
  Desc g("memory");
  g.add_options()("device-memory", po::value(&device_memory)->default_value(""),
                  "per-rank memory budget of the device tier (e.g. 2GiB); allocations past it fail with an "
                  "out-of-memory error that lists what is live. Empty = no budget (profile: marks what fits and "
                  "names the cheapest levers that do)")(
      "host-memory", po::value(&host_memory)->default_value(""),
      "per-rank budget of the host tier (what --offload keeps there; pinned memory on CUDA), as --device-memory. "
      "Empty = no budget");
  if (with_levers) {
    const std::string note = lever_note ? fmt::format(". {}", lever_note) : "";
    g.add_options()("activation-checkpointing", po::value(&checkpointing)->default_value(checkpointing),
                    ("none; attention (recompute the attention probabilities in backward); blocks (keep only each "
                     "block's input and run its forward again before its backward). Same results, less activation "
                     "memory" + note).c_str())(
        "offload", po::value(&offload)->default_value(offload),
        ("none; optimizer (zero1-3: f32 master weights and optimizer state on the host tier, the update runs on "
         "the host, reduced gradient shards are copied there as their reductions complete); params (zero3: the "
         "parameter shards on the host too, copied to the device just before their all-gather)" + note).c_str());
  }
  d.add(g);
}

PoolConfig MemoryOptions::pools(const Backend* be) const {
  PoolConfig pc;
  if (!device_memory.empty()) pc.budget = parse_bytes(device_memory);
  else if (be) pc.budget = be->device_memory().free;
  SHARD_REQUIRE(device_memory.empty() || pc.budget > 0,
                "--device-memory {}: expected a positive size (leave the option out for no budget)", device_memory);
  if (!host_memory.empty()) pc.host_budget = parse_bytes(host_memory);
  SHARD_REQUIRE(host_memory.empty() || pc.host_budget > 0,
                "--host-memory {}: expected a positive size (leave the option out for no budget)", host_memory);
  return pc;
}

// ---- strategy and mesh --------------------------------------------------------------------------

namespace {
void add_kind(Desc& g, std::string& kind, const char* note) {
  g.add_options()("strategy", po::value(&kind)->default_value(kind),
                  fmt::format("dp, ddp, zero1, zero2, zero3, or hsdp (zero3 with --dp-shard = ranks per node, from "
                              "MPI's shared-memory split or $SHARDLAB_RANKS_PER_NODE){}{}",
                              note ? "; " : "", note ? note : "").c_str());
}
void add_param_dtype(Desc& g, std::string& param, const char* note) {
  g.add_options()("param-dtype", po::value(&param)->default_value(param),
                  fmt::format("storage and all-gather dtype of parameters: f32, or bf16 with an f32 master copy beside "
                              "the optimizer{}{}", note ? "; " : "", note ? note : "").c_str());
}
void add_reduce_dtype(Desc& g, std::string& reduce) {
  g.add_options()("reduce-dtype", po::value(&reduce)->default_value(""),
                  "gradient storage and reduction dtype (default: the param dtype)");
}
}  // namespace

void StrategyOptions::add(Desc& d, StrategyConfig& s) {
  Desc g("strategy");
  add_kind(g, kind, nullptr);
  add_param_dtype(g, param, nullptr);
  add_reduce_dtype(g, reduce);
  g.add_options()("bucket-mb", po::value(&s.bucket_mb)->default_value(s.bucket_mb), "ddp: gradient bucket size in MiB");
  add_switch(g, "reshard-after-forward", s.reshard_after_forward,
             "zero3: free a unit's gathered parameters after its forward (true) or keep them for backward");
  g.add_options()("prefetch", po::value(&prefetch)->default_value(prefetch),
                  "zero3: units gathered ahead of use, or auto: as many as the device budget (--device-memory) leaves "
                  "room for in the predicted step, at most 1 (a run that fits with 0 fits with auto)")(
      "max-gathered", po::value(&s.max_gathered)->default_value(s.max_gathered),
      "zero3: most units gathered at once (0 = prefetch + 2)");
  d.add(g);
  Desc z("ZeRO++ (zero3; docs/strategies-and-mesh.md, \"ZeRO++\")");
  add_zeropp_levers(z, s.zeropp);
  z.add_options()(
      "ranks-per-node", po::value(&ranks_per_node)->default_value(0),
      "consecutive ranks that share a node (0 = one node holds every rank): hpZ and qgZ work node by node, and "
      "compare splits each row's bytes into intra- and inter-node by it")(
      "inter-node-gbs", po::value(&inter_node_gbs)->default_value(0),
      "emulate a network of this many GB/s between the nodes of --ranks-per-node on one machine: a collective over "
      "ranks on several nodes completes no sooner than its bus bytes at this rate after the rank's emulated link "
      "is free (0 = off; 0.01 to 1e6; for benchmarks)");
  d.add(z);
}

void StrategyOptions::add_zeropp_levers(Desc& d, ZeroPP& z) {
  add_switch(d, "zeropp", zeropp,
             "all three levers: --quantize-weights int8 --secondary-shard node --quantize-grads int4 (each may "
             "still be given otherwise)");
  d.add_options()("quantize-weights", po::value(&quantize_weights)->default_value(""),
                  "qwZ: none or int8: each rank's parameter shard block-quantized before the all-gather, dequantized "
                  "after (the shard the optimizer updates stays exact)")(
      "secondary-shard", po::value(&secondary_shard)->default_value(""),
      "hpZ: none or node: after a unit's forward each rank keeps its node's slice of the parameters (memory + "
      "unit / ranks on the node), so backward's all-gather stays inside the node")(
      "quantize-grads", po::value(&quantize_grads)->default_value(""),
      "qgZ: none, int4 or int8: the gradient reduce-scatter becomes an all-to-all of block-quantized gradients "
      "inside the node, summed there in f32, then one across the nodes (error feedback: --error-feedback)")(
      "quantize-block", po::value(&z.block)->default_value(z.block),
      "elements per f32 scale of the quantized blocks (a multiple of 8)");
  add_switch(d, "error-feedback", error_feedback,
             "qgZ: carry each rank's quantization error of its gradient into its next reduction (off by default: it "
             "holds a full f32 gradient per unit more per rank; needs --reduce-dtype f32; not kept in checkpoints)");
}

void StrategyOptions::apply_prefetch(StrategyConfig& s) const {
  if (prefetch == "auto") {
    s.prefetch = kPrefetchAuto;
    return;
  }
  char* end = nullptr;
  const long v = std::strtol(prefetch.c_str(), &end, 10);
  SHARD_REQUIRE(!prefetch.empty() && end && *end == '\0' && v >= 0 && v <= 1024,
                "--prefetch '{}': expected auto or 0 to 1024 units", prefetch);
  s.prefetch = static_cast<int>(v);
}

void StrategyOptions::apply_zeropp(StrategyConfig& s) const {
  auto pick = [this](const std::string& given, const char* all) { return !given.empty() ? given : zeropp ? all : "none"; };
  const std::string w = pick(quantize_weights, "int8"), h = pick(secondary_shard, "node"), g = pick(quantize_grads, "int4");
  SHARD_REQUIRE(w == "none" || w == "int8", "--quantize-weights '{}': expected none or int8", w);
  SHARD_REQUIRE(h == "none" || h == "node", "--secondary-shard '{}': expected none or node", h);
  SHARD_REQUIRE(g == "none" || g == "int4" || g == "int8", "--quantize-grads '{}': expected none, int4 or int8", g);
  s.zeropp.weight_bits = w == "int8" ? 8 : 0;
  s.zeropp.secondary = h == "node";
  s.zeropp.grad_bits = g == "none" ? 0 : g == "int4" ? 4 : 8;
  s.zeropp.error_feedback = error_feedback;
}

void StrategyOptions::add_kind_and_dtype(Desc& d, const char* kind_note, const char* dtype_note) {
  Desc g("strategy");
  add_kind(g, kind, kind_note);
  add_param_dtype(g, param, dtype_note);
  d.add(g);
}

void StrategyOptions::add_dtypes(Desc& d, const char* dtype_note) {
  Desc g("strategy");
  add_param_dtype(g, param, dtype_note);
  add_reduce_dtype(g, reduce);
  d.add(g);
}

void StrategyOptions::apply_dtypes(StrategyConfig& s) const {
  s.precision.param_dtype = parse_dtype(param);
  s.precision.reduce_dtype = reduce.empty() ? s.precision.param_dtype : parse_dtype(reduce);
}

// ---- device rates -------------------------------------------------------------------------------

void DeviceRateOptions::add(Desc& d, const std::string& default_gpu) {
  gpu = default_gpu;
  Achievable& a = achievable;
  Desc g("device rates (the time model)");
  g.add_options()("gpu", po::value(&gpu)->default_value(gpu),
                  fmt::format("device preset: {} (h100, a100: the 80 GB parts)", fmt::join(device_preset_names(), ", "))
                      .c_str())(
      "peak-tflops", po::value(&peak)->default_value(0), "dense bf16 TFLOP/s per device (0 = the preset's)")(
      "hbm-gbs", po::value(&hbm)->default_value(0), "HBM GB/s (0 = the preset's)")(
      "nvlink-gbs", po::value(&nvlink)->default_value(0), "NVLink GB/s per device and direction (0 = the preset's)")(
      "network-gbs", po::value(&network)->default_value(0), "GB/s between nodes per device (0 = the preset's NICs)")(
      "host-link-gbs", po::value(&host_link)->default_value(0), "GB/s device <-> host, achieved (0 = the preset's)")(
      "gemm-fraction", po::value(&a.gemm)->default_value(a.gemm, fmt::format("{:g}", a.gemm)),
      "share of the peak a large GEMM reaches")(
      "gemm-knee", po::value(&a.knee)->default_value(a.knee, fmt::format("{:g}", a.knee)),
      "the GEMM dimension that halves it")(
      "memory-fraction", po::value(&a.memory)->default_value(a.memory, fmt::format("{:g}", a.memory)),
      "share of HBM bandwidth element-wise work reaches")(
      "nvlink-fraction", po::value(&a.intra)->default_value(a.intra, fmt::format("{:g}", a.intra)),
      "NCCL bus bandwidth's share of NVLink")(
      "network-fraction", po::value(&a.inter)->default_value(a.inter, fmt::format("{:g}", a.inter)),
      "NCCL bus bandwidth's share of the network");
  d.add(g);
}

DeviceRates DeviceRateOptions::rates() const {
  SHARD_REQUIRE(peak >= 0 && hbm >= 0 && nvlink >= 0 && network >= 0 && host_link >= 0,
                "--peak-tflops {} --hbm-gbs {} --nvlink-gbs {} --network-gbs {} --host-link-gbs {}: expected 0 (the "
                "preset) or positive", peak, hbm, nvlink, network, host_link);
  const Achievable& a = achievable;
  for (auto [flag, f] : {std::pair{"--gemm-fraction", a.gemm}, std::pair{"--memory-fraction", a.memory},
                         std::pair{"--nvlink-fraction", a.intra}, std::pair{"--network-fraction", a.inter}})
    SHARD_REQUIRE(f > 0 && f <= 1, "{} {}: expected a share above 0, at most 1", flag, f);
  SHARD_REQUIRE(a.knee >= 0, "--gemm-knee {}: expected 0 or more", a.knee);
  DeviceRates r = device_rates(device_preset(gpu));
  if (peak > 0) r.flops = {peak * 1e12, "given (--peak-tflops)"};
  if (hbm > 0) r.hbm = {hbm * 1e9, "given (--hbm-gbs)"};
  if (nvlink > 0) r.intra = {nvlink * 1e9, "given (--nvlink-gbs)"};
  if (network > 0) r.inter = {network * 1e9, "given (--network-gbs)"};
  if (host_link > 0) r.host = {host_link * 1e9, "given (--host-link-gbs)"};
  return r;
}

// ---- training -----------------------------------------------------------------------------------

void TrainOptions::add(Desc& d, TrainConfig& cfg) {
  run.add(d, true, true);
  memory.add(d, true);
  model.add(d);
  strategy.add(d, cfg.strategy);
  mesh.add(d);
  Desc g("training");
  g.add_options()("data", po::value(&cfg.data)->default_value(cfg.data),
                  "token source: synthetic (embedded), an llm.c .bin shard (memory-mapped), or a text file (tokenized "
                  "by --tokenizer, else its bytes are the tokens); several files as one stream: a.bin,b.bin or "
                  "'dir/*.bin'");
  add_steps(g, cfg.steps, "optimizer steps");
  add_batch(g, cfg.batch, "global batch in sequences (ranks x micro-batch x accum)");
  g.add_options()("accum", po::value(&cfg.accum)->default_value(cfg.accum), "gradient-accumulation micro-steps per step")(
      "micro-batches", po::value(&micro_batches)->default_value(0),
      "--accum's other name: under --pp the accumulation micro-steps are the pipeline's micro-batches (0 = --accum)");
  add_optimizer(g, cfg, schedule, optimizer);
  add_seed(g, seed, "initialisation seed");
  add_init(g, cfg.init,
           "start from Hugging Face weights: an HF model directory (its config.json gives the model, so no --model "
           "or size flags; model.safetensors or an index and shards) or a .safetensors file with HF names (its shape "
           "from --model and the overrides)");
  add_switch(g, "shuffle", cfg.shuffle,
             "permute the sequences of each epoch (a pass over the stream) from (--seed, epoch); batches run on over "
             "epoch boundaries, so none is padded and no sequence is dropped");
  g.add_options()("val-data", po::value(&cfg.val_data)->default_value(""), "validation token source (formats as --data)")(
      "val-fraction", po::value<double>()->notifier([&cfg](double f) {
        SHARD_REQUIRE(f > 0 && f < 1, "--val-fraction {}: expected a fraction between 0 and 1 (exclusive)", f);
        cfg.val_fraction = f;
      }),
      "hold out the last F of the token stream for validation (never trained on)")(
      "val-every", po::value(&cfg.val_every)->default_value(0),
      "validation loss every K steps (0 = at the end only, when there is a validation source)")(
      "val-batches", po::value(&cfg.val_batches)->default_value(cfg.val_batches),
      "global batches of the validation set per evaluation (at most the whole batches it holds)");
  add_switch(g, "check-collectives", cfg.check_collectives,
             "debug: compare each collective's fingerprint (sequence, op, count, dtype, call site) across ranks before "
             "issuing it, and stop naming the first diverging rank and both call sites instead of hanging");
  d.add(g);
}

// A resumed run continues the checkpoint's model: without model flags it takes the manifest's spec,
// which also holds what no flag expresses (an HF config's rope scaling, norm epsilon, tied head).
// Flags that are given make the spec as for a fresh run, and loading checks it against the
// checkpoint (an error naming the field, both values and both models).
std::optional<ModelSpec> TrainOptions::resume_spec(TrainConfig& cfg) const {
  if (cfg.resume.empty() || !cfg.init.empty() || model.given()) return std::nullopt;
  const std::string from = cfg.resume == "auto" ? latest_checkpoint(cfg.save_dir) : cfg.resume;
  if (from.empty()) return std::nullopt;  // --resume auto with nothing saved yet: a fresh run
  ModelSpec s = read_manifest(from).model;
  cfg.model_origin = fmt::format("the checkpoint's, '{}' (no --model or size flag given)", from);
  return s;
}

void TrainOptions::finish(TrainConfig& cfg, const Context& ctx, int world) const {
  SHARD_REQUIRE(seed >= 0, "--seed {}: expected a non-negative integer", seed);
  cfg.seed = static_cast<uint64_t>(seed);
  // How it computes comes from the flags, never from a checkpoint.
  cfg.spec = model.computing(resume_spec(cfg).value_or(model.spec(cfg.init)));
  if (const std::string unapplied = hf_config_unapplied(cfg.init); !unapplied.empty()) cfg.model_origin = unapplied;
  const bool hsdp = strategy.kind == "hsdp";  // FSDP's HYBRID_SHARD: zero3 sharded within each node
  cfg.strategy.kind = hsdp ? StrategyKind::zero3 : parse_strategy(strategy.kind, {"hsdp"});
  cfg.layout = mesh.layout(world, hsdp ? ranks_per_node(ctx) : 0);
  SHARD_REQUIRE(micro_batches >= 0, "--micro-batches {}: expected a positive count (0 = --accum)", micro_batches);
  if (micro_batches > 0) {
    SHARD_REQUIRE(cfg.accum == 1 || cfg.accum == micro_batches,
                  "--micro-batches {} and --accum {}: one count under two names (the pipeline's micro-batches are the "
                  "accumulation micro-steps); give one", micro_batches, cfg.accum);
    cfg.accum = micro_batches;
  }
  cfg.strategy.offload = parse_offload(memory.offload);
  strategy.apply_dtypes(cfg.strategy);
  strategy.apply_zeropp(cfg.strategy);
  strategy.apply_prefetch(cfg.strategy);
  cfg.layout.ranks_per_node = node_ranks_for_links(ctx, world, strategy.ranks_per_node);
  // Below 0.01 GB/s (10 MB/s, slower than any cluster's network) a step of a few MB across nodes
  // would be paced for hours: refused rather than a first step that never ends.
  SHARD_REQUIRE(strategy.inter_node_gbs == 0 || (strategy.inter_node_gbs >= 0.01 && strategy.inter_node_gbs <= 1e6),
                "--inter-node-gbs {}: expected 0 (off) or a rate from 0.01 to 1e6 GB/s (at {} GB/s one MB across "
                "nodes takes {:.3g} s)", strategy.inter_node_gbs, strategy.inter_node_gbs,
                strategy.inter_node_gbs > 0 ? 1e-3 / strategy.inter_node_gbs : 0.0);
  cfg.inter_node_gbs = strategy.inter_node_gbs;
  cfg.optim.kind = parse_optimizer(optimizer);
  cfg.schedule.kind = parse_schedule(schedule);
  cfg.checkpointing = parse_checkpointing(memory.checkpointing);
  cfg.device = parse_device(run.device);
  cfg.spec.activation_dtype = model.activation_dtype_on(cfg.device, cfg.strategy.precision.param_dtype);
  cfg.spec.attention = model.attention_on(cfg.spec, cfg.device, cfg.strategy.precision.param_dtype,
                                          cfg.layout.dims.cp > 1);
  cfg.comm = comm_for(run.comm, cfg.device, ctx);
}

std::unique_ptr<Backend> TrainOptions::backend(const Context& ctx, const TrainConfig& cfg) const {
  RunOptions r = run;
  if (r.threads == 0 && parse_device(r.device) == Device::cpu && step_too_small_for_threads(cfg, ctx.mpi.world()))
    r.threads = 1;
  return make_device_backend(parse_device(r.device), r, ctx);
}

// ---- report -------------------------------------------------------------------------------------

void ReportOptions::check(const char* when) const {
  for (const auto& [path, flag] : {std::pair{&json, "--json"}, std::pair{&html, "--html"}, std::pair{&trace, "--trace"}})
    if (!path->empty()) probe_output_file(*path, flag, when);
}

void ReportOptions::add(Desc& d, const char* json_what, const char* html_what, const char* trace_what) {
  Desc g("report");
  if (json_what) g.add_options()("json", po::value(&json)->default_value(""), json_what);
  if (html_what) g.add_options()("html", po::value(&html)->default_value(""), html_what);
  if (trace_what) g.add_options()("trace", po::value(&trace)->default_value(""), trace_what);
  d.add(g);
}

// ---- single shared flags ------------------------------------------------------------------------

template <class T>
void add_steps(Desc& d, T& steps, const char* help) {
  d.add_options()("steps", po::value(&steps)->default_value(steps), help);
}
template void add_steps(Desc&, int&, const char*);
template void add_steps(Desc&, int64_t&, const char*);

void add_batch(Desc& d, int64_t& batch, const char* help) {
  d.add_options()("batch", po::value(&batch)->default_value(batch), help);
}
void add_warmup(Desc& d, int& calls, const char* help) {
  d.add_options()("warmup", po::value(&calls)->default_value(calls), help);
}
void add_seed(Desc& d, int64_t& seed, const char* help) {
  d.add_options()("seed", po::value(&seed)->default_value(seed), help);
}
void add_init(Desc& d, std::string& path, const char* help) {
  d.add_options()("init", po::value(&path)->default_value(""), help);
}
void add_resume(Desc& d, std::string& path, const char* help) {
  d.add_options()("resume", po::value(&path)->default_value(""), help);
}
void add_tokenizer(Desc& d, std::string& dir, const char* purpose) {
  d.add_options()("tokenizer", po::value(&dir)->default_value(""),
                  fmt::format("a directory with a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, "
                              "SmolLM), GPT-2's encoder.json and vocab.bpe, or tiktoken ranks (gpt2.tiktoken, which "
                              "scripts/fetch-gpt2-tokenizer.sh DIR fetches, or Llama 3's tokenizer.model): {} as "
                              "text", purpose).c_str());
}
void add_dtype(Desc& d, std::string& dtype, const char* help) {
  d.add_options()("dtype", po::value(&dtype)->default_value(dtype), help);
}
void add_world(Desc& d, int& world, const char* help) {
  d.add_options()("world", po::value(&world)->default_value(world), help);
}
void add_strategies(Desc& d, std::string& list, const char* help) {
  d.add_options()("strategies", po::value(&list)->default_value(list), help);
}
std::vector<StrategyKind> strategies_for(const std::string& list, const po::variables_map& given,
                                         const ParallelDims& dims, const char* command, int rank) {
  std::vector<StrategyKind> kinds = parse_strategy_list(list);
  // dp, the single-master baseline, keeps the whole model on rank 0: it takes no other axis.
  const struct {
    int degree;
    const char* flag;
    const char* what;
  } axes[] = {{dims.pp, "pp", "pipeline"},
              {dims.cp, "cp", "context parallelism"},
              {dims.ep, "ep", "expert parallelism"},
              {dims.tp, "tp", "tensor parallelism"}};
  const auto used = std::find_if(std::begin(axes), std::end(axes), [](const auto& a) { return a.degree > 1; });
  if (used == std::end(axes) || std::find(kinds.begin(), kinds.end(), StrategyKind::dp) == kinds.end()) return kinds;
  const std::string axis = fmt::format("--{} {}", used->flag, used->degree);
  SHARD_REQUIRE(!given.count("strategies") || given["strategies"].defaulted(),
                "--strategies {} with {}: dp, the single-master baseline, keeps the whole model on rank 0 and "
                "takes no {}; leave it out",
                list, axis, used->what);
  std::erase(kinds, StrategyKind::dp);
  if (rank == 0)
    std::printf("shardlab %s: %s: leaving out dp (the single-master baseline takes no %s)\n", command, axis.c_str(),
                used->what);
  return kinds;
}

void add_measure(Desc& d, bool& on, const char* help) { add_switch(d, "measure", on, help); }
void add_measure_steps(Desc& d, int& steps, const char* help) {
  d.add_options()("measure-steps", po::value(&steps)->default_value(steps), help);
}

}  // namespace shardlab::cli
