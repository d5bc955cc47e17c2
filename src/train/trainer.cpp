// trainer.cpp — the Trainer's set-up (data, units, strategy, init or resume), one step,
// evaluation, sampling and the memory figures. The run loop around the steps is in run.cpp.
#include "src/train/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <csignal>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "src/core/units.hpp"
#include "src/model/blocks/attention.hpp"
#include "src/model/blocks/moe.hpp"
#include "src/model/decode.hpp"
#include "src/model/model.hpp"
#include "src/model/safetensors.hpp"
#include "src/checkpoint/checkpoint.hpp"
#include "src/checkpoint/checkpoint_format.hpp"
#include "src/model/hf_dir.hpp"
#include "src/checkpoint/dir_lock.hpp"
#include "shard/pipeline/executor.hpp"
#include "src/train/predict.hpp"
#include "src/train/term_grace.hpp"

namespace shardlab {

void TrainConfig::validate(int world) const {
  spec.validate();
  validate_strategy();
  SHARD_REQUIRE(steps >= 1, "--steps {}: expected at least one step", steps);
  SHARD_REQUIRE(lr_decay_steps >= 0, "--lr-decay-steps {}: expected a step count (0 = --steps)", lr_decay_steps);
  SHARD_REQUIRE(!allow_schedule_change || !resume.empty(),
                "--allow-schedule-change applies to a resume (--resume): without one there is nothing to change");
  SHARD_REQUIRE(!allow_data_growth || !resume.empty(),
                "--allow-data-growth applies to a resume (--resume): without one there is nothing to grow");
  SHARD_REQUIRE(checkpointing == Checkpointing::none || spec.layers >= 2,
                "--activation-checkpointing {} with a one-block model (--layers 1): there is nothing to trade; use none",
                checkpointing_name(checkpointing));
  SHARD_REQUIRE(batch >= 1, "--batch {}: expected at least one sequence", batch);
  SHARD_REQUIRE(accum >= 1, "--accum {}: expected at least one micro-step", accum);
  layout.validate(spec, strategy, batch, accum, world);
  SHARD_REQUIRE(grad_clip >= 0.f, "--grad-clip {}: expected 0 (off) or a positive norm", grad_clip);
  SHARD_REQUIRE(print_every >= 1, "--print-every {}: expected a positive count", print_every);
  SHARD_REQUIRE(save_every >= 0, "--save-every {}: expected 0 or a positive number of steps", save_every);
  SHARD_REQUIRE(save_every == 0 || !save_dir.empty(), "--save-every {} needs --save-dir", save_every);
  SHARD_REQUIRE(save_keep >= 0, "--save-keep {}: expected 0 (keep all) or a positive count", save_keep);
  SHARD_REQUIRE(save_keep == 0 || !save_dir.empty(), "--save-keep {} needs --save-dir", save_keep);
  SHARD_REQUIRE(std::isfinite(term_grace_s) && term_grace_s >= 0 && term_grace_s <= 86400,
                "--term-grace {}: expected seconds from 0 (wait for the step) to 86400", term_grace_s);
  SHARD_REQUIRE(resume != "auto" || !save_dir.empty(), "--resume auto needs --save-dir (where to look)");
  if (!run_id.empty()) validate_run_id(run_id);
  SHARD_REQUIRE(val_fraction == 0 || (val_fraction > 0 && val_fraction < 1),
                "--val-fraction {}: expected a fraction between 0 and 1 (exclusive)", val_fraction);
  SHARD_REQUIRE(max_skipped_steps >= 1, "--max-skipped-steps {}: expected at least 1", max_skipped_steps);
  SHARD_REQUIRE(val_data.empty() || val_fraction == 0, "--val-data '{}' and --val-fraction {} both given: choose one "
                "validation source", val_data, val_fraction);
  SHARD_REQUIRE(val_every >= 0, "--val-every {}: expected 0 (at the end) or a positive number of steps", val_every);
  SHARD_REQUIRE(val_every == 0 || has_validation(),
                "--val-every {} needs a validation source: --val-data SRC or --val-fraction F", val_every);
  SHARD_REQUIRE(val_batches >= 1, "--val-batches {}: expected at least one batch", val_batches);
  SHARD_REQUIRE(sample_every >= 0, "--sample-every {}: expected 0 (never) or a positive number of steps", sample_every);
  if (sample_every > 0) {
    sample.validate(spec.vocab);
    SHARD_REQUIRE(static_cast<int64_t>(encode_prompt(sample_prompt, spec.vocab, tokenizer.get()).size()) <= spec.seq,
                  "--sample-prompt is longer than the model's {} positions", spec.seq);
  }
  SHARD_REQUIRE(!save_best || !save_dir.empty(), "--save-best needs --save-dir (where the checkpoints go)");
  SHARD_REQUIRE(!save_async || !save_dir.empty(), "--save-async writes --save-dir's checkpoints in the background: it "
                "needs --save-dir");
  SHARD_REQUIRE(!save_best || has_validation(),
                "--save-best needs a validation source (--val-data SRC or --val-fraction F) to rank checkpoints by");
  optim.validate();
  // Muon's update runs where the state is: offload's host update has no collectives to bring a
  // matrix whole. Refused, not run as another optimizer.
  SHARD_REQUIRE(optim.kind != OptimizerKind::muon || strategy.offload == Offload::none, "--optimizer muon with "
                "--offload {}: not supported yet (the host update cannot bring a matrix whole); leave --offload out",
                offload_name(strategy.offload));
  schedule.validate();
}

Trainer::Streams Trainer::load_streams(const TrainConfig& cfg, std::shared_ptr<const TokenStream> tokens) {
  // A stand-in stream (predictions) is split only for a predicted evaluation (val_fraction).
  if (tokens && cfg.val_fraction == 0) return {std::move(tokens), nullptr};
  if (tokens) {
    auto train = std::make_shared<TokenStream>(*tokens);
    auto val = std::make_shared<TokenStream>(split_tail(*train, cfg.val_fraction));
    return {std::move(train), std::move(val)};
  }
  auto train = std::make_shared<TokenStream>(load_tokens(cfg.data, cfg.spec.vocab, cfg.tokenizer.get()));
  std::shared_ptr<TokenStream> val;
  if (cfg.val_fraction != 0) val = std::make_shared<TokenStream>(split_tail(*train, cfg.val_fraction));
  else if (!cfg.val_data.empty())
    val = std::make_shared<TokenStream>(load_tokens(cfg.val_data, cfg.spec.vocab, cfg.tokenizer.get()));
  return {std::move(train), std::move(val)};
}

namespace {
TrainConfig checked(TrainConfig cfg, int world, Device device) {
  cfg.validate(world);
  blocks::check_attention_kernel(cfg.spec, device);
  cfg.layout.dims = cfg.layout.dims.resolved(world);
  cfg.schedule.total_steps = cfg.lr_decay_steps > 0 ? cfg.lr_decay_steps : cfg.steps;
  return cfg;
}

// --prefetch auto resolved against the pool's budgets (predict.hpp), the same depth on every rank.
TrainConfig with_prefetch(TrainConfig cfg, Pool& pool, Communicator& comm) {
  if (cfg.strategy.prefetch != kPrefetchAuto) return cfg;
  const int64_t micro = cfg.batch / cfg.layout.dims.dp() / cfg.accum;
  const int d = auto_prefetch(cfg, comm.world_size(), comm.rank(), micro, PoolConfig{pool.budget(), pool.host().budget()});
  cfg.strategy.prefetch = static_cast<int>(-comm.all_max(-static_cast<int64_t>(d)));
  return cfg;
}

// What checkpoints carry of the tokenizer: the run's --tokenizer, or bytes as tokens for a text
// file read without one; nothing for synthetic or llm.c tokens (no text).
std::shared_ptr<const CarriedTokenizer> carried_tokenizer(const TrainConfig& cfg) {
  if (cfg.tokenizer)
    return std::make_shared<CarriedTokenizer>(cfg.tokenizer->to_hf_json().dump() + "\n", cfg.tokenizer->source());
  if (is_text_source(cfg.data)) return std::make_shared<CarriedTokenizer>(byte_tokenizer_json().dump() + "\n", "bytes");
  return nullptr;
}
// The model's original config.json, which checkpoints and --save carry: an --init directory's, or
// the resumed checkpoint's (rank 0 writes both).
std::shared_ptr<const CarriedConfig> carried_config(const std::string& init, const std::string& resume) {
  if (!init.empty() && is_hf_model_dir(init)) {
    const std::string file = (std::filesystem::path(init) / kHfConfigFile).string();
    std::ifstream f(file, std::ios::binary);
    SHARD_REQUIRE(f.good(), "--init {}: cannot read {}", init, file);
    return std::make_shared<CarriedConfig>(std::string(std::istreambuf_iterator<char>(f), {}), file);
  }
  if (resume.empty()) return nullptr;
  const Manifest m = read_manifest(resume);
  if (!m.hf_config) return nullptr;
  return std::make_shared<CarriedConfig>(read_checkpoint_hf_config(resume, m), m.hf_config->source);
}
}  // namespace

Trainer::Trainer(Backend& be, Pool& pool, Communicator& comm, TrainConfig cfg,
                 std::shared_ptr<const TokenStream> tokens)
    : be_(be),
      pool_(pool),
      comm_(comm),
      cfg_(with_prefetch(checked(std::move(cfg), comm.world_size(), be.device()), pool, comm)),
      mesh_(comm, cfg_.layout.dims, cfg_.layout.ranks_per_node, cfg_.strategy.zeropp.hierarchical()),
      data_(load_streams(cfg_, tokens)),  // tokens kept: the body asks whether a stand-in was given
      loader_(*data_.train, cfg_.spec.seq, cfg_.batch, ShuffleConfig{cfg_.shuffle, cfg_.seed}),
      model_(ParallelModelConfig{cfg_.spec, cfg_.layout, cfg_.batch, cfg_.accum, cfg_.checkpointing}, mesh_, be, pool) {
  SHARD_REQUIRE(cfg_.inter_node_gbs >= 0 && (cfg_.inter_node_gbs == 0 || cfg_.layout.ranks_per_node > 0),
                "--inter-node-gbs {} emulates the link between nodes: it needs --ranks-per-node", cfg_.inter_node_gbs);
  if (cfg_.inter_node_gbs > 0) mesh_.pace_inter_node(cfg_.inter_node_gbs * 1e9);
  num_params_ = shardlab::num_params(family_of(cfg_.spec).layout(cfg_.spec));  // the whole model's, whatever this rank holds
  flops_per_token_ = family_of(cfg_.spec).flops_per_token(cfg_.spec);  // once: it builds the layout
  if (data_.val) {
    const int64_t T = cfg_.spec.seq, n = data_.val->size();
    const int64_t sequences = n >= T + 1 ? (n - 1) / T : 0;
    // A stand-in (predictions: values never read) holds one sequence, which the loader repeats:
    // the memory of an evaluation does not depend on the tokens, and a world-sized batch of them
    // took gigabytes at 2^18 simulated ranks.
    SHARD_REQUIRE(tokens || sequences >= cfg_.batch, "the validation set '{}' holds {} tokens: {} sequences of {} (+1 "
                  "target), fewer than one global batch of {} (--batch)", data_.val->source, n, sequences, T, cfg_.batch);
    // The split's other side too: fewer sequences than a batch would train on repeats of them.
    SHARD_REQUIRE(tokens || cfg_.val_fraction == 0 || loader_.num_sequences() >= cfg_.batch,
                  "--val-fraction {} leaves '{}' {} tokens for training: {} sequences of {} (+1 target), fewer than "
                  "one global batch of {} (--batch); lower --val-fraction", cfg_.val_fraction, data_.train->source,
                  data_.train->size(), loader_.num_sequences(), T, cfg_.batch);
    val_loader_ = std::make_unique<BatchLoader>(*data_.val, T, cfg_.batch);
    val_batches_ = tokens ? cfg_.val_batches : std::min(cfg_.val_batches, sequences / cfg_.batch);
  }
  comm_.set_check(cfg_.check_collectives);
  strategy_ = make_strategy(cfg_.strategy, StrategyEnv{be_, pool_, mesh_.edp_cp(), mesh_, cfg_.spec, model_.units(), cfg_.optim});
  model_.attach(*strategy_);
  SHARD_REQUIRE(cfg_.init.empty() || cfg_.resume.empty(), "--init and --resume both given: choose one start");
  // On the meta backend (predictions) values are never read: computing them would only cost time.
  if (be_.device() != Device::meta) {
    if (cfg_.init.empty()) strategy_->init_params(cfg_.seed);
    else strategy_->load_params(cfg_.init);
  }
  std::string from = cfg_.resume == "auto" ? latest_checkpoint(cfg_.save_dir) : cfg_.resume;
  run_id_ = cfg_.run_id;  // a checkpoint loaded below must carry it, when given
  if (!tokens && (!cfg_.save_dir.empty() || !from.empty())) {
    auto d = std::make_shared<DataRecord>();
    d->train = describe_source(cfg_.data);
    d->batch = cfg_.batch;
    d->seq = cfg_.spec.seq;
    if (!cfg_.val_data.empty()) d->val_data = describe_source(cfg_.val_data);
    d->val_fraction = cfg_.val_fraction;
    data_record_ = std::move(d);
    if (comm_.rank() == 0) carried_tokenizer_ = carried_tokenizer(cfg_);  // rank 0 writes the manifest
  }
  if (comm_.rank() == 0) carried_config_ = carried_config(cfg_.init, from);
  if (!from.empty()) {
    const RunPosition at = load_checkpoint(from, checkpoint_state());
    start_step_ = at.step;
    if (comm_.rank() == 0)  // one line a note
      for (size_t a = 0; a < at.note.size();) {
        const size_t b = std::min(at.note.find('\n', a), at.note.size());
        std::fprintf(stderr, "shardlab train: note: %.*s\n", static_cast<int>(b - a), at.note.data() + a);
        a = b + 1;
      }
    SHARD_REQUIRE(start_step_ <= cfg_.steps, "checkpoint '{}' is at step {}, past --steps {}", from, start_step_,
                  cfg_.steps);
    resumed_from_ = from;
    if (run_id_.empty()) run_id_ = at.run_id;  // the run continues under its id
    if (cfg_.save_best) best_val_loss_ = best_checkpoint_val_loss(cfg_.save_dir);
  }
  if (run_id_.empty() && !tokens) run_id_ = comm_.all_gather_strings(comm_.rank() == 0 ? new_run_id() : "")[0];
  states_ = pool_.ledger().current_by_category();
  host_states_ = pool_.ledger().current_by_category(Tier::host);
  // The allocation timeline serves reports of the last step only: keep none otherwise.
  pool_.ledger().set_recording(cfg_.record_step);
}

BatchFill Trainer::batch_fill(BatchLoader& loader, int64_t t) {
  return [&loader, t](int64_t first, int64_t count, int32_t* in, int32_t* tg) { loader.fill(t, first, count, in, tg); };
}

namespace {
uint64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  unsigned long long pages = 0, resident = 0;
  if (f) {
    if (std::fscanf(f, "%llu %llu", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// Test hook (fault injection): SHARDLAB_FAULT_THROW_AT_STEP=R:S makes rank R throw at step S, so a
// test can check that one failing rank ends the whole job instead of leaving the others hanging.
void maybe_inject_throw(int rank, int64_t step) {
  const char* v = std::getenv("SHARDLAB_FAULT_THROW_AT_STEP");
  int r = -1;
  long long s = -1;
  if (v && std::sscanf(v, "%d:%lld", &r, &s) == 2 && r == rank && s == step)
    throw InternalError(fmt::format("fault injection: rank {} throws at step {}", rank, step));
  // SHARDLAB_FAULT_SIGNAL_AT_STEP=R:S: rank R's process is sent SIGTERM as step S starts (a
  // preemption that lands inside a given step), and the step goes on once the signal's thread has
  // recorded it (run.cpp's install_stop_signals; 10 s at most).
  v = std::getenv("SHARDLAB_FAULT_SIGNAL_AT_STEP");
  if (v && std::sscanf(v, "%d:%lld", &r, &s) == 2 && r == rank && s == step) {
    kill(getpid(), SIGTERM);
    for (int i = 0; i < 1000 && stop_signal() == 0; ++i) usleep(10000);
  }
  // SHARDLAB_FAULT_SLOW_STEP=R:S:SECONDS: rank R's step S takes that many seconds more (a step too
  // long for a stop to wait for: --term-grace).
  int seconds = 0;
  v = std::getenv("SHARDLAB_FAULT_SLOW_STEP");
  if (v && std::sscanf(v, "%d:%lld:%d", &r, &s, &seconds) == 3 && r == rank && s == step) sleep(seconds);
}
}  // namespace

std::vector<float> Trainer::take_routing(StepStats& s) {
  if (!cfg_.spec.moe.enabled()) return {};
  const ParallelModel::AuxStep m = model_.take_aux();
  s.aux_loss = static_cast<float>(m.aux_sum / static_cast<double>(cfg_.batch * cfg_.spec.seq));
  const MoeRouting routing(m.stats, cfg_.spec.moe.experts);
  s.expert_imbalance = routing.imbalance();
  s.dropped_slots = routing.dropped;
  s.worst_layer_imbalance = routing.worst_layer_imbalance();
  if (cfg_.spec.moe.bias_rate <= 0) return {};
  return routing.bias_steps(cfg_.spec.moe.bias_rate);
}

// The correction biases' move (DeepSeek-V3's auxiliary-loss-free balancing) as an edit of the
// parameters: steps holds γ sign(mean - load) per (MoE layer, expert) (MoeRouting::bias_steps); none
// when empty.
ParamEdit Trainer::bias_edit(const std::vector<float>& steps) const {
  if (steps.empty()) return {};
  ParamEdit e;
  e.pick = [](const TensorDecl& t) { return t.name.ends_with(kCorrectionBias); };
  const int64_t E = cfg_.spec.moe.experts, dense = cfg_.spec.moe.dense_layers;
  e.fn = [&steps, E, dense](const UnitLayout& unit, const TensorDecl& t, int64_t first, std::span<float> values) {
    const int64_t layer = correction_bias_layer(t) - dense;
    SHARD_CHECK(layer >= 0 && (layer + 1) * E <= static_cast<int64_t>(steps.size()) && first + std::ssize(values) <= E,
                "correction bias {} of unit {}: no loads for it ({} values for {} experts)", t.name, unit.name,
                steps.size(), E);
    for (size_t i = 0; i < values.size(); ++i) values[i] += steps[static_cast<size_t>(layer * E + first) + i];
  };
  return e;
}

StepStats Trainer::step(int64_t t) {
  term_grace_step(t + 1);
  maybe_inject_throw(comm_.rank(), t + 1);
  auto t0 = std::chrono::steady_clock::now();
  const int64_t T = cfg_.spec.seq;
  const float dlogit_scale = 1.f / static_cast<float>(cfg_.batch * T);  // d(global mean loss)
  pool_.ledger().reset_peaks();
  if (cfg_.record_step) {
    pool_.ledger().clear_timeline();
    comm_.stats().events.clear();
    comm_.stats().record_events = true;
  }
  const double comm_before = comm_.stats().total_bytes();
  pool_.ledger().set_phase({PhaseKind::begin_step});
  strategy_->begin_step();
  model_.take_axis_waits_s();  // what evaluation or sampling spent is not this step's
  float loss = model_.reduce_loss(model_.train(batch_fill(loader_, t), dlogit_scale, &pipe_timing_));
  loss /= static_cast<float>(cfg_.batch * T);
  StepStats s;
  const std::vector<float> bias_steps = take_routing(s);
  const std::optional<float> aux = s.aux_loss;
  pool_.ledger().set_phase({PhaseKind::optimizer});
  std::optional<double> optimizer_ms;
  model_.sync_tied_grads();
  const float norm = static_cast<float>(std::sqrt(model_.grad_norm_sq()));
  const float lr = cfg_.schedule.at(t);
  // Every rank sees the same loss and norm, so every rank takes the same branch here.
  const bool finite = std::isfinite(loss) && std::isfinite(norm) && std::isfinite(aux.value_or(0.f));
  if (!finite && !cfg_.skip_nonfinite)
    throw InputError(fmt::format("step {}: the loss is {}{} and the gradient norm {}: stopping (lower --lr, or pass "
                                 "--skip-nonfinite to skip such steps)", t + 1, loss,
                                 aux ? fmt::format(" (auxiliary loss {})", *aux) : std::string(), norm));
  if (finite) {
    Backend::Range range(be_, "optimizer step");
    const auto update0 = std::chrono::steady_clock::now();
    strategy_->optimizer_step(t + 1, lr, clip_factor(norm, cfg_.grad_clip), bias_edit(bias_steps));
    if (cfg_.optim.kind == OptimizerKind::muon) {  // the norm's read-back above already waited for the device
      be_.synchronize();
      optimizer_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - update0).count();
    }
    skipped_in_a_row_ = 0;
  } else {
    ++skipped_steps_;
    SHARD_REQUIRE(++skipped_in_a_row_ <= cfg_.max_skipped_steps,
                  "steps {} to {}: {} steps in a row with a non-finite loss or gradient norm (the last: loss {}, norm "
                  "{}); --skip-nonfinite skips at most --max-skipped-steps {} in a row: stopping (lower --lr)",
                  t + 2 - skipped_in_a_row_, t + 1, skipped_in_a_row_, loss, norm, cfg_.max_skipped_steps);
  }
  pool_.ledger().set_phase({});
  be_.synchronize();
  comm_.stats().end_step();
  if (stop_signal() != 0) term_grace_honoured();  // at the step's end: the save that follows takes what it takes
  s.step = t + 1;
  s.loss = loss;
  s.lr = lr;
  s.grad_norm = norm;
  s.optimizer_ms = optimizer_ms;
  s.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  s.tokens_per_s = static_cast<double>(cfg_.batch * T) / (s.ms / 1e3);
  s.flops_per_s = flops_per_token_ * s.tokens_per_s;
  s.peak_bytes = pool_.ledger().peak_total();
  s.host_peak_bytes = pool_.ledger().peak_total(Tier::host);
  s.comm_bytes = comm_.stats().total_bytes() - comm_before;
  s.rss_bytes = resident_bytes();
  for (const auto& [axis, w] : model_.take_axis_waits_s()) s.axis_waits.push_back({axis, w * 1e3});
  if (cfg_.layout.ranks_per_node > 0) {
    const Mesh::LinkBytes link = mesh_.last_step_bytes_by_link();
    s.intra_node_bytes = link.intra, s.inter_node_bytes = link.inter;
  }
  return s;
}

// Evaluation and sampling are not part of a step: the scope keeps them out of the step's timeline,
// peaks and communication counts, and brackets them with the strategy's begin_eval/end_eval.
class Trainer::EvalScope {
 public:
  explicit EvalScope(Trainer& t)
      : t_(t), peaks_(t.pool_.ledger().peaks()), step_(t.comm_.stats().step), events_(t.comm_.stats().record_events) {
    t_.pool_.ledger().set_recording(false);
    t_.pool_.ledger().reset_peaks();  // the evaluation's own peak, kept in eval_peaks_
    t_.comm_.stats().record_events = false;
    t_.strategy_->begin_eval();
  }
  ~EvalScope() {
    t_.strategy_->end_eval();
    t_.eval_peaks_ = t_.pool_.ledger().peaks();
    t_.comm_.stats().step = step_;
    t_.comm_.stats().record_events = events_;
    t_.pool_.ledger().set_recording(t_.cfg_.record_step);
    t_.pool_.ledger().restore_peaks(peaks_);
  }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  Trainer& t_;
  Ledger::Peaks peaks_;
  std::array<OpCounter, kNumCommOps> step_;
  bool events_;
};

std::vector<int32_t> Trainer::generate(std::vector<int32_t> tokens, const SampleConfig& c,
                                      const std::function<void(int32_t)>& on_token) {
  c.validate(cfg_.spec.vocab);
  const int64_t T = cfg_.spec.seq, V = cfg_.spec.vocab;
  SHARD_REQUIRE(static_cast<int64_t>(tokens.size()) <= T, "the prompt has {} tokens, more than the model's {} positions",
                tokens.size(), T);
  if (tokens.empty()) tokens.push_back(cfg_.spec.vocab > 10 ? 10 : 0);  // a newline for byte-level models
  EvalScope scope(*this);
  std::vector<float> logits;
  std::optional<Decoder> decoder;
  if (c.kv_cache && Decoder::supported(units()) && model_.decodes()) decoder.emplace(units(), cfg_.spec, be_, pool_);
  for (int64_t i = 0; i < c.tokens; ++i) {
    const int64_t size = static_cast<int64_t>(tokens.size()), n = std::min(size, T);
    const std::span<const int32_t> context = std::span<const int32_t>(tokens).subspan(static_cast<size_t>(size - n));
    if (decoder && size <= T) {  // the cache holds every position but the newest (none at first)
      const int64_t fed = decoder->length();
      decoder->forward(std::span<const int32_t>(tokens).subspan(static_cast<size_t>(fed)), *strategy_, logits);
    } else if (decoder) {
      // Past seq positions the context slides: every position moves, so every key and value changes
      // (learned positions and RoPE alike), and the window is prefilled again, as a whole forward.
      decoder->reset();
      decoder->forward(context, *strategy_, logits);
    }
    if (!model_.last_logits(context, logits, decoder.has_value())) {  // another stage samples
      tokens.push_back(model_.share_token(0));
      if (on_token) on_token(tokens.back());
      continue;
    }
    const int64_t rows = static_cast<int64_t>(logits.size()) / V;  // the last row is the next token's
    tokens.push_back(sample_token(std::span<const float>(logits).subspan(static_cast<size_t>((rows - 1) * V), V), c, i));
    model_.share_token(tokens.back());
    if (on_token) on_token(tokens.back());
  }
  return tokens;
}

float Trainer::evaluate() {
  SHARD_REQUIRE(val_loader_, "no validation data: pass --val-data SRC or --val-fraction F");
  std::vector<float> sums(static_cast<size_t>(val_batches_), 0.f);  // per batch, this rank's share
  EvalScope scope(*this);
  for (int64_t i = 0; i < val_batches_; ++i)
    sums[static_cast<size_t>(i)] = static_cast<float>(model_.evaluate(batch_fill(*val_loader_, i)));
  mesh_.dp_cp().all_reduce(std::span<float>(sums)).wait();
  double total = 0;
  for (float v : sums) total += v;
  return static_cast<float>(total / static_cast<double>(val_batches_ * cfg_.batch * cfg_.spec.seq));
}

std::vector<std::string> Trainer::unit_names() const {
  std::vector<std::string> names;
  for (const auto& u : units()) names.push_back(u->name());
  return names;
}

Estimate Trainer::measured_step() const { return estimate_from_ledger(pool_.ledger(), states_, host_states_); }

Estimate Trainer::measured_eval() const {
  Estimate e;
  const Ledger::TierPeaks& d = eval_peaks_[static_cast<int>(Tier::device)];
  const Ledger::TierPeaks& h = eval_peaks_[static_cast<int>(Tier::host)];
  e.model_states = states_;
  e.peak_by_category = d.peak;
  e.at_peak = d.at_peak;
  e.peak = d.total;
  e.peak_phase = d.phase;
  e.host = {host_states_, h.peak, h.at_peak, h.total};
  return e;
}

// {"event": "start"} (or "resume", with the step and the checkpoint) and the run's configuration:
// model, mesh, strategy, ranks, batch, steps, data, tokenizer, seed, run id, learning rate and options.
std::string Trainer::log_header() const {
  nlohmann::json j = {{"event", resumed_from_.empty() ? "start" : "resume"},
                      {"step", start_step_},
                      {"model", cfg_.spec.describe()},
                      {"mesh", mesh_.dims().describe()},
                      {"strategy", cfg_.label()},
                      {"ranks", comm_.world_size()},
                      {"batch", cfg_.batch},
                      {"seq", cfg_.spec.seq},
                      {"steps", cfg_.steps},
                      {"data", data_.train->source},
                      {"tokenizer", cfg_.tokenizer ? cfg_.tokenizer->source() : is_text_source(cfg_.data) ? "bytes" : "none"},
                      {"seed", cfg_.seed},
                      {"run_id", run_id_},
                      {"lr", cfg_.schedule.lr},
                      {"options", cfg_.options_origin},
                      {"backend", be_.describe()}};
  if (!resumed_from_.empty()) j["from"] = resumed_from_;
  if (!cfg_.links_note.empty()) j["links"] = cfg_.links_note;
  return j.dump();
}

CheckpointState Trainer::checkpoint_state() {
  return CheckpointState{be_,   comm_,        *strategy_,         model_.units(),           cfg_,
                         cfg_.shuffle, data_record_.get(), carried_tokenizer_.get(), cfg_.steps,
                         cfg_.allow_schedule_change, cfg_.allow_data_growth, run_id_,
                         carried_config_.get()};
}

std::string Trainer::save(const std::string& path) {
  return carried_config_ ? model_.save(path, cfg_.save_overwrite, carried_config_->json, carried_config_->source)
                         : model_.save(path, cfg_.save_overwrite);
}

}  // namespace shardlab
