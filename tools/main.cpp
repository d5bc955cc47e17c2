// main.cpp — the shardlab command line.
//
//   shardlab train               train GPT-2 under any strategy on any number of ranks
//   shardlab compare             every strategy on the same model, data and seed, side by side
//   shardlab profile             the memory profile: every strategy x category per rank, predicted and measured
//   shardlab sample              text from a model file or a checkpoint, on one rank
//   shardlab export              a checkpoint as one HF-named safetensors file
//   shardlab info                runtime facts per rank: build, backend, threads, ranks per node
//   shardlab bench-collectives   collective benchmark (nccl-tests table) over mpi or sim
//   shardlab bench-gemm          sgemm GFLOP/s of each CPU library on GPT-2 products, and the pick
//   shardlab bench-train         training-step throughput beside the sgemm ceiling (a lever against none)
//   shardlab bench-adamw         the host optimizer of --offload against STREAM's triad
//
// Every command runs on any number of ranks: `mpirun -np N shardlab ...` or `shardlab ... --nproc N`.
// MPI appears in this file only: commands get a ProcessGroup and open communicators through it.
//
// Exit codes (README, "Exit codes"): 0 success; 1 bad input (an option, a file, a size: one line
// naming the value); 2 internal fault (file:line and the rank; every rank of the job ends);
// 3 wrong results (compare's losses disagree, bench-collectives found wrong elements); 4 out of
// memory (a rank's --device-memory budget, with what was live); 5 a collective did not complete
// within --collective-timeout (the ranks that never reached it are named).
#include <boost/program_options.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <signal.h>
#include <unistd.h>
#include <fstream>
#include <sstream>
#include <iostream>

#include "benchmarks/adamw_bench.hpp"
#include "benchmarks/calibrate.hpp"
#include "benchmarks/collectives.hpp"
#include "benchmarks/gemm_bench.hpp"
#include "benchmarks/train_bench.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/comm/nccl_comm.hpp"
#include "src/comm/staged_comm.hpp"
#include "src/comm/mpi_runtime.hpp"
#include "src/comm/sim_comm.hpp"
#include "src/comm/watchdog.hpp"
#include "src/core/stats.hpp"
#include "src/core/units.hpp"
#include "src/model/family.hpp"
#include "src/train/checkpoint.hpp"
#include "src/train/compare.hpp"
#include "src/train/predict.hpp"
#include "src/train/plan.hpp"
#include "src/train/profile.hpp"
#include "src/train/trainer.hpp"
#include "tools/launch.hpp"

namespace po = boost::program_options;
using namespace shardlab;

namespace {

const char* kUsage =
    "usage: shardlab <command> [options] [--nproc N]\n"
    "\n"
    "commands:\n"
    "  train               train GPT-2 under a strategy (dp, ddp, zero1-3) on any number of ranks\n"
    "  compare             train the same model under each strategy; loss agreement, memory, time, traffic\n"
    "  profile             predicted (and measured) memory per rank, per category, per strategy, any world size\n"
    "  plan                the fastest configuration that fits N ranks: every strategy and lever, predicted (and measured)\n"
    "  export              a checkpoint as one HF-named safetensors file, one tensor in memory at a time\n"
    "  sample              generate text from an --init file or a checkpoint (prompt, temperature, top-k, seed)\n"
    "  info                runtime facts of every rank: build, backend, threads, ranks per node\n"
    "  bench-collectives   collective benchmark, nccl-tests style: size sweep, time, algbw, busbw, #wrong\n"
    "  bench-gemm          sgemm GFLOP/s of each CPU library on a GPT-2 step's products, and the one picked\n"
    "  bench-train         training-step tokens/s and GFLOP/s beside the sgemm ceiling; a memory lever against none\n"
    "  bench-adamw         the host optimizer (--offload) against STREAM's triad bandwidth, same threads\n"
    "\n"
    "every command accepts:\n"
    "  --nproc N           start N ranks through mpirun (same as `mpirun -np N shardlab ...`)\n"
    "  --help              the command's options\n";

// Options every rank-running command shares.
struct CommonOptions {
  int threads = 0;
  std::string cpu_gemm = "auto";
  std::string device_memory, host_memory;
  double collective_timeout = 600;
};

void add_common(po::options_description& d, CommonOptions& c) {
  d.add_options()("help,h", "show this command's options")(
      "threads", po::value(&c.threads)->default_value(0),
      "CPU threads per rank; 0 = usable cores / ranks on this node")(
      "cpu-gemm", po::value(&c.cpu_gemm)->default_value(c.cpu_gemm),
      "sgemm library of the cpu backend: auto (picked per product by the host's ISA and the product's shape; "
      "README, \"CPU GEMM\"), onednn or openblas (that one for every product)")(
      "device-memory", po::value(&c.device_memory)->default_value(""),
      "per-rank memory budget of the device tier (e.g. 2GiB); allocations past it fail with an out-of-memory "
      "error that lists what is live. Empty = no budget")(
      "host-memory", po::value(&c.host_memory)->default_value(""),
      "per-rank budget of the host tier (what --offload keeps there; pinned memory on CUDA), as --device-memory. "
      "Empty = no budget")(
      "collective-timeout", po::value(&c.collective_timeout)->default_value(c.collective_timeout),
      "seconds a rank may wait in one collective before the job ends (exit 5), naming the rank(s) that "
      "never reached it; 0 = off. Progress records live in $SHARDLAB_WATCHDOG_DIR (default /dev/shm): "
      "point it at a shared directory for jobs across nodes");
}

// Parses args for one command; returns false (after printing help on rank 0) when --help was given.
bool parse(const std::vector<std::string>& args, po::options_description& desc, const MpiRuntime& mpi,
           const char* synopsis) {
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw InputError(fmt::format("{} (see `shardlab {} --help`)", e.what(), synopsis));
  }
  if (vm.count("help")) {
    if (mpi.rank() == 0) std::cout << "usage: shardlab " << synopsis << " [options]\n\n" << desc << "\n";
    return false;
  }
  return true;
}

std::unique_ptr<Backend> make_cpu(const CommonOptions& c, const MpiRuntime& mpi) {
  BackendConfig bc;
  bc.threads = c.threads;
  bc.cpu_gemm = c.cpu_gemm;
  bc.local_ranks = mpi.local_size();
  bc.local_rank = mpi.local_rank();
  SHARD_REQUIRE(c.threads >= 0, "--threads {}: expected 0 (automatic) or a positive count", c.threads);
  return make_cpu_backend(bc);
}

// The backend of --device: the cpu one, or the CUDA one on this rank's local GPU.
std::unique_ptr<Backend> make_device_backend(Device device, const CommonOptions& c, const MpiRuntime& mpi) {
  if (device != Device::cuda) return make_cpu(c, mpi);
  BackendConfig bc;
  bc.threads = c.threads;  // of its host backend
  bc.cpu_gemm = c.cpu_gemm;
  bc.local_rank = mpi.local_rank();
  bc.local_ranks = mpi.local_size();
  return make_cuda_backend(bc);
}

