// trainer.hpp — training under any strategy and mesh (data, tensor, pipeline, context and expert
// parallelism, through the ParallelModel): data -> units (through the strategy's hooks) -> loss ->
// backward -> global-norm clip -> optimizer, with a progress line per step, a final summary and an
// optional JSONL log. One rank is world size 1 of the same code.
#pragma once
#include <cmath>
#include <cstdio>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>

#include "memory/estimate.hpp"
#include "src/checkpoint/async_save.hpp"
#include "optim/optimizer.hpp"
#include "shard/strategy.hpp"
#include "src/checkpoint/dir_lock.hpp"
#include "src/data/data.hpp"
#include "shard/parallel_model.hpp"
#include "shard/step_config.hpp"
#include "src/data/tokenizer.hpp"
#include "src/train/sample.hpp"

namespace shardlab {

struct CheckpointState;  // checkpoint.hpp
struct DataRecord;       // checkpoint_format.hpp
struct CarriedTokenizer;  // checkpoint.hpp

// SIGTERM and SIGUSR1 ask a run to save and stop after the current step (run.cpp); so does a first
// SIGINT (Ctrl-C) when `sigint_saves` (there is a --save-dir); otherwise, or at a second SIGINT, the
// process exits 130 at once. SIGUSR2 is SIGINT: the --nproc launcher's Ctrl-C, passed on through mpirun. Every run installs this; it is here for the test that signals a process
// busy in GEMMs.
void install_stop_signals(bool sigint_saves = false);
int stop_signal();  // the last stop signal received since install_stop_signals (0 = none)

// A run: the steps (StepConfig's fields: spec, strategy, accum, seed, optim, schedule, grad_clip,
// comm, checkpointing) and everything around them.
struct TrainConfig : StepConfig {
  std::string data = "synthetic";
  int64_t steps = 200;
  int64_t batch = 8;  // global, in sequences: world x micro-batch x accum
  std::string init;          // safetensors to start from
  std::string log_path;      // JSONL, one object per step (rank 0)
  std::string save_path;     // safetensors written at the end (rank 0)
  bool save_overwrite = false;  // --save-overwrite: replace weights at save_path no shardlab export wrote
  int64_t print_every = 1;   // progress line every k steps (and the first and last)
  bool record_step = false;  // keep the last step's allocation timeline and collectives (reports)
  // The reports written at the end ((flag, path): --json, --html, --trace): locked from before the
  // first step as --log is, so a second live run cannot write them too (dir_lock.hpp's OutputLock).
  std::vector<std::pair<std::string, std::string>> report_outputs;
  // --inter-node-gbs: an emulated link between nodes (--ranks-per-node): every collective on a group
  // that spans nodes takes at least its bus bytes / this rate (Mesh::pace_inter_node); 0 = off.
  double inter_node_gbs = 0;
  std::string save_dir;      // checkpoints go to save_dir/step_XXXXXXXX
  int64_t save_every = 0;    // steps between checkpoints (0 = only with --save-dir, at the end)
  int64_t save_keep = 0;     // keep the newest K complete checkpoints (0 = all)
  double term_grace_s = 30;  // --term-grace: a stop not reached at a step boundary within it exits 143 (term_grace.hpp)
  bool save_async = false;   // write checkpoints in the background (AsyncCheckpoint): the step waits for one copy
  std::string resume;        // "" = start fresh, "auto" = the newest in save_dir, or a checkpoint path
  std::string run_id;        // --run-id: the run's name ("" = the resumed checkpoint's, or a new one)
  int64_t lr_decay_steps = 0;        // the cosine's horizon (schedule.total_steps); 0 = steps
  bool allow_schedule_change = false;  // a resume may change the schedule or optimizer settings (noted)
  bool allow_data_growth = false;      // a resume may read --data's files followed by new ones (noted)
  bool skip_nonfinite = false;      // a non-finite loss or gradient norm skips the update instead of stopping
  int64_t max_skipped_steps = 10;   // ... at most this many steps in a row, then the run stops (non-zero)
  bool check_collectives = false;  // compare every collective's fingerprint across ranks first
  bool shuffle = false;            // permute each epoch's sequences from (seed, epoch) (data.hpp)
  // Validation: a separate source, or the last val_fraction of the token stream (never trained on).
  std::string val_data;       // "" = none
  double val_fraction = 0;    // 0 = none
  int64_t val_every = 0;      // validate every K steps; 0 = at the end only (when there is a source)
  int64_t val_batches = 8;    // global batches of the validation set (at most the whole ones it holds)
  bool save_best = false;     // keep save_dir/best -> the checkpoint of the lowest validation loss
  int64_t sample_every = 0;   // print a sample from rank 0 every K steps (0 = never)
  std::string sample_prompt;  // its prompt (encode_prompt); "" = a newline (byte-level) or token 0
  std::shared_ptr<const Tokenizer> tokenizer;  // --tokenizer: prompts, samples and text --data as tokens
  SampleConfig sample;        // its length, temperature, top-k; seed = --seed, stream = the step
  // The CPU's sgemm ceiling of the whole job (the ranks' sum, FLOP/s) on this step's products:
  // the progress line, the summary and the log give the model FLOP/s as a share of it (0 = unknown:
  // GFLOP/s only). The header's line says where it came from (cmd_train: --sgemm-ceiling).
  double sgemm_ceiling = 0;
  std::string sgemm_ceiling_note;
  // When the step's products are too costly to time (sgemm_ceiling 0): the job's sgemm FLOP/s on a
  // small probe's products, for the header's lower bound on a long step's time (0: none).
  double sgemm_probe = 0;
  // The links between the job's hosts (link_probe.hpp): timed at start ("" on one host), and again
  // every check_links_every steps (0 = never) through check_links (empty on one host; collective).
  std::string links_note;
  int64_t check_links_every = 0;
  std::function<std::string()> check_links;
  std::string model_origin;    // the header's "model:" line when the model is not the flags' ("" = it is)
  std::string options_origin;  // the header's "options:" line, where each non-default came from ("" = none)
  bool has_validation() const { return !val_data.empty() || val_fraction != 0; }
  // Whether a run validates after step t (0-based): every val_every steps, and after the last.
  bool validates_after(int64_t t) const { return (val_every > 0 && (t + 1) % val_every == 0) || t + 1 == steps; }
  void validate(int world) const;
};

struct StepStats {
  int64_t step = 0;  // 1-based
  float loss = 0, lr = 0, grad_norm = 0;
  double ms = 0, tokens_per_s = 0;
  uint64_t peak_bytes = 0;   // this rank, this step
  uint64_t host_peak_bytes = 0;  // this rank's host tier (--offload), this step
  double comm_bytes = 0;     // this rank, this step (bus bytes)
  uint64_t rss_bytes = 0;    // this process's resident memory after the step (/proc)
  std::optional<float> val_loss;  // on the steps that validate (Trainer::run)
  double flops_per_s = 0;    // the whole job's model FLOP/s: 6N + 6LCT per token (flops_per_token)
  double elapsed_s = 0;      // since this process's first step began (Trainer::run)
  // Under --cp and --ep: this rank's time in each of those groups' collectives this step (the K/V
  // exchanges; the experts' all-to-alls: dispatch, combine, counts), waits for slower peers
  // included, an entry per active group (ParallelModel::take_axis_waits_s).
  struct AxisWait {
    CommAxis axis;
    double ms = 0;
  };
  std::vector<AxisWait> axis_waits;
  // --ranks-per-node: this rank's bus bytes of the step on groups inside a node and on groups that
  // span nodes (Mesh::crosses_nodes).
  std::optional<double> intra_node_bytes, inter_node_bytes;
  // A mixture-of-experts model: the auxiliary (load-balancing) loss, the mean over micro-steps
  // (`loss` is the cross-entropy alone; the objective is loss + router_aux_loss_coef x aux_loss);
  // the expert load's imbalance, max / mean top-k choices per expert over all layers; the slots
  // dropped past capacity (--moe-capacity-factor), every rank's.
  std::optional<float> aux_loss;
  std::optional<double> expert_imbalance, dropped_slots;
  // DeepSeek-V3's sigmoid router: the largest max / mean load of any one MoE layer.
  std::optional<double> worst_layer_imbalance;
  // --optimizer muon: this rank's update (the momentum, the exchanges, the iterations it owns), ms.
  std::optional<double> optimizer_ms;
};

class Trainer {
 public:
  // Tokens come from cfg.data unless `tokens` is given (predictions pass a stand-in stream).
  Trainer(Backend& be, Pool& pool, Communicator& comm, TrainConfig cfg,
          std::shared_ptr<const TokenStream> tokens = nullptr);
  StepStats step(int64_t t);  // t is 0-based
  // Collective: the mean loss over the first val_batches() global batches of the validation set,
  // forward only (parameters, gradients and optimizer state untouched). Each rank computes its
  // slice of each batch, so the sequences, and the value, are the same at any world size and strategy.
  float evaluate();
  bool has_validation() const { return val_loader_ != nullptr; }
  // Collective: `prompt` followed by c.tokens sampled tokens, forward only through the strategy's
  // hooks (the context is the last `seq` tokens); every rank returns the same tokens. With
  // c.kv_cache and units that decode (decode.hpp), the prompt runs once and each token after it
  // one position; past seq tokens every token prefills the window again, as a whole forward would.
  // on_token, when given, sees each sampled token as soon as it is drawn (streaming).
  std::vector<int32_t> generate(std::vector<int32_t> prompt, const SampleConfig& c,
                                const std::function<void(int32_t)>& on_token = {});
  int64_t val_batches() const { return val_batches_; }
  int64_t start_step() const { return start_step_; }  // after a resume: the steps already done
  int64_t skipped_steps() const { return skipped_steps_; }  // non-finite steps skipped (--skip-nonfinite)
  // The whole run: progress to `out` (rank 0), the JSONL log, checkpoints, the final save. On
  // SIGTERM or SIGUSR1 at any rank, every rank finishes the step in progress, they agree on it,
  // save a checkpoint to --save-dir and return (InputError without a --save-dir). Returns the last step.
  StepStats run(std::FILE* out);
  bool interrupted() const { return interrupted_; }  // run() stopped on SIGINT (after saving): exit 130
  // Every step run() has finished in this process, validation included (the run report's curves);
  // kept only with record_step (the reports), so that a long run's memory does not grow.
  const std::vector<StepStats>& history() const { return history_; }
  Strategy& strategy() { return *strategy_; }
  const std::vector<std::unique_ptr<Unit>>& units() const { return model_.units(); }
  int64_t num_params() const { return num_params_; }
  const TrainConfig& config() const { return cfg_; }
  Communicator& comm() { return comm_; }  // the world
  Mesh& mesh() { return mesh_; }          // its axes: data-parallel rank and size come from here
  Backend& backend() { return be_; }
  // Collective: the model's parameters, gathered, and written as HF-named safetensors by rank 0.
  // --save: collective; rank 0 returns what config.json kept of the model's original (or "").
  std::string save(const std::string& path);
  // This rank's last step as the ledger recorded it (the measured counterpart of a prediction;
  // src/compare/memory_row.hpp puts the two side by side).
  Estimate measured_step() const;
  // The last evaluation or sample (forward only) as the ledger recorded it: its peak and composition.
  Estimate measured_eval() const;
  std::vector<std::string> unit_names() const;
  const Ledger& ledger() const { return pool_.ledger(); }  // this rank's pool's (timeline: the last step's)
  // Under --pp: this rank's last training step, action by action (its measured bubble).
  const PipelineTiming& pipeline_timing() const { return pipe_timing_; }
  int pipeline_rank() const { return mesh_.rank(CommAxis::pp); }

