// options.hpp — the option groups of shardlab's commands, each flag declared once.
//
// A command composes the groups it takes (run, memory, model, strategy, mesh, training, report)
// and the shared single flags below; each flag name is declared in exactly one function here, with
// one type and one meaning in every command that accepts it. A command's help text adds to a
// flag's text only what the flag does there (a `note`). parse() also makes two rules hold for
// every command:
//   * a word that is not an option is an error naming it (it used to be dropped silently, so
//     `--shuffle false` shuffled);
//   * a switch is `--flag`, `--flag true|false|1|0` or `--flag=VALUE`, whichever the flag.
// Flags renamed so that a name means one thing (docs/commands.md, "Renamed options") are in options.cpp's
// table: an old spelling still works where it meant one thing, and is refused naming the new one
// where another command gives it another meaning.
#pragma once
#include <boost/program_options.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/plan/plan_time.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {

struct Context;

namespace cli {

namespace po = boost::program_options;
using Desc = po::options_description;

// ---- parsing ----------------------------------------------------------------------------------

struct Usage {
  const char* command;               // "train"
  const char* operands = "";         // what goes before [options] in the usage line
  const char* positional = nullptr;  // the option one bare word fills (export's "checkpoint")
  bool positional_many = false;      // every bare word fills it (report's log files)
};

// The description a command adds its own options to: captioned "<command> options", with --help.
Desc command_options(const char* command);

// Where an option that is not at its default came from: the command line or a --config file.
struct OptionSource {
  std::string name, value;  // "steps", "5" (a switch given bare: "true")
  std::string origin;       // "command line" or "config FILE"
};
using OptionSources = std::vector<OptionSource>;
// "--steps 5 (command line), --model tiny (config run.cfg)": the run header's options line.
std::string describe(const OptionSources& sources);

// Parses `args` into the variables bound in `desc`, and every command's --config FILE: options as
// `name = value` lines (boost's config-file format, docs/commands.md "Options from a file"), which the
// command line overrides. Returns false (after printing the help on rank 0) when --help was given.
// Throws InputError for an unknown, malformed or stray argument, in either place. `sources`, when
// given, receives where each option not at its default came from, in command-line order first;
// `given`, the parsed map (its defaulted() tells a flag given from a default).
bool parse(std::vector<std::string> args, const Desc& desc, int rank, const Usage& usage,
           OptionSources* sources = nullptr, po::variables_map* given = nullptr);
// Whether `flag` was given (on the command line or in a --config file), not left at its default.
bool given_flag(const po::variables_map& vm, const char* flag);

// ---- run: how this process runs (every command but export) -----------------------------------
struct RunOptions {
  int threads = 0;
  std::string cpu_gemm = "auto";
  double collective_timeout = 600;
  std::string device = "cpu";  // with_device
  std::string comm = "auto";   // with_comm; the default is the command's (set before add)
  // --threads --cpu-gemm --collective-timeout, and --device / --comm where the command takes them
  // (comm_note: what else --comm accepts there).
  void add(Desc& d, bool with_device = false, bool with_comm = false, const char* comm_note = nullptr);
};

// ---- memory: the budgets of a rank's two tiers, and the levers that trade memory ---------------
struct MemoryOptions {
  std::string device_memory, host_memory;
  std::string checkpointing = "none", offload = "none";
  // --device-memory --host-memory, and with levers --activation-checkpointing --offload
  // (lever_note: what a lever does in this command).
  void add(Desc& d, bool with_levers = false, const char* lever_note = nullptr);
  // The budgets. On a GPU (be given) an empty --device-memory means the device's free memory once
  // the backend holds its context, so running out is shardlab's out-of-memory error, listing what
  // is live, rather than the driver's.
  PoolConfig pools(const Backend* be = nullptr) const;
};

// ---- model: a preset and its overrides --------------------------------------------------------
struct ModelOptions {
  std::string preset;  // empty: not given (small, or an --init directory's model)
  int64_t layers = 0, dim = 0, heads = 0, seq = 0, vocab = 0;  // 0 = the preset's
  int64_t kv_heads = 0, ffn_dim = 0;                             // 0 = the preset's
  std::string attention = "auto", activation_dtype = "auto";     // --attention, --activation-dtype
  int64_t loss_chunk = 0;                                        // --loss-chunk (training and evaluation)
  double moe_capacity_factor = 0;                                // --moe-capacity-factor (0 = dropless)
  std::string moe_aux_loss = "model";                            // --moe-aux-loss model|on|off
  std::string moe_bias_rate = "model";                           // --moe-bias-update-rate model|γ
  // --model and its size flags, --attention, --loss-chunk, --activation-dtype and the --moe-* flags
  void add(Desc& d);
  // The five dimensions without a preset, for a benchmark of shapes (bench-gemm): defaults are the
  // fields'; shown[i] / meaning0[i] (layers, dim, heads, seq, vocab) say what a default 0 stands for.
  void add_shape(Desc& d, const char* const (&shown)[5], const char* const (&meaning0)[5]);
  // The preset with the overrides; or, when `init` (--init) is an HF model directory, the model its
  // config.json gives, which fixes the shape: --model is refused, --dim, --heads, --vocab, --kv-heads
  // and --ffn-dim must equal the config's, --layers may be fewer (the first blocks load) and --seq
  // shorter where no tensor changes with it (docs/checkpoints-and-models.md, "Models from Hugging
  // Face directories"): resolve_model (src/model/resolve.hpp) of these flags, computing()'s fields.
  ModelSpec spec(const std::string& init = "") const;
  // s with how it is computed set from --attention, --loss-chunk and the --moe-* flags (InputError
  // for a bad value): for a model from the flags or from a checkpoint alike.
  ModelSpec computing(ModelSpec s) const;
  // --activation-dtype, --attention as given; auto: bf16, cudnn (its heads, no --cp) on CUDA, bf16 params.
  DType activation_dtype_on(Device device, DType param_dtype) const;
  AttentionKernel attention_on(const ModelSpec& spec, Device device, DType param_dtype, bool cp) const;
  bool given() const;  // whether any of these flags was given (with a value other than the default)
};

// ---- strategy: how the model's state is split and stored --------------------------------------
struct StrategyOptions {
  std::string kind = "ddp", param = "f32", reduce;
  // --strategy --param-dtype --reduce-dtype --bucket-mb --reshard-after-forward --prefetch
  // --max-gathered (with `s`'s values as defaults); kind_note / dtype_note qualify what this
  // command does with them. Without `s`: --strategy and --param-dtype (bench-train) or, with
  // dtypes_only, --param-dtype --reduce-dtype (plan).
  void add(Desc& d, StrategyConfig& s);
  void add_kind_and_dtype(Desc& d, const char* kind_note, const char* dtype_note);
  void add_dtypes(Desc& d, const char* dtype_note);
  // The dtypes into s.precision (reduce defaults to the param dtype).
  void apply_dtypes(StrategyConfig& s) const;
  // ZeRO++'s flags (added by add(d, s)): the levers into s.zeropp; --ranks-per-node is the layout's.
  bool zeropp = false;                                 // --zeropp: all three levers
  bool error_feedback = false;                         // --error-feedback
  std::string quantize_weights, quantize_grads, secondary_shard;  // "" = not given
  int ranks_per_node = 0;                              // --ranks-per-node
  double inter_node_gbs = 0;                           // --inter-node-gbs
  void apply_zeropp(StrategyConfig& s) const;
  // The levers alone (--zeropp --quantize-weights --secondary-shard --quantize-grads --quantize-block
  // --error-feedback), the block into z: add() and plan's group.
  void add_zeropp_levers(Desc& d, ZeroPP& z);
  std::string prefetch = "auto";  // --prefetch
  void apply_prefetch(StrategyConfig& s) const;
};

// ---- mesh: how the world's ranks are laid out (src/comm/mesh.hpp) -----------------------------
struct MeshOptions {
  ParallelDims dims;    // --dp-shard --dp-replicate --cp --tp --pp
  int shard_group = 0;  // --shard-group, the old name of --dp-shard
  bool sequence_parallel = false;  // --sequence-parallel
  std::string pp_schedule = default_pp_schedule().name();  // --pp-schedule
  int pp_virtual = 0;                // --pp-virtual (0: the schedule's own)
  std::string pp_split;              // --pp-split
  std::string cp_method = "allgather";  // --cp-method
  std::string cp_balance = "head-tail";  // --cp-balance
  void add(Desc& d);
  PipelineConfig pipeline() const;  // the pipeline flags, parsed
  // Every mesh flag: the degrees resolved (below), sequence parallelism, the pipeline's and cp's.
  ParallelLayout layout(int world, int hsdp_ranks) const;
  // The degrees resolved against `world`, aliases applied: --shard-group S is --dp-shard S, and
  // hsdp (`hsdp_ranks`: the ranks per node, 0 otherwise) is --dp-shard = the ranks per node where
  // no data-parallel degree is given.
  ParallelDims resolve(int world, int hsdp_ranks) const;
};

// ---- training: what a training run does (train, compare, profile) -----------------------------
struct TrainOptions {
  RunOptions run;
  MemoryOptions memory;
  ModelOptions model;
  StrategyOptions strategy;
  MeshOptions mesh;
  std::string schedule = "cosine", optimizer = "adamw";
  int64_t seed = 1337;
  int64_t micro_batches = 0;  // --micro-batches: --accum under its pipeline name
  void add(Desc& d, TrainConfig& cfg);  // every group above, mesh, and the training flags
  // After parsing: what the options could not write directly (enums, the model, the transport,
  // the mesh resolved against `world`: the ranks running, or profile's --world). With --resume and
  // no model flag, the model is the checkpoint's (its manifest's spec; cfg.model_origin says so).
  void finish(TrainConfig& cfg, const Context& ctx, int world) const;
  // The run's backend; --threads 0 on the cpu picks 1 thread for a step whose products are too small
  // for more to pay (step_too_small_for_threads), else the node's idle cores shared by its ranks.
  std::unique_ptr<Backend> backend(const Context& ctx, const TrainConfig& cfg) const;