// The budgets of a rank's two tiers. On a GPU an empty --device-memory means the device's free
// memory (once the backend holds its context), so running out is shardlab's out-of-memory error,
// listing what is live, rather than the driver's.
PoolConfig pool_config(const CommonOptions& c, const Backend* be = nullptr) {
  PoolConfig pc;
  if (!c.device_memory.empty()) pc.budget = parse_bytes(c.device_memory);
  else if (be) pc.budget = be->device_memory().free;
  SHARD_REQUIRE(c.device_memory.empty() || pc.budget > 0,
                "--device-memory {}: expected a positive size (leave the option out for no budget)", c.device_memory);
  if (!c.host_memory.empty()) pc.host_budget = parse_bytes(c.host_memory);
  SHARD_REQUIRE(c.host_memory.empty() || pc.host_budget > 0,
                "--host-memory {}: expected a positive size (leave the option out for no budget)", c.host_memory);
  return pc;
}

// Exit codes: see the table at the top of this file.
enum ExitCode : int { kOk = 0, kBadInput = 1, kInternal = 2, kWrongResults = 3, kOutOfMemory = 4 };

// Command-line strings that become enums once parsed (StrategyConfig keeps only the enums).
struct StrategyStrings {
  std::string strategy = "ddp", param = "f32", reduce = "", offload = "none";
};

// The world's communicator over `kind`'s transport (resolved: see resolve_comm); mpi carries host
// buffers, nccl and staged device buffers (staged also host ones, through the same copies).
ProcessGroup world_group(const MpiRuntime& mpi, CommKind kind = CommKind::mpi) {
  return {mpi.rank(), mpi.world(), [kind](Pool& pool) -> std::unique_ptr<Communicator> {
            switch (kind) {
              case CommKind::nccl: return make_nccl_communicator(MPI_COMM_WORLD, pool.backend());
              case CommKind::staged: return make_staged_communicator(MPI_COMM_WORLD, pool.backend());
              case CommKind::automatic:
              case CommKind::mpi: break;
            }
            return make_mpi_communicator(MPI_COMM_WORLD, pool);
          }};
}

// --comm for a backend on `device`: the transport this rank uses.
CommKind comm_for(const std::string& comm, Device device, const MpiRuntime& mpi) {
  return resolve_comm(parse_comm(comm), device, mpi.local_size(), device == Device::cuda ? cuda_device_count() : 0);
}

// Job directories whose owner (rank 0 of a job that was killed) is gone, left in a node-local base.
void remove_dead_watchdog_dirs(const std::string& base) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(base, ec)) {
    if (e.path().filename().string().rfind("shardlab-watchdog-", 0) != 0) continue;
    long pid = 0;
    std::ifstream(e.path() / "owner") >> pid;
    // No owner: a job starting right now (rank 0 writes it just after creating the directory), or,
    // a minute on, one that never will.
    auto age = std::filesystem::file_time_type::clock::now() - std::filesystem::last_write_time(e.path(), ec);
    bool dead = pid > 0 ? ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH : !ec && age > std::chrono::minutes(1);
    if (dead) std::filesystem::remove_all(e.path(), ec);
  }
}