 private:
  class EvalScope;
  CheckpointState checkpoint_state();  // what save_checkpoint and load_checkpoint work on
  void print_header(std::FILE* out) const;
  std::string strategy_group() const;  // the header's group the strategy works over, when not the world
  std::string log_header() const;  // the --log's first record of this run (start, or resume)
  void open_outputs(std::ofstream& log);
  void save_final(std::FILE* out);  // --save at the end, the weights kept in a checkpoint if it fails
  bool stop_requested(int64_t done, bool saved, std::FILE* out);
  bool maybe_validate(int64_t t, StepStats& s, std::FILE* out);
  // One global batch (index t of `loader`) as the parallel model reads it.
  static BatchFill batch_fill(BatchLoader& loader, int64_t t);
  void maybe_sample(int64_t t, std::FILE* out);
  bool maybe_checkpoint(int64_t t, bool new_best, std::FILE* out);
  void finish_pending_save(std::FILE* out);  // --save-async: the save in flight, completed (collective)
  // A mixture of experts' step (collective): the auxiliary loss and the routing's statistics into s,
  // and what each correction bias moves by (MoeRouting::bias_steps; empty without a move).
  std::vector<float> take_routing(StepStats& s);
  // DeepSeek-V3's balancing: each MoE layer's correction bias moved by `steps` (MoeRouting::bias_steps,
  // referenced, not copied) with the optimizer's update; no edit when empty.
  ParamEdit bias_edit(const std::vector<float>& steps) const;