 private:
  std::optional<ModelSpec> resume_spec(TrainConfig& cfg) const;
};

// The optimizer's and the schedule's flags (optim_options.cpp): --lr, --schedule, --warmup-steps,
// --min-lr-frac, --lr-decay-steps, --optimizer and its hyper-parameters, --grad-clip.
void add_optimizer(Desc& g, TrainConfig& cfg, std::string& schedule, std::string& optimizer);

// Flags the user gave (never defaults) that the run does not use (docs/commands.md): a strategy's
// own flags (--bucket-mb: ddp; --reshard-after-forward, --prefetch, --max-gathered: zero3) and the
// optimizer's and schedule's. `kinds` are the strategies the command runs: one (train) refuses such
// a flag, naming it and what it applies to; several (compare, profile) refuse a flag none of them
// uses and warn once (rank 0) about one that only some use. `several` also refuses --strategy.
// Warns (rank 0) when the warmup is longer than the run. Sets what a default depends on another flag
// for: Muon's --momentum (0.95 unless given).
void check_applicable(const po::variables_map& given, TrainConfig& cfg, const std::vector<StrategyKind>& kinds,
                      bool several, const char* command, int rank);

// ---- device rates: plan's time model (plan, bench-plan-validation) --------------------------------
struct DeviceRateOptions {
  std::string gpu;  // the preset (its default is the command's)
  double peak = 0, hbm = 0, nvlink = 0, network = 0, host_link = 0;  // 0 = the preset's
  Achievable achievable;
  // --gpu --peak-tflops --hbm-gbs --nvlink-gbs --network-gbs --host-link-gbs --gemm-fraction
  // --gemm-knee --memory-fraction --nvlink-fraction --network-fraction
  void add(Desc& d, const std::string& default_gpu);
  // The preset's rates with the overrides, each naming its flag as its source; InputError for a
  // negative rate or a share outside (0, 1].
  DeviceRates rates() const;
};

// ---- report: files a command writes (rank 0) --------------------------------------------------
struct ReportOptions {
  std::string json, html, trace;
  // Each non-null text says what that file holds in this command; a null one leaves the flag out.
  void add(Desc& d, const char* json_what, const char* html_what, const char* trace_what);
  bool any() const { return !json.empty() || !html.empty() || !trace.empty(); }
  // Each given file can be written (probe_output_file), checked `when` ("before the first step").
  void check(const char* when) const;
};

// ---- single flags that several commands share -------------------------------------------------
// Each declares one flag; `help` is the command's text for it.
template <class T>
void add_steps(Desc& d, T& steps, const char* help);  // --steps (int, int64_t)
void add_batch(Desc& d, int64_t& batch, const char* help);
void add_warmup(Desc& d, int& calls, const char* help);  // --warmup: untimed runs before timing
void add_seed(Desc& d, int64_t& seed, const char* help);
void add_init(Desc& d, std::string& path, const char* help);
void add_resume(Desc& d, std::string& path, const char* help);
void add_tokenizer(Desc& d, std::string& dir, const char* purpose);
void add_dtype(Desc& d, std::string& dtype, const char* help);  // --dtype: f32, bf16 or f16
void add_world(Desc& d, int& world, const char* help);
void add_strategies(Desc& d, std::string& list, const char* help);
void add_measure(Desc& d, bool& on, const char* help);  // a switch: also run real steps
void add_measure_steps(Desc& d, int& steps, const char* help);
// A switch: --name, --name true|false|1|0, --name=VALUE. Every boolean flag is one.
// --strategies as compare and profile take it: the list parsed, without dp under tensor
// parallelism (the single-master baseline refuses it) when the list is the default, said on rank
// 0's stdout; an explicit dp with --tp > 1 is an InputError.
std::vector<StrategyKind> strategies_for(const std::string& list, const po::variables_map& given,
                                         const ParallelDims& dims, const char* command, int rank);
void add_switch(Desc& d, const char* name, bool& value, const char* help);

}  // namespace cli
}  // namespace shardlab