// --collective-timeout: rank 0 names a fresh job directory for the progress records (every rank
// creates it on its own node), then each rank starts its watchdog.
void start_watchdog(const MpiRuntime& mpi, double timeout_s) {
  SHARD_REQUIRE(timeout_s >= 0 && timeout_s <= 1e7, "--collective-timeout {}: expected 0 (off) or a number of seconds",
                timeout_s);
  if (timeout_s == 0) return;
  auto meta = make_meta_backend();
  Pool pool(*meta);
  auto comm = world_group(mpi).connect(pool);
  std::string dir;
  if (mpi.rank() == 0) {
    const char* env = std::getenv("SHARDLAB_WATCHDOG_DIR");
    std::string base = env && *env ? env : (std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp");
    if (!(env && *env)) remove_dead_watchdog_dirs(base);  // node-local: owners' pids are meaningful
    std::string tmpl = base + "/shardlab-watchdog-XXXXXX";
    SHARD_REQUIRE(::mkdtemp(tmpl.data()) != nullptr, "--collective-timeout: cannot create a directory under '{}': {}",
                  base, std::strerror(errno));
    dir = tmpl;
    std::ofstream(dir + "/owner") << ::getpid() << "\n";
  }
  dir = comm->all_gather_strings(dir)[0];
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // ranks on other nodes
  Watchdog::start(dir, mpi.rank(), mpi.world(), timeout_s);
}

// Ranks per node: MPI's shared-memory split, or $SHARDLAB_RANKS_PER_NODE, which lets one machine
// pretend to be several nodes (tests, rehearsals).
int ranks_per_node(const MpiRuntime& mpi) {
  const char* v = std::getenv("SHARDLAB_RANKS_PER_NODE");
  if (!v || !*v) return mpi.local_size();
  char* end = nullptr;
  const long k = std::strtol(v, &end, 10);
  SHARD_REQUIRE(end && *end == '\0' && k >= 1 && k <= (1 << 20), "SHARDLAB_RANKS_PER_NODE='{}': expected a positive "
                "number of ranks", v);
  return static_cast<int>(k);
}

void add_strategy_options(po::options_description& d, StrategyConfig& s, StrategyStrings& dt) {
  d.add_options()("strategy", po::value(&dt.strategy)->default_value(dt.strategy),
                  "dp, ddp, zero1, zero2, zero3, or hsdp (zero3 with --shard-group = ranks per node, from MPI's "
                  "shared-memory split or $SHARDLAB_RANKS_PER_NODE)")(
      "param-dtype", po::value(&dt.param)->default_value(dt.param),
      "storage and all-gather dtype of parameters: f32, or bf16 with an f32 master copy beside the optimizer")(
      "reduce-dtype", po::value(&dt.reduce)->default_value(""), "gradient storage and reduction dtype (default: the param dtype)")(
      "bucket-mb", po::value(&s.bucket_mb)->default_value(s.bucket_mb), "ddp: gradient bucket size in MiB")(
      "reshard-after-forward", po::value(&s.reshard_after_forward)->default_value(true),
      "zero3: free a unit's gathered parameters after its forward (true) or keep them for backward")(
      "prefetch", po::value(&s.prefetch)->default_value(s.prefetch), "zero3: units gathered ahead of use")(
      "max-gathered", po::value(&s.max_gathered)->default_value(0),
      "zero3: most units gathered at once (0 = prefetch + 2)")(
      "shard-group", po::value(&s.shard_group)->default_value(0),
      "zero1-3, hybrid sharding: shard the state within groups of S consecutive ranks and replicate it across the "
      "world / S groups (gradients reduce-scattered in the group, then all-reduced across groups); S must divide "
      "the world. 0 = the whole world")(
      "offload", po::value(&dt.offload)->default_value(dt.offload),
      "none; optimizer (zero1-3: f32 master weights and optimizer state on the host tier, the update runs on the "
      "host, reduced gradient shards are copied there as their reductions complete); params (zero3: the parameter "
      "shards on the host too, copied to the device just before their all-gather)");
}

// Model shape: a preset, with any of --layers/--dim/--heads/--seq/--vocab overriding it.
struct ModelOptions {
  std::string preset = "small";
  int64_t layers = 0, dim = 0, heads = 0, seq = 0, vocab = 0;
  void add(po::options_description& d) {
    d.add_options()("model", po::value(&preset)->default_value(preset),
                    "preset: tiny, small, gpt2, gpt2-medium, gpt2-large, gpt2-xl")(
        "layers", po::value(&layers)->default_value(0), "transformer blocks L (0 = the preset's)")(
        "dim", po::value(&dim)->default_value(0), "channels C (0 = the preset's)")(
        "heads", po::value(&heads)->default_value(0), "attention heads H (0 = the preset's)")(
        "seq", po::value(&seq)->default_value(0), "sequence length T, also the model's positions (0 = the preset's)")(
        "vocab", po::value(&vocab)->default_value(0), "vocabulary V (0 = the preset's)");
  }
  ModelSpec spec() const {
    ModelSpec s = model_preset(preset);
    bool custom = false;
    for (auto [field, value] : {std::pair{&s.layers, layers}, std::pair{&s.dim, dim}, std::pair{&s.heads, heads},
                                std::pair{&s.seq, seq}, std::pair{&s.vocab, vocab}}) {
      SHARD_REQUIRE(value >= 0, "model dimensions must be positive, got {}", value);
      if (value > 0 && value != *field) {
        *field = value;
        custom = true;
      }
    }
    if (custom) s.name = preset + "+custom";
    s.validate();
    return s;
  }
};

// Options of a training run, shared by train and compare.
struct TrainOptions {
  ModelOptions model;
  StrategyStrings dtypes;
  std::string device = "cpu", schedule = "cosine", optimizer = "adamw", checkpointing = "none", comm = "auto";
  int64_t seed = 1337;
  void add(po::options_description& desc, TrainConfig& cfg) {
    model.add(desc);
    desc.add_options()("data", po::value(&cfg.data)->default_value(cfg.data),
                       "token source: synthetic (embedded), an llm.c .bin shard, or any file as bytes")(
        "steps", po::value(&cfg.steps)->default_value(cfg.steps), "optimizer steps")(
        "batch", po::value(&cfg.batch)->default_value(cfg.batch),
        "global batch in sequences (ranks x micro-batch x accum)")(
        "accum", po::value(&cfg.accum)->default_value(cfg.accum), "gradient-accumulation micro-steps per step")(
        "lr", po::value(&cfg.schedule.lr)->default_value(1e-3f, "1e-3"), "peak learning rate")(
        "schedule", po::value(&schedule)->default_value(schedule), "constant or cosine")(
        "warmup-steps", po::value(&cfg.schedule.warmup_steps)->default_value(10), "linear warmup steps")(
        "min-lr-frac", po::value(&cfg.schedule.min_lr_frac)->default_value(0.1f, "0.1"),
        "cosine ends at lr * this")(
        "optimizer", po::value(&optimizer)->default_value(optimizer), "adamw or sgd")(
        "activation-checkpointing", po::value(&checkpointing)->default_value(checkpointing),
        "none; attention (recompute the attention probabilities in backward); blocks (keep only each block's "
        "input and run its forward again before its backward). Same results, less activation memory")(
        "weight-decay", po::value(&cfg.optim.weight_decay)->default_value(0.1f, "0.1"),
        "decoupled weight decay, on tensors with >= 2 dims only")(
        "beta1", po::value(&cfg.optim.beta1)->default_value(0.9f, "0.9"), "AdamW beta1")(
        "beta2", po::value(&cfg.optim.beta2)->default_value(0.95f, "0.95"), "AdamW beta2")(
        "eps", po::value(&cfg.optim.eps)->default_value(1e-8f, "1e-8"), "AdamW epsilon")(
        "momentum", po::value(&cfg.optim.momentum)->default_value(0.9f, "0.9"), "SGD momentum")(
        "grad-clip", po::value(&cfg.grad_clip)->default_value(1.f, "1.0"), "global gradient-norm clip (0 = off)")(
        "seed", po::value(&seed)->default_value(seed), "initialisation seed")(
        "device", po::value(&device)->default_value(device), "cpu or cuda")(
        "comm", po::value(&comm)->default_value(comm),
        "collective transport: auto (mpi on the cpu; on cuda nccl when each rank on a node has its own GPU, staged "
        "when ranks share one), mpi (host buffers), nccl (one rank per GPU), staged (device buffers over MPI "
        "through host copies)")(
        "init", po::value(&cfg.init)->default_value(""), "start from this safetensors file (HF GPT-2 names)")(
        "shuffle", po::bool_switch(&cfg.shuffle),
        "permute the sequences of each epoch (a pass over the stream) from (--seed, epoch); batches run on over "
        "epoch boundaries, so none is padded and no sequence is dropped")(
        "val-data", po::value(&cfg.val_data)->default_value(""), "validation token source (formats as --data)")(
        "val-fraction", po::value<double>()->notifier([&cfg](double f) {
          SHARD_REQUIRE(f > 0 && f < 1, "--val-fraction {}: expected a fraction between 0 and 1 (exclusive)", f);
          cfg.val_fraction = f;
        }),
        "hold out the last F of the token stream for validation (never trained on)")(
        "val-every", po::value(&cfg.val_every)->default_value(0),
        "validation loss every K steps (0 = at the end only, when there is a validation source)")(
        "val-batches", po::value(&cfg.val_batches)->default_value(cfg.val_batches),
        "global batches of the validation set per evaluation (at most the whole batches it holds)")(
        "check-collectives", po::bool_switch(&cfg.check_collectives),
        "debug: compare each collective's fingerprint (sequence, op, count, dtype, call site) across ranks before "
        "issuing it, and stop naming the first diverging rank and both call sites instead of hanging");
    add_strategy_options(desc, cfg.strategy, dtypes);
  }
  // After parsing: fills what the options could not write directly.
  void finish(TrainConfig& cfg, const MpiRuntime& mpi) const {
    SHARD_REQUIRE(seed >= 0, "--seed {}: expected a non-negative integer", seed);
    cfg.seed = static_cast<uint64_t>(seed);
    cfg.spec = model.spec();
    if (dtypes.strategy == "hsdp") {  // FSDP's HYBRID_SHARD: zero3 sharded within each node
      cfg.strategy.kind = StrategyKind::zero3;
      if (cfg.strategy.shard_group == 0) cfg.strategy.shard_group = ranks_per_node(mpi);
    } else {
      cfg.strategy.kind = parse_strategy(dtypes.strategy);
    }
    cfg.strategy.offload = parse_offload(dtypes.offload);
    cfg.strategy.precision.param_dtype = parse_dtype(dtypes.param);
    cfg.strategy.precision.reduce_dtype =
        dtypes.reduce.empty() ? cfg.strategy.precision.param_dtype : parse_dtype(dtypes.reduce);
    cfg.optim.kind = parse_optimizer(optimizer);
    cfg.schedule.kind = parse_schedule(schedule);
    cfg.checkpointing = parse_checkpointing(checkpointing);
    cfg.comm = comm_for(comm, parse_device(device), mpi);
  }
  std::unique_ptr<Backend> backend(const CommonOptions& common, const MpiRuntime& mpi) const {
    return make_device_backend(parse_device(device), common, mpi);
  }
};

void write_text(const std::string& path, const std::string& text, const char* option) {
  std::ofstream f(path, std::ios::trunc);
  SHARD_REQUIRE(f.good(), "cannot write {} file '{}'", option, path);
  f << text;
  f.close();
  SHARD_REQUIRE(f.good(), "writing {} file '{}' failed", option, path);
  std::printf("wrote %s\n", path.c_str());
}

// --json / --html / --trace: the memory reports every command that runs steps can write.
struct ReportOptions {
  std::string json, html, trace;
  void add(po::options_description& d, bool with_json) {
    if (with_json)
      d.add_options()("json", po::value(&json)->default_value(""),
                      "write rank 0's memory report as JSON (schema shardlab.profile/2)");
    d.add_options()("html", po::value(&html)->default_value(""),
                    "write a self-contained HTML memory report with SVG charts (rank 0)")(
        "trace", po::value(&trace)->default_value(""),
        "write a Chrome trace-event file (Perfetto) of the last step: phases, collectives, memory per category");
  }
  bool any() const { return !json.empty() || !html.empty() || !trace.empty(); }
};

// --json / --html / --trace of a finished run: rank 0's memory, and every rank's last step on the trace.
void write_train_reports(Trainer& trainer, Communicator& comm, const ReportOptions& reports, const StepStats& last,
                         const MpiRuntime& mpi) {
  const TrainConfig& cfg = trainer.config();
  const std::string name = strategy_name(cfg.strategy.kind);
  MemoryRow row = trainer.memory_row(name);
  std::string events;  // one trace process per rank
  append_trace_events(events, mpi.rank(), fmt::format("rank {} ({})", mpi.rank(), name), row.measured_timeline,
                      {row.measured_states, row.measured_host.model_states}, row.measured_comm, trainer.unit_names(),
                      last.val_loss ? std::optional<double>(*last.val_loss) : std::nullopt);
  auto all = comm.gather_strings(events);
  if (mpi.rank() != 0) return;
  MemoryReport report;
  report.title = fmt::format("shardlab train: {}, {} on {} ranks, global batch {}, rank 0, last step",
                             cfg.spec.describe(), name, mpi.world(), cfg.batch);
  report.unit_names = trainer.unit_names();
  report.rows.push_back(row);
  if (!reports.json.empty()) write_text(reports.json, memory_report_json(report) + "\n", "--json");
  if (!reports.html.empty()) write_text(reports.html, memory_report_html(report), "--html");
  if (!reports.trace.empty()) {
    std::string joined;
    for (const auto& e : all) joined += (joined.empty() || e.empty() ? "" : ",\n") + e;
    write_text(reports.trace, chrome_trace_document(joined), "--trace");
  }
}

int cmd_train(const std::vector<std::string>& args, const MpiRuntime& mpi) {
  CommonOptions common;
  TrainOptions opts;
  TrainConfig cfg;
  std::string tokenizer_dir;
  po::options_description desc("train options");
  add_common(desc, common);
  opts.add(desc, cfg);
  desc.add_options()("save", po::value(&cfg.save_path)->default_value(""),
                     "write the final weights to this safetensors file")(
      "log", po::value(&cfg.log_path)->default_value(""), "write one JSON object per step to this file")(
      "print-every", po::value(&cfg.print_every)->default_value(1), "progress line every k steps")(
      "save-dir", po::value(&cfg.save_dir)->default_value(""),
      "write checkpoints under this directory (step_XXXXXXXX, atomically), at least at the end")(
      "save-every", po::value(&cfg.save_every)->default_value(0), "also checkpoint every K steps")(
      "save-keep", po::value(&cfg.save_keep)->default_value(0),
      "keep only the newest K complete checkpoints, deleting older ones after a newer one is complete (0 = all; "
      "the --save-best checkpoint is always kept)")(
      "sample-every", po::value(&cfg.sample_every)->default_value(0),
      "print a sample from rank 0 every K steps and at the end (0 = never); the parameters are gathered as in a "
      "forward")(
      "sample-prompt", po::value(&cfg.sample_prompt)->default_value(""), "the samples' prompt (as sample --prompt)")(
      "tokenizer", po::value(&tokenizer_dir)->default_value(""),
      "a directory with GPT-2's encoder.json and vocab.bpe: prompts and samples as text "
      "(scripts/fetch-gpt2-tokenizer.sh DIR fetches them)")(
      "sample-tokens", po::value(&cfg.sample.tokens)->default_value(cfg.sample.tokens), "tokens per sample")(
      "sample-temperature", po::value(&cfg.sample.temperature)->default_value(cfg.sample.temperature, "1.0"),
      "the samples' temperature (0 = greedy); their seed is --seed, drawn afresh each step")(
      "save-best", po::bool_switch(&cfg.save_best),
      "also checkpoint each step whose validation loss is the lowest so far, and point DIR/best at it")(
      "skip-nonfinite", po::bool_switch(&cfg.skip_nonfinite),
      "skip the update of a step whose loss or gradient norm is not finite (default: stop with the step number)")(
      "resume", po::value(&cfg.resume)->default_value(""),
      "resume from a checkpoint directory, or 'auto' for the newest complete one under --save-dir; any world "
      "size and strategy can resume any checkpoint");
  ReportOptions reports;
  reports.add(desc, true);
  if (!parse(args, desc, mpi, "train")) return 0;
  opts.finish(cfg, mpi);
  if (!tokenizer_dir.empty()) cfg.tokenizer = std::make_shared<const Gpt2Tokenizer>(tokenizer_dir);
  cfg.record_step = reports.any();
  start_watchdog(mpi, common.collective_timeout);
  auto backend = opts.backend(common, mpi);
  Pool pool(*backend, pool_config(common, backend.get()));
  auto comm = world_group(mpi, cfg.comm).connect(pool);
  Trainer trainer(*backend, pool, *comm, cfg);
  const StepStats last = trainer.run(stdout);
  if (reports.any()) write_train_reports(trainer, *comm, reports, last, mpi);
  return kOk;
}

int cmd_export(const std::vector<std::string>& args, const MpiRuntime& mpi) {
  std::string ckpt, out, dtype = "f32";
  po::options_description desc("export options");
  desc.add_options()("help,h", "show this command's options")(
      "checkpoint", po::value(&ckpt), "checkpoint directory (step_XXXXXXXX)")(
      "out", po::value(&out)->default_value(""), "safetensors file to write (HF GPT-2 names)")(
      "dtype", po::value(&dtype)->default_value(dtype), "stored dtype: f32, bf16 or f16");
  po::positional_options_description pos;
  pos.add("checkpoint", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(desc).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw InputError(fmt::format("{} (see `shardlab export --help`)", e.what()));
  }
  if (vm.count("help")) {
    if (mpi.rank() == 0) std::cout << "usage: shardlab export CHECKPOINT --out FILE.safetensors [options]\n\n" << desc << "\n";
    return 0;
  }
  SHARD_REQUIRE(!ckpt.empty() && !out.empty(), "usage: shardlab export CHECKPOINT --out FILE.safetensors");
  if (mpi.rank() != 0) return 0;
  export_checkpoint(ckpt, out, parse_dtype(dtype));
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

// `shardlab sample`: the model of an --init file or a checkpoint on one rank (a world of one under
// DDP, so the forward is the strategies' own, forward only), prompt + sampled tokens on stdout.
int cmd_sample(const std::vector<std::string>& args, const MpiRuntime& mpi) {
  CommonOptions common;
  ModelOptions model;
  TrainConfig cfg;
  SampleConfig sc;
  std::string prompt, tokenizer_dir;
  int64_t seed = static_cast<int64_t>(sc.seed);
  po::options_description desc("sample options");
  add_common(desc, common);
  model.add(desc);
  desc.add_options()("init", po::value(&cfg.init)->default_value(""),
                     "the model: a safetensors file with HF GPT-2 names (its shape from --model and the overrides)")(
      "resume", po::value(&cfg.resume)->default_value(""), "the model: a checkpoint directory (its shape from the manifest)")(
      "prompt", po::value(&prompt)->default_value(""),
      "text for byte-level models (vocab <= 256), token ids separated by spaces or commas otherwise; empty = a newline")(
      "tokens", po::value(&sc.tokens)->default_value(sc.tokens), "tokens to generate")(
      "temperature", po::value(&sc.temperature)->default_value(sc.temperature, "1.0"), "softmax temperature (0 = greedy)")(
      "top-k", po::value(&sc.top_k)->default_value(sc.top_k), "sample among the K most likely tokens (0 = all, 1 = greedy)")(
      "seed", po::value(&seed)->default_value(seed), "sampling seed: the same seed gives the same sample")(
      "tokenizer", po::value(&tokenizer_dir)->default_value(""),
      "a directory with GPT-2's encoder.json and vocab.bpe: the prompt and the sample as text "
      "(scripts/fetch-gpt2-tokenizer.sh DIR fetches them)");
  if (!parse(args, desc, mpi, "sample")) return 0;
  SHARD_REQUIRE(mpi.world() == 1, "sample runs on one rank (started on {})", mpi.world());
  SHARD_REQUIRE(cfg.init.empty() != cfg.resume.empty(), "sample needs exactly one model: --init FILE or --resume CKPT");
  SHARD_REQUIRE(seed >= 0, "--seed {}: expected a non-negative integer", seed);
  sc.seed = static_cast<uint64_t>(seed);
  if (!cfg.resume.empty()) {  // the checkpoint says what it holds
    const Manifest m = read_manifest(cfg.resume);
    cfg.spec = m.model;
    cfg.optim.kind = parse_optimizer(m.optimizer.kind);
    cfg.shuffle = m.shuffle;
    cfg.seed = m.seed;
    cfg.steps = std::max<int64_t>(m.step, 1);
  } else {
    cfg.spec = model.spec();
  }
  sc.validate(cfg.spec.vocab);
  if (!tokenizer_dir.empty()) cfg.tokenizer = std::make_shared<const Gpt2Tokenizer>(tokenizer_dir);
  std::vector<int32_t> tokens = encode_prompt(prompt, cfg.spec.vocab, cfg.tokenizer.get());
  SHARD_REQUIRE(static_cast<int64_t>(tokens.size()) <= cfg.spec.seq,
                "--prompt has {} tokens, more than the model's {} positions (--seq)", tokens.size(), cfg.spec.seq);
  auto backend = make_cpu(common, mpi);
  Pool pool(*backend, pool_config(common));
  auto comm = make_sim_communicator(0, 1, pool);
  auto none = std::make_shared<TokenStream>(zero_stream(cfg.spec.seq + 1, "(sample: no data)"));  // no data read
  Trainer trainer(*backend, pool, *comm, cfg, none);
  const size_t given = tokens.size();
  tokens = trainer.generate(tokens, sc);
  if (given == 0) tokens.erase(tokens.begin());  // the newline that stood in for an empty prompt
  std::string text = decode_tokens(tokens, cfg.spec.vocab, cfg.tokenizer.get());
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  return kOk;
}

int cmd_profile(const std::vector<std::string>& args, const MpiRuntime& mpi) {
  CommonOptions common;
  TrainOptions opts;
  ProfileConfig pc;
  std::string strategies = "dp,ddp,zero1,zero2,zero3", budget, host_budget, json_path, html_path, trace_path;
  po::options_description desc("profile options");
  add_common(desc, common);
  opts.add(desc, pc.train);
  desc.add_options()("world", po::value(&pc.world)->default_value(pc.world), "world size to profile")(
      "micro-batch", po::value(&pc.micro_batch)->default_value(pc.micro_batch), "sequences per rank per micro-step")(
      "strategies", po::value(&strategies)->default_value(strategies), "strategies to profile")(
      "budget", po::value(&budget)->default_value(""),
      "per-rank device memory (e.g. 80GiB): mark what fits, find the largest micro-batch that does, and name the "
      "cheapest combination of levers (strategy, activation checkpointing, offload, micro-batch) that fits")(
      "host-budget", po::value(&host_budget)->default_value(""),
      "with --budget: per-rank host memory for what --offload keeps there (empty = unlimited)")(
      "measure", po::bool_switch(&pc.measure), "also run real steps and print measured beside predicted "
      "(with fewer processes than --world, one process plays rank 0 through the sim communicator)")(
      "measure-steps", po::value(&pc.measure_steps)->default_value(pc.measure_steps), "steps per measured run")(
      "json", po::value(&json_path)->default_value(""), "write the report as JSON (schema shardlab.profile/2)")(
      "html", po::value(&html_path)->default_value(""), "write a self-contained HTML page with SVG charts")(
      "trace", po::value(&trace_path)->default_value(""),
      "with --measure: a Chrome trace-event file (Perfetto) of each measured step");
  if (!parse(args, desc, mpi, "profile")) return 0;
  opts.finish(pc.train, mpi);
  pc.strategies = parse_strategy_list(strategies);
  start_watchdog(mpi, common.collective_timeout);
  if (!budget.empty()) pc.budget = parse_bytes(budget);
  SHARD_REQUIRE(budget.empty() || pc.budget > 0, "--budget {}: expected a positive size", budget);
  if (!host_budget.empty()) pc.host_budget = parse_bytes(host_budget);
  SHARD_REQUIRE(host_budget.empty() || pc.host_budget > 0, "--host-budget {}: expected a positive size", host_budget);
  SHARD_REQUIRE(pc.measure_steps >= 1, "--measure-steps {}: expected at least one step", pc.measure_steps);
  SHARD_REQUIRE(trace_path.empty() || pc.measure, "--trace needs --measure: a trace shows a step that ran");
  auto backend = opts.backend(common, mpi);
  pc.pools = pool_config(common, backend.get());
  MemoryReport r = run_profile(*backend, world_group(mpi, pc.train.comm), pc);
  if (mpi.rank() != 0) return 0;
  print_memory_table(r, stdout);
  if (!json_path.empty()) write_text(json_path, memory_report_json(r) + "\n", "--json");
  if (!html_path.empty()) write_text(html_path, memory_report_html(r), "--html");
  if (!trace_path.empty()) write_text(trace_path, memory_trace_json(r), "--trace");
  return 0;
}

int cmd_compare(const std::vector<std::string>& args, const MpiRuntime& mpi) {
  CommonOptions common;
  TrainOptions opts;
  CompareConfig cc;
  cc.train.steps = 20;
  std::string strategies = "dp,ddp,zero1,zero2,zero3", json_path;
  po::options_description desc("compare options");
  add_common(desc, common);
  opts.add(desc, cc.train);
  desc.add_options()("strategies", po::value(&strategies)->default_value(strategies),
                     "strategies to run, in order; the first is the loss reference")(
      "tolerance", po::value(&cc.tolerance)->default_value(cc.tolerance),
      "largest relative loss difference from the first strategy at any step")(
      "json", po::value(&json_path)->default_value(""), "also write the results as JSON (schema shardlab.compare/1)");
  ReportOptions reports;
  reports.add(desc, false);
  if (!parse(args, desc, mpi, "compare")) return 0;
  opts.finish(cc.train, mpi);
  cc.strategies = parse_strategy_list(strategies);
  start_watchdog(mpi, common.collective_timeout);
  cc.train.strategy.under(StrategyKind::zero3).validate();  // each strategy applies what it allows
  SHARD_REQUIRE(cc.tolerance > 0, "--tolerance {}: expected a positive number", cc.tolerance);
  auto backend = opts.backend(common, mpi);
  const PoolConfig pools = pool_config(common, backend.get());
  cc.budget = pools.budget;
  cc.host_budget = pools.host_budget;
  CompareResult r = run_compare(*backend, world_group(mpi, cc.train.comm), cc, stdout);
  if (mpi.rank() == 0 && !json_path.empty()) write_text(json_path, compare_json(cc, r, mpi.world()) + "\n", "--json");
  if (mpi.rank() == 0 && reports.any()) {
    MemoryReport report;
    report.title = fmt::format("shardlab compare: {}, {} ranks, global batch {}, rank 0, last step of each strategy",
                               cc.train.spec.describe(), mpi.world(), cc.train.batch);
    report.unit_names = family_of(cc.train.spec).unit_names(cc.train.spec);
    for (const auto& run : r.runs)
      if (!run.oom) report.rows.push_back(run.memory);
    if (!reports.html.empty()) write_text(reports.html, memory_report_html(report), "--html");
    if (!reports.trace.empty()) write_text(reports.trace, memory_trace_json(report), "--trace");
  }
  if (!r.agree) {
    if (mpi.rank() == 0) std::fprintf(stderr, "shardlab compare: the strategies' losses disagree: %s\n", r.disagreement.c_str());
    return kWrongResults;
  }
  return kOk;
}

int cmd_info(const std::vector<std::string>& args, const MpiRuntime& mpi) {
  CommonOptions common;
  po::options_description desc("info options");
  add_common(desc, common);
  if (!parse(args, desc, mpi, "info")) return 0;
  auto backend = make_cpu(common, mpi);
  Pool pool(*backend);
  auto comm = world_group(mpi).connect(pool);
  // Every rank's line, gathered to rank 0 so the output is ordered.
  auto lines = comm->gather_strings(fmt::format("rank {}/{} (local {}/{}): {}", mpi.rank(), mpi.world(),
                                                mpi.local_rank(), mpi.local_size(), backend->describe()));
  if (mpi.rank() == 0) {
    std::printf("shardlab %s — CUDA backend %s, %d CUDA device(s) visible\n", "0.1.0",
                cuda_compiled() ? "compiled" : "not compiled", cuda_device_count());
    for (const std::string& l : lines) std::printf("  %s\n", l.c_str());
  }
  return kOk;
}

int cmd_bench_collectives(const std::vector<std::string>& args, const MpiRuntime& mpi) {
  CommonOptions common;
  CollectiveBenchConfig cfg;
  std::string ops = "all_reduce,reduce_scatter,all_gather,broadcast,reduce,gather,scatter", dtype = "f32", min_b = "1KiB",
              max_b = "64MiB", comm_kind = "mpi", device = "cpu";
  int sim_world = 0;
  po::options_description desc("bench-collectives options");
  add_common(desc, common);
  desc.add_options()("ops", po::value(&ops)->default_value(ops), "collectives to time, comma-separated")(
      "dtype", po::value(&dtype)->default_value(dtype), "element type: f32, bf16 or f16")(
      "min-bytes", po::value(&min_b)->default_value(min_b), "smallest size")(
      "max-bytes", po::value(&max_b)->default_value(max_b), "largest size")(
      "step-factor", po::value(&cfg.step_factor)->default_value(cfg.step_factor), "size multiplier between lines")(
      "warmup", po::value(&cfg.warmup)->default_value(cfg.warmup), "untimed calls per size")(
      "iters", po::value(&cfg.iters)->default_value(cfg.iters), "timed calls per size")(
      "comm", po::value(&comm_kind)->default_value(comm_kind),
      "communicator: mpi (real ranks, host buffers), nccl or staged (real ranks, --device cuda buffers; staged "
      "also on the cpu), auto, or sim (this process plays rank 0 of --sim-world ranks)")(
      "device", po::value(&device)->default_value(device), "where the buffers live: cpu or cuda")(
      "sim-world", po::value(&sim_world)->default_value(0), "world size the sim communicator pretends");
  if (!parse(args, desc, mpi, "bench-collectives")) return 0;
  start_watchdog(mpi, common.collective_timeout);
  cfg.ops = parse_comm_ops(ops);
  cfg.dtype = parse_dtype(dtype);
  cfg.min_bytes = parse_bytes(min_b);
  cfg.max_bytes = parse_bytes(max_b);
  const Device dev = parse_device(device);
  std::unique_ptr<Backend> backend = make_device_backend(dev, common, mpi);
  Pool pool(*backend, pool_config(common));
  std::unique_ptr<Communicator> comm;
  if (comm_kind == "sim") {
    SHARD_REQUIRE(mpi.world() == 1, "--comm sim runs in one process; started with {} ranks", mpi.world());
    SHARD_REQUIRE(sim_world >= 1, "--comm sim needs --sim-world N (N >= 1)");
    comm = make_sim_communicator(0, sim_world, pool);
  } else {
    SHARD_REQUIRE(sim_world == 0, "--sim-world is for --comm sim");
    comm = world_group(mpi, comm_for(comm_kind, dev, mpi)).connect(pool);
  }
  uint64_t wrong = run_collective_benchmark(*comm, pool, cfg, stdout);
  comm.reset();
  return wrong == 0 ? kOk : kWrongResults;
}

int cmd_bench_gemm(const std::vector<std::string>& args, const MpiRuntime& mpi) {
  CommonOptions common;
  GemmBenchConfig cfg;
  cfg.heads = 0, cfg.seq = 0;
  po::options_description desc("bench-gemm options");
  add_common(desc, common);
  desc.add_options()("dim", po::value(&cfg.dim)->default_value(cfg.dim), "model width C")(
      "tokens", po::value(&cfg.tokens)->default_value(cfg.tokens), "rows B*T")(
      "heads", po::value(&cfg.heads)->default_value(0, "C/64"), "attention heads (per-head products C/heads wide)")(
      "seq", po::value(&cfg.seq)->default_value(0, "min(tokens, 1024)"), "sequence length T (attention's T x T)")(
      "vocab", po::value(&cfg.vocab)->default_value(cfg.vocab), "vocabulary of the LM head's products; 0 = leave them out")(
      "layers", po::value(&cfg.layers)->default_value(cfg.layers), "blocks (weights the step's products)")(
      "seconds", po::value(&cfg.seconds)->default_value(cfg.seconds), "minimum timing per product and candidate");
  if (!parse(args, desc, mpi, "bench-gemm")) return 0;
  SHARD_REQUIRE(cfg.dim > 0 && cfg.tokens > 0 && cfg.heads >= 0 && cfg.seq >= 0 && cfg.vocab >= 0 && cfg.layers > 0,
                "--dim {} --tokens {} --heads {} --seq {} --vocab {} --layers {}: expected positive sizes (0 where a "
                "default is named)", cfg.dim, cfg.tokens, cfg.heads, cfg.seq, cfg.vocab, cfg.layers);
  if (cfg.heads == 0) cfg.heads = std::max<int64_t>(1, cfg.dim / 64);
  if (cfg.seq == 0) cfg.seq = std::min<int64_t>(cfg.tokens, 1024);
  auto backend = make_cpu(common, mpi);
  Pool pool(*backend, pool_config(common));
  if (mpi.rank() == 0) run_gemm_benchmark(pool, cfg, stdout);
  return 0;
}

int cmd_bench_train(const std::vector<std::string>& args, const MpiRuntime& mpi) {
  CommonOptions common;
  ModelOptions model;
  TrainBenchConfig cfg;
  std::string strategy = "ddp", checkpointing = "none", offload = "none", param_dtype = "f32", device = "cpu";
  po::options_description desc("bench-train options");
  add_common(desc, common);
  model.add(desc);
  desc.add_options()("batch", po::value(&cfg.batch)->default_value(cfg.batch), "sequences per step")(
      "steps", po::value(&cfg.steps)->default_value(cfg.steps), "timed steps (the median is reported)")(
      "warmup", po::value(&cfg.warmup)->default_value(cfg.warmup), "untimed steps first")(
      "strategy", po::value(&strategy)->default_value(strategy), "the strategy, on one rank: dp, ddp, zero1, zero2, zero3")(
      "activation-checkpointing", po::value(&checkpointing)->default_value(checkpointing),
      "none, attention or blocks; with a lever, the run without it is timed too (steps interleaved) and the ratio printed")(
      "offload", po::value(&offload)->default_value(offload),
      "none, optimizer (zero1-3) or params (zero3): as --activation-checkpointing, timed against none")(
      "param-dtype", po::value(&param_dtype)->default_value(param_dtype), "f32 or bf16 parameters (and gradients)")(
      "device", po::value(&device)->default_value(device), "cpu or cuda")(
      "peak-tflops", po::value(&cfg.peak_tflops)->default_value(-1, "989 on cuda (H100 dense bf16), none on cpu"),
      "the device's peak for the MFU line; 0 = no MFU line");
  if (!parse(args, desc, mpi, "bench-train")) return 0;
  cfg.spec = model.spec();
  cfg.strategy.kind = parse_strategy(strategy);
  cfg.strategy.offload = parse_offload(offload);
  cfg.strategy.validate();
  cfg.checkpointing = parse_checkpointing(checkpointing);
  cfg.strategy.precision.param_dtype = cfg.strategy.precision.reduce_dtype = parse_dtype(param_dtype);
  cfg.strategy.precision.validate();
  const Device dev = parse_device(device);
  if (cfg.peak_tflops < 0) cfg.peak_tflops = dev == Device::cuda ? 989 : 0;
  std::unique_ptr<Backend> backend = make_device_backend(dev, common, mpi);
  Pool pool(*backend, pool_config(common, backend.get()));
  if (mpi.world() == 1) {
    run_train_benchmark(pool, cfg, stdout);
    return 0;
  }
  // Several ranks: the strategy over the real transport; rank 0 prints.
  auto comm = world_group(mpi, comm_for("auto", dev, mpi)).connect(pool);
  std::FILE* sink = mpi.rank() == 0 ? stdout : std::fopen("/dev/null", "w");
  run_train_benchmark(pool, cfg, sink, comm.get());
  if (sink != stdout) std::fclose(sink);
  return 0;
}

int cmd_bench_adamw(const std::vector<std::string>& args, const MpiRuntime& mpi) {
  CommonOptions common;
  AdamwBenchConfig cfg;
  po::options_description desc("bench-adamw options");
  add_common(desc, common);
  desc.add_options()("elements", po::value(&cfg.elements)->default_value(cfg.elements), "f32 elements per array")(
      "repeats", po::value(&cfg.repeats)->default_value(cfg.repeats), "runs of each kernel (the best is reported)");
  if (!parse(args, desc, mpi, "bench-adamw")) return 0;
  SHARD_REQUIRE(mpi.world() == 1, "bench-adamw runs on one rank, {} started", mpi.world());
  auto backend = make_cpu(common, mpi);
  Pool pool(*backend, pool_config(common));
  run_adamw_benchmark(pool, cfg, stdout);
  return 0;
}

// Runs the top `k` fitting entries of the plan for a few steps each on the real ranks and fills
// their measured step time (median after the first step) and rank 0's measured peak.
void measure_plan(Backend& be, const MpiRuntime& mpi, const PlanConfig& pc, const CommonOptions& common,
                  std::vector<PlanEntry>& plan, int k, int64_t steps) {
  int done = 0;
  for (PlanEntry& e : plan) {
    if (!e.fits || done == k) break;
    ++done;
    TrainConfig t = e.config(pc);
    t.steps = steps;
    t.schedule.kind = ScheduleKind::constant;
    Pool pool(be, pool_config(common));
    auto comm = world_group(mpi).connect(pool);
    Trainer trainer(be, pool, *comm, t);
    std::vector<double> ms;
    uint64_t peak = 0;
    for (int64_t s = 0; s < steps; ++s) {
      StepStats st = trainer.step(s);
      if (s > 0) ms.push_back(st.ms);
      peak = std::max(peak, st.peak_bytes);
    }
    e.measured_step_ms = median(ms);
    e.measured_peak = peak;
    if (mpi.rank() == 0) {
      std::printf("measured %d/%d: %s, checkpointing %s, micro-batch %lld x %lld: %.1f ms (predicted %.1f)\n", done, k,
                  e.strategy.label().c_str(), checkpointing_name(e.checkpointing), static_cast<long long>(e.micro_batch),
                  static_cast<long long>(e.accum), *e.measured_step_ms, e.step_ms);
      std::fflush(stdout);
    }
  }
}

int cmd_plan(const std::vector<std::string>& args, const MpiRuntime& mpi) {
  CommonOptions common;
  ModelOptions model;
  PlanConfig pc;
  std::string param = "bf16", reduce, json_path, html_path;
  double tflops = 0, intra = 0, inter = 0, host_link = 0;
  bool calibrate = false;
  int measure = 0, show = 15;
  int64_t measure_steps = 6;
  po::options_description desc("plan options");
  add_common(desc, common);
  model.add(desc);
  desc.add_options()("world", po::value(&pc.world)->default_value(pc.world), "ranks to plan for")(
      "ranks-per-node", po::value(&pc.ranks_per_node)->default_value(pc.ranks_per_node),
      "ranks per node: collectives within a node use --link-intra, across nodes --link-inter; hybrid sharding "
      "groups are one node")(
      "global-batch", po::value(&pc.global_batch)->default_value(0), "sequences per step (0 = 8 per rank)")(
      "param-dtype", po::value(&param)->default_value(param), "parameter dtype: f32 or bf16 (f32 master weights)")(
      "reduce-dtype", po::value(&reduce)->default_value(""), "gradient dtype (default: the param dtype)")(
      "device-tflops", po::value(&tflops)->default_value(0),
      "peak dense TFLOP/s per rank; the model uses 45% of it (0 = an H100's 989)")(
      "link-intra", po::value(&intra)->default_value(0), "GB/s of bus bandwidth within a node (0 = NVLink's 360)")(
      "link-inter", po::value(&inter)->default_value(0), "GB/s of bus bandwidth between nodes (0 = 45: 400 Gb/s IB)")(
      "host-link", po::value(&host_link)->default_value(0), "GB/s device <-> host (0 = 25: PCIe 5 x16)")(
      "calibrate", po::bool_switch(&calibrate),
      "measure the rates on this machine instead (a few training steps, an all-reduce, copies, AdamW)")(
      "measure", po::value(&measure)->default_value(0),
      "run the top K configurations that fit for --measure-steps steps each (needs --nproc = --world) and print "
      "measured beside predicted")(
      "measure-steps", po::value(&measure_steps)->default_value(measure_steps), "steps per measured configuration")(
      "show", po::value(&show)->default_value(show), "configurations that fit to list")(
      "json", po::value(&json_path)->default_value(""), "write every configuration as JSON (schema shardlab.plan/1)")(
      "html", po::value(&html_path)->default_value(""),
      "write a self-contained HTML page: the rates and the ranked configurations with their time split");
  if (!parse(args, desc, mpi, "plan")) return 0;
  pc.train.spec = model.spec();
  pc.train.strategy.precision.param_dtype = parse_dtype(param);
  pc.train.strategy.precision.reduce_dtype = reduce.empty() ? pc.train.strategy.precision.param_dtype : parse_dtype(reduce);
  pc.train.strategy.precision.validate();
  const PoolConfig budgets = pool_config(common);
  pc.device_memory = budgets.budget;
  pc.host_memory = budgets.host_budget;
  SHARD_REQUIRE(tflops >= 0 && intra >= 0 && inter >= 0 && host_link >= 0,
                "--device-tflops, --link-intra, --link-inter and --host-link must not be negative");
  if (tflops > 0) pc.rates.flops = tflops * 1e12 * 0.45;
  if (intra > 0) pc.rates.link_intra = intra * 1e9;
  if (inter > 0) pc.rates.link_inter = inter * 1e9;
  if (host_link > 0) pc.rates.host_link = host_link * 1e9;
  if (tflops > 0 || intra > 0 || inter > 0 || host_link > 0) pc.rates.source = "given, and defaults for the rest";
  SHARD_REQUIRE(measure >= 0 && measure_steps >= 2, "--measure {} --measure-steps {}: expected K >= 0 and at least 2 steps",
                measure, measure_steps);
  SHARD_REQUIRE(measure == 0 || mpi.world() == pc.world,
                "--measure runs the configurations on real ranks: start --nproc {} (the --world), not {}", pc.world,
                mpi.world());
  pc.validate();
  auto backend = make_cpu(common, mpi);
  if (calibrate) {
    Pool pool(*backend);
    auto comm = world_group(mpi).connect(pool);
    const int64_t per_rank = (pc.global_batch > 0 ? pc.global_batch : 8 * int64_t{pc.world}) / pc.world;
    pc.rates = calibrate_rates(*backend, *comm, pc, std::min<int64_t>(per_rank, 8), mpi.rank() == 0 ? stdout : nullptr);
  }
  std::vector<PlanEntry> plan = make_plan(pc);
  if (measure > 0) measure_plan(*backend, mpi, pc, common, plan, measure, measure_steps);
  if (mpi.rank() != 0) return 0;
  print_plan(pc, plan, static_cast<size_t>(std::max(show, measure)), stdout);
  if (!json_path.empty()) write_text(json_path, plan_json(pc, plan) + "\n", "--json");
  if (!html_path.empty()) write_text(html_path, plan_html(pc, plan), "--html");
  return 0;
}

int run_command(const std::string& command, const std::vector<std::string>& rest, const MpiRuntime& mpi) {
  if (command == "train") return cmd_train(rest, mpi);
  if (command == "compare") return cmd_compare(rest, mpi);
  if (command == "profile") return cmd_profile(rest, mpi);
  if (command == "export") return cmd_export(rest, mpi);
  if (command == "sample") return cmd_sample(rest, mpi);
  if (command == "info") return cmd_info(rest, mpi);
  if (command == "bench-collectives") return cmd_bench_collectives(rest, mpi);
  if (command == "bench-gemm") return cmd_bench_gemm(rest, mpi);
  if (command == "bench-train") return cmd_bench_train(rest, mpi);
  if (command == "bench-adamw") return cmd_bench_adamw(rest, mpi);
  if (command == "plan") return cmd_plan(rest, mpi);
  throw InputError(fmt::format("unknown command '{}'\n{}", command, kUsage));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args;
  try {
    args = launch_or_continue(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardlab: %s\n", e.what());
    return 1;
  }
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 1 : 0;
  }
  MpiRuntime mpi(&argc, &argv);
  std::string command = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  try {
    int code = run_command(command, rest, mpi);
    Watchdog::stop();
    return code;
  } catch (const InputError& e) {
    abort_job(fmt::format("error: {}", e.what()), kBadInput);
  } catch (const OutOfMemory& e) {
    abort_job(e.what(), kOutOfMemory);
  } catch (const std::exception& e) {
    abort_job(e.what(), kInternal);
  }
}