  Backend& be_;
  Pool& pool_;
  Communicator& comm_;
  TrainConfig cfg_;
  Mesh mesh_;
  struct Streams {
    std::shared_ptr<const TokenStream> train, val;  // val null without validation
  };
  static Streams load_streams(const TrainConfig& cfg, std::shared_ptr<const TokenStream> tokens);
  Streams data_;
  BatchLoader loader_;
  std::unique_ptr<BatchLoader> val_loader_;  // one global batch per "step", no shuffle
  int64_t val_batches_ = 0;
  std::optional<float> checkpoint_val_loss_;  // computed at the step being checkpointed (its manifest records it)
  float best_val_loss_ = INFINITY;  // --save-best: the lowest so far (from the best checkpoint on resume)
  ParallelModel model_;  // this rank's part of the model under every axis, and their cross-axis work
  PipelineTiming pipe_timing_;  // the last training step's under --pp (the executor fills it)
  std::unique_ptr<Strategy> strategy_;
  std::vector<std::unique_ptr<RunLock>> output_locks_;  // rank 0: --log's and the reports' (OutputLock)
  std::unique_ptr<SaveDirLock> save_lock_;  // rank 0, from the checks before step 1 to the end (dir_lock.hpp)
  std::unique_ptr<AsyncCheckpoint> pending_save_;  // --save-async: the checkpoint being written, if any
  std::vector<float> save_buffer_;  // --save-async: its host buffer between saves (one checkpoint's worth)
  int64_t num_params_ = 0;
  double flops_per_token_ = 0;  // the family's model FLOPs per token (the progress line's rate)
  CategoryBytes states_{}, host_states_{};  // ledger after set-up, per tier
  int64_t start_step_ = 0;
  int64_t skipped_steps_ = 0;
  int64_t skipped_in_a_row_ = 0;  // the current run of skipped steps (--max-skipped-steps bounds it)
  bool interrupted_ = false;
  std::string resumed_from_;
  std::string run_id_;  // recorded in checkpoints and the log; "" in predictions
  std::shared_ptr<const DataRecord> data_record_;  // with --save-dir or --resume: what checkpoints record
  std::shared_ptr<const CarriedTokenizer> carried_tokenizer_;  // rank 0, with a --save-dir: tokenizer.json
  std::shared_ptr<const CarriedConfig> carried_config_;  // rank 0: --init's config.json, or a resumed checkpoint's
  std::vector<StepStats> history_;  // run()'s steps
  Ledger::Peaks eval_peaks_;  // of the last evaluation (EvalScope)
};

}  // namespace shardlab
