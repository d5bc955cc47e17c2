// trainer.cpp — the Trainer's set-up (data, units, strategy, init or resume), one step,
// evaluation, sampling and the memory figures. The run loop around the steps is in run.cpp.
#include "src/train/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <numeric>

#include <fmt/ranges.h>

#include "src/core/units.hpp"
#include "src/model/decode.hpp"
#include "src/model/model.hpp"
#include "src/model/safetensors.hpp"
#include "src/checkpoint/checkpoint.hpp"
#include "shard/pipeline/executor.hpp"
#include "src/train/predict.hpp"

namespace shardlab {

// The split and the schedule against the model's units, before any unit is built: every message
// names the values (schedule.cpp's explicit_split / build_schedule check the same as their contract).
void TrainConfig::validate_pipeline(int pp) const {
  const PipelineConfig& pc = pipeline;
  require_pp_schedule(pc.schedule, pp, pc.virtual_stages, accum);
  const std::vector<UnitLayout> layout = family_of(spec).layout(spec);
  const int units = static_cast<int>(layout.size()), chunks = pp * pc.virtual_stages;
  const std::string model = fmt::format("{} units ({} .. {})", units, layout.front().name, layout.back().name);
  SHARD_REQUIRE(chunks <= units, "--pp {} x --pp-virtual {} = {} stages, but the model has {}: every stage needs at "
                "least one", pp, pc.virtual_stages, chunks, model);
  if (pc.split.empty()) return;
  const std::string given = fmt::format("{}", fmt::join(pc.split, ","));
  SHARD_REQUIRE(static_cast<int>(pc.split.size()) == chunks,
                "--pp-split {} gives {} count{}; --pp {} x --pp-virtual {} needs {} (one per chunk)", given,
                pc.split.size(), pc.split.size() == 1 ? "" : "s", pp, pc.virtual_stages, chunks);
  SHARD_REQUIRE(std::all_of(pc.split.begin(), pc.split.end(), [](int c) { return c >= 1; }),
                "--pp-split {}: every chunk needs at least one unit", given);
  const int64_t sum = std::accumulate(pc.split.begin(), pc.split.end(), int64_t{0});
  SHARD_REQUIRE(sum == units, "--pp-split {} sums to {} units, but the model has {} ({} .. {})", given, sum, units,
                layout.front().name, layout.back().name);
}

void TrainConfig::validate(int world) const {
  spec.validate();
  strategy.validate();
  SHARD_REQUIRE(steps >= 1, "--steps {}: expected at least one step", steps);
  SHARD_REQUIRE(checkpointing == Checkpointing::none || spec.layers >= 2,
                "--activation-checkpointing {} with a one-block model (--layers 1): there is nothing to trade; use none",
                checkpointing_name(checkpointing));
  SHARD_REQUIRE(batch >= 1, "--batch {}: expected at least one sequence", batch);
  SHARD_REQUIRE(accum >= 1, "--accum {}: expected at least one micro-step", accum);
  const ParallelDims dims = strategy.dims.resolved(world);
  const int dp = dims.dp();
  SHARD_REQUIRE(batch % (static_cast<int64_t>(dp) * accum) == 0,
                "--batch {} is not divisible by {} data-parallel ranks x --accum {}: every rank needs whole "
                "micro-batches",
                batch, dp, accum);
  SHARD_REQUIRE(!sequence_parallel || dims.tp > 1,
                "--sequence-parallel splits activations over the tensor-parallel group: it needs --tp 2 or more");
  if (sequence_parallel) {
    const int64_t rows = batch / dp / accum * spec.seq;
    SHARD_REQUIRE(rows % dims.tp == 0,
                  "--sequence-parallel: a micro-batch's {} token rows ({} sequences of {}) do not split over --tp {}",
                  rows, batch / dp / accum, spec.seq, dims.tp);
  }
  SHARD_REQUIRE(grad_clip >= 0.f, "--grad-clip {}: expected 0 (off) or a positive norm", grad_clip);
  SHARD_REQUIRE(print_every >= 1, "--print-every {}: expected a positive count", print_every);
  SHARD_REQUIRE(save_every >= 0, "--save-every {}: expected 0 or a positive number of steps", save_every);
  SHARD_REQUIRE(save_every == 0 || !save_dir.empty(), "--save-every {} needs --save-dir", save_every);
  SHARD_REQUIRE(save_keep >= 0, "--save-keep {}: expected 0 (keep all) or a positive count", save_keep);
  SHARD_REQUIRE(save_keep == 0 || !save_dir.empty(), "--save-keep {} needs --save-dir", save_keep);
  SHARD_REQUIRE(resume != "auto" || !save_dir.empty(), "--resume auto needs --save-dir (where to look)");
  SHARD_REQUIRE(val_fraction == 0 || (val_fraction > 0 && val_fraction < 1),
                "--val-fraction {}: expected a fraction between 0 and 1 (exclusive)", val_fraction);
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
  if (dims.pp > 1) {
    validate_pipeline(dims.pp);
  } else {
    SHARD_REQUIRE(pipeline.virtual_stages == 1 && pipeline.split.empty(),
                  "--pp-virtual {} / --pp-split: pipeline options need --pp 2 or more", pipeline.virtual_stages);
  }
  SHARD_REQUIRE(!save_best || !save_dir.empty(), "--save-best needs --save-dir (where the checkpoints go)");
  SHARD_REQUIRE(!save_best || has_validation(),
                "--save-best needs a validation source (--val-data SRC or --val-fraction F) to rank checkpoints by");
  optim.validate();
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
TrainConfig checked(TrainConfig cfg, int world) {
  cfg.validate(world);
  cfg.strategy.dims = cfg.strategy.dims.resolved(world);
  cfg.strategy.pipelined = cfg.strategy.dims.pp > 1;
  cfg.schedule.total_steps = cfg.steps;
  return cfg;
}
}  // namespace

Trainer::Trainer(Backend& be, Pool& pool, Communicator& comm, TrainConfig cfg,
                 std::shared_ptr<const TokenStream> tokens)
    : be_(be),
      pool_(pool),
      comm_(comm),
      cfg_(checked(std::move(cfg), comm.world_size())),
      mesh_(comm, cfg_.strategy.dims),
      data_(load_streams(cfg_, tokens)),  // tokens kept: the body asks whether a stand-in was given
      loader_(*data_.train, cfg_.spec.seq, cfg_.batch, ShuffleConfig{cfg_.shuffle, cfg_.seed}),
      tp_{TpConfig{cfg_.strategy.dims.tp, mesh_.rank(CommAxis::tp), cfg_.sequence_parallel},
          cfg_.strategy.dims.tp > 1 ? &mesh_.comm(CommAxis::tp) : nullptr},
      units_(family_of(cfg_.spec).make_units(cfg_.spec, tp_.config)) {
  num_params_ = shardlab::num_params(family_of(cfg_.spec).layout(cfg_.spec));  // the whole model's, whatever this rank holds
  flops_per_token_ = family_of(cfg_.spec).flops_per_token(cfg_.spec);  // once: it builds the layout
  if (data_.val) {
    const int64_t T = cfg_.spec.seq, n = static_cast<int64_t>(data_.val->tokens.size());
    const int64_t sequences = n >= T + 1 ? (n - 1) / T : 0;
    SHARD_REQUIRE(sequences >= cfg_.batch, "the validation set '{}' holds {} tokens: {} sequences of {} (+1 target), "
                  "fewer than one global batch of {} (--batch)", data_.val->source, n, sequences, T, cfg_.batch);
    val_loader_ = std::make_unique<BatchLoader>(*data_.val, T, cfg_.batch);
    val_batches_ = std::min(cfg_.val_batches, sequences / cfg_.batch);
  }
  if (cfg_.strategy.dims.pp > 1) take_stage_units();
  comm_.set_check(cfg_.check_collectives);
  strategy_ = make_strategy(cfg_.strategy, StrategyEnv{be_, pool_, mesh_.dp(), mesh_, cfg_.spec, units_, cfg_.optim});
  SHARD_REQUIRE(cfg_.init.empty() || cfg_.resume.empty(), "--init and --resume both given: choose one start");
  // On the meta backend (predictions) values are never read: computing them would only cost time.
  if (be_.device() != Device::meta) {
    if (cfg_.init.empty()) strategy_->init_params(cfg_.seed);
    else strategy_->load_params(cfg_.init);
  }
  std::string from = cfg_.resume == "auto" ? latest_checkpoint(cfg_.save_dir) : cfg_.resume;
  if (!tokens && (!cfg_.save_dir.empty() || !from.empty())) {
    auto d = std::make_shared<DataRecord>();
    d->train = describe_source(cfg_.data);
    d->batch = cfg_.batch;
    d->seq = cfg_.spec.seq;
    if (!cfg_.val_data.empty()) d->val_data = describe_source(cfg_.val_data);
    d->val_fraction = cfg_.val_fraction;
    data_record_ = std::move(d);
  }
  if (!from.empty()) {
    const RunPosition at = load_checkpoint(from, checkpoint_state());
    start_step_ = at.step;
    if (!at.note.empty() && comm_.rank() == 0) std::fprintf(stderr, "shardlab train: note: %s\n", at.note.c_str());
    SHARD_REQUIRE(start_step_ <= cfg_.steps, "checkpoint '{}' is at step {}, past --steps {}", from, start_step_,
                  cfg_.steps);
    resumed_from_ = from;
    if (cfg_.save_best) best_val_loss_ = best_checkpoint_val_loss(cfg_.save_dir);
  }
  states_ = pool_.ledger().current_by_category();
  host_states_ = pool_.ledger().current_by_category(Tier::host);
  // The allocation timeline serves reports of the last step only: keep none otherwise.
  pool_.ledger().set_recording(cfg_.record_step);
  const int64_t micro = cfg_.batch / mesh_.dp_size() / cfg_.accum;
  // One micro-step of every data-parallel rank; under --pp every micro-batch of this rank's.
  global_inputs_.resize(static_cast<size_t>(micro * cfg_.spec.seq * (pipelined() ? cfg_.accum : mesh_.dp_size())));
  global_targets_.resize(global_inputs_.size());
}

StageSplit stage_split(const std::vector<std::unique_ptr<Unit>>& units, const StepConfig& c) {
  const ParallelDims& d = c.strategy.dims;
  const PipelineConfig& pc = c.pipeline;
  const int U = static_cast<int>(units.size());
  if (!pc.split.empty()) return explicit_split(pc.split, d.pp, pc.virtual_stages, U);
  // Each unit's cost: its parameters (the GEMMs' work per token, and the state it keeps), what it
  // borrows (a tied head's GEMM), and a block's attention (6 C T FLOPs per token: 1 per parameter-equivalent).
  std::vector<double> cost;
  for (int u = 0; u < U; ++u) {
    double w = static_cast<double>(units[static_cast<size_t>(u)]->layout().numel);
    for (const BorrowedTensor& b : borrowed_tensors(units, static_cast<size_t>(u))) w += static_cast<double>(b.decl->numel);
    if (units[static_cast<size_t>(u)]->recomputable()) w += static_cast<double>(c.spec.dim * c.spec.seq);
    cost.push_back(w);
  }
  return balanced_split(cost, d.pp, pc.virtual_stages);
}

StageSplit stage_split(const StepConfig& c) {
  const TpConfig tp{c.strategy.dims.tp, 0, c.sequence_parallel};
  return stage_split(family_of(c.spec).make_units(c.spec, tp), c);
}

void Trainer::take_stage_units() {
  const ModelSpec& spec = cfg_.spec;
  const ParallelDims& d = cfg_.strategy.dims;
  const PipelineConfig& pc = cfg_.pipeline;
  split_ = stage_split(units_, cfg_);
  schedule_ = build_schedule(pc.schedule, d.pp, pc.virtual_stages, static_cast<int>(cfg_.accum));
  const int me = mesh_.rank(CommAxis::pp);
  // Borrowed tensors whose owner is on another stage: the owner keeps its tensor, the borrower gets a
  // copy; both sum their gradients over the mesh's tied group (the first and the last stage).
  std::vector<std::pair<size_t, size_t>> cross;  // (owner, borrower), model indices
  for (size_t v = 0; v < units_.size(); ++v)
    for (const BorrowedTensor& b : borrowed_tensors(units_, v)) {
      const int ro = split_->rank_of(split_->chunk_of_unit(static_cast<int>(b.owner)));
      const int rv = split_->rank_of(split_->chunk_of_unit(static_cast<int>(v)));
      if (ro == rv) continue;
      SHARD_CHECK(ro == 0 && rv == d.pp - 1, "unit {} borrows {} from stage {} on stage {}: only the first and the last "
                  "stage share tensors", units_[v]->name(), b.decl->name, ro, rv);
      cross.push_back({b.owner, v});
    }
  model_units_ = family_of(spec).make_units(spec, tp_.config);
  std::vector<std::unique_ptr<Unit>> mine;
  std::vector<int> local(units_.size(), -1);
  for (int u : split_->units_of(me)) {
    local[static_cast<size_t>(u)] = static_cast<int>(mine.size());
    mine.push_back(std::move(units_[static_cast<size_t>(u)]));
  }
  for (const auto& [o, v] : cross) {
    const std::vector<std::string> names = model_units_[v]->borrowed();
    for (const TensorDecl& t : model_units_[o]->layout().tensors) {
      if (std::find(names.begin(), names.end(), t.name) == names.end()) continue;
      if (local[v] >= 0) mine[static_cast<size_t>(local[v])]->adopt_tied_copy(t);
    }
  }
  units_ = std::move(mine);
  for (const auto& [o, v] : cross) {
    if (local[o] < 0 && local[v] < 0) continue;  // a stage between them
    const size_t u = static_cast<size_t>(local[o] >= 0 ? local[o] : local[v]);
    const std::vector<std::string> names = model_units_[v]->borrowed();
    for (const TensorDecl& t : units_[u]->layout().tensors)
      if (std::find(names.begin(), names.end(), t.name) != names.end()) tied_.push_back({u, &t});
  }
}

int32_t Trainer::receive_sampled_token(int32_t token) {
  // Token ids are below 2^24: a float sum over the pipeline (zeros elsewhere) carries one exactly.
  float v = static_cast<float>(token);
  mesh_.comm(CommAxis::pp).all_reduce(std::span<float>(&v, 1)).wait();
  return static_cast<int32_t>(v);
}

PipelineRun Trainer::pipeline_run(int64_t B, int64_t T) {
  PipelineRun run{*split_, *schedule_, mesh_.rank(CommAxis::pp), mesh_.comm(CommAxis::pp), {}, {}, nullptr};
  if (B == 0) B = cfg_.batch / mesh_.dp_size() / cfg_.accum;
  if (T == 0) T = cfg_.spec.seq;
  for (int c = 0; c < split_->chunks(); ++c)
    run.input_elems.push_back(
        c == 0 ? 0 : model_units_[static_cast<size_t>(split_->begin(c) - 1)]->out_elems(cfg_.spec, B, T));
  run.begin_micro = [this](int64_t k, bool last) { strategy_->begin_micro(k, last); };
  return run;
}

std::vector<Batch> Trainer::pipeline_batches(BatchLoader& loader, int64_t t) {
  const int64_t T = cfg_.spec.seq, local = cfg_.batch / mesh_.dp_size(), micro = local / cfg_.accum;
  const int64_t first = mesh_.dp_rank() * local;
  std::vector<Batch> batches;
  for (int64_t k = 0; k < cfg_.accum; ++k) {
    int32_t* in = global_inputs_.data() + k * micro * T;
    int32_t* tg = global_targets_.data() + k * micro * T;
    loader.fill(t, first + k * micro, micro, in, tg);
    batches.push_back(Batch{in, tg, micro, T, tg, 1});
  }
  return batches;
}

void Trainer::sync_tied_grads() {
  tied_copy_sq_ = 0;
  for (const auto& [u, decl] : tied_) {
    const auto [begin, end] = strategy_->owned_range(u);
    const auto [sbegin, send] = strategy_->saved_range(u);
    Tensor g = strategy_->reduced_grad(u);  // elements [begin, end) of the unit
    Block buf = pool_.alloc(DType::f32, decl->numel + 1, Category::comm_buffer, decl->name + " tied gradient");
    Tensor whole = buf.flat(DType::f32).slice(0, decl->numel);
    be_.fill(whole, 0.f);
    const int64_t t0 = decl->offset, t1 = t0 + decl->numel;
    // Each element once per stage: the ranks that save it (replicas hold the same value) put it in.
    if (int64_t lo = std::max(sbegin, t0), hi = std::min(send, t1); lo < hi)
      be_.cast(whole.slice(lo - t0, hi - lo), g.slice(lo - begin, hi - lo));
    mesh_.tied()->all_reduce(whole).wait();
    if (int64_t lo = std::max(begin, t0), hi = std::min(end, t1); lo < hi)
      be_.cast(g.slice(lo - begin, hi - lo), whole.slice(lo - t0, hi - lo));
    if (decl->tied_copy) {  // its squares are in this stage's norm: the owner's stage counts them
      Tensor acc = buf.flat(DType::f32).slice(decl->numel, 1);
      be_.fill(acc, 0.f);
      be_.sum_squares(whole, acc, true);
      float v = 0.f;
      be_.copy(Tensor::flat(&v, DType::f32, 1), acc);
      tied_copy_sq_ += v;
    }
  }
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
}
}  // namespace

StepStats Trainer::step(int64_t t) {
  maybe_inject_throw(comm_.rank(), t + 1);
  auto t0 = std::chrono::steady_clock::now();
  const int64_t T = cfg_.spec.seq, W = mesh_.dp_size(), r = mesh_.dp_rank();
  const int64_t local = cfg_.batch / W, micro = local / cfg_.accum;
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
  double loss_sum = 0;
  if (pipelined()) {
    const std::vector<Batch> batches = pipeline_batches(loader_, t);
    if (cfg_.pipeline.align_steps) mesh_.comm(CommAxis::pp).barrier().wait();
    PipelineRun run = pipeline_run();
    run.timing = &pipe_timing_;
    loss_sum = run_pipeline(run, units_, cfg_.spec, be_, pool_, batches, *strategy_, dlogit_scale,
                            cfg_.checkpointing, tp_)
                   .loss_sum;
  }
  for (int64_t k = 0; k < (pipelined() ? 0 : cfg_.accum); ++k) {
    // Every rank's slice of micro-step k, in rank order: this rank computes with its own, and a
    // strategy that takes the whole batch's loss on one rank (dp) reads all of them.
    for (int64_t q = 0; q < W; ++q)
      loader_.fill(t, q * local + k * micro, micro, global_inputs_.data() + q * micro * T,
                   global_targets_.data() + q * micro * T);
    strategy_->begin_micro(k, k + 1 == cfg_.accum);
    Batch b{global_inputs_.data() + r * micro * T, global_targets_.data() + r * micro * T, micro, T,
            global_targets_.data(), static_cast<int>(W)};
    loss_sum +=
        run_forward_backward(units_, cfg_.spec, be_, pool_, b, *strategy_, dlogit_scale, nullptr, cfg_.checkpointing, tp_)
            .loss_sum;
  }
  float loss = static_cast<float>(loss_sum);
  mesh_.dp().all_reduce(std::span<float>(&loss, 1)).wait();
  if (pipelined()) mesh_.comm(CommAxis::pp).all_reduce(std::span<float>(&loss, 1)).wait();  // the last stage's
  loss /= static_cast<float>(cfg_.batch * T);
  pool_.ledger().set_phase({PhaseKind::optimizer});
  sync_tied_grads();
  const float norm = static_cast<float>(std::sqrt(grad_norm_sq()));
  const float lr = cfg_.schedule.at(t);
  // Every rank sees the same loss and norm, so every rank takes the same branch here.
  const bool finite = std::isfinite(loss) && std::isfinite(norm);
  if (!finite && !cfg_.skip_nonfinite)
    throw InputError(fmt::format("step {}: the loss is {} and the gradient norm {}: stopping (lower --lr, or pass "
                                 "--skip-nonfinite to skip such steps)", t + 1, loss, norm));
  if (finite) {
    Backend::Range range(be_, "optimizer step");
    strategy_->optimizer_step(t + 1, lr, clip_factor(norm, cfg_.grad_clip));
  }
  else ++skipped_steps_;
  pool_.ledger().set_phase({});
  be_.synchronize();
  comm_.stats().end_step();
  StepStats s;
  s.step = t + 1;
  s.loss = loss;
  s.lr = lr;
  s.grad_norm = norm;
  s.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  s.tokens_per_s = static_cast<double>(cfg_.batch * T) / (s.ms / 1e3);
  s.flops_per_s = flops_per_token_ * s.tokens_per_s;
  s.peak_bytes = pool_.ledger().peak_total();
  s.host_peak_bytes = pool_.ledger().peak_total(Tier::host);
  s.comm_bytes = comm_.stats().total_bytes() - comm_before;
  s.rss_bytes = resident_bytes();
  return s;
}

double Trainer::grad_norm_sq() {
  double all = strategy_->grad_norm_sq() - tied_copy_sq_;  // a tied copy counts at its owner only
  if (tp_.active()) {
    // This rank's part: the split tensors' squares add up over the tensor-parallel group; the
    // replicated ones are the same on every rank of it and count once.
    const double replicated = strategy_->replicated_grad_norm_sq();
    float split = static_cast<float>(all - replicated);
    tp_.comm->all_reduce(std::span<float>(&split, 1)).wait();
    all = split + replicated;
  }
  if (pipelined()) {  // each stage's units
    float stage = static_cast<float>(all);
    mesh_.comm(CommAxis::pp).all_reduce(std::span<float>(&stage, 1)).wait();
    all = stage;
  }
  return all;
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
  const int64_t T = cfg_.spec.seq, W = mesh_.dp_size(), V = cfg_.spec.vocab;
  SHARD_REQUIRE(static_cast<int64_t>(tokens.size()) <= T, "the prompt has {} tokens, more than the model's {} positions",
                tokens.size(), T);
  if (tokens.empty()) tokens.push_back(cfg_.spec.vocab > 10 ? 10 : 0);  // a newline for byte-level models
  EvalScope scope(*this);
  std::vector<float> logits;
  std::optional<Decoder> decoder;
  if (c.kv_cache && Decoder::supported(units_) && !pipelined()) decoder.emplace(units_, cfg_.spec, be_, pool_);
  for (int64_t i = 0; i < c.tokens; ++i) {
    const int64_t size = static_cast<int64_t>(tokens.size()), n = std::min(size, T);
    if (decoder && size <= T) {  // the cache holds every position but the newest (none at first)
      const int64_t fed = decoder->length();
      decoder->forward(std::span<const int32_t>(tokens).subspan(static_cast<size_t>(fed)), *strategy_, logits);
    } else if (decoder) {
      // Past seq positions the context slides: every position moves, so every key and value changes
      // (learned positions and RoPE alike), and the window is prefilled again, as a whole forward.
      decoder->reset();
      decoder->forward(std::span<const int32_t>(tokens).subspan(static_cast<size_t>(size - n)), *strategy_, logits);
    } else {
      std::vector<int32_t> context(tokens.end() - n, tokens.end());
      std::vector<int32_t> targets(static_cast<size_t>(n * W), 0);  // the loss is computed and ignored
      Batch b{context.data(), targets.data(), 1, n, targets.data(), static_cast<int>(W)};
      if (pipelined()) {  // the last stage's logits; the other stages' stay empty
        logits.clear();
        run_pipeline_forward(pipeline_run(1, n), units_, cfg_.spec, be_, pool_, std::span<const Batch>(&b, 1),
                             *strategy_, tp_, &logits);
      } else {
        run_forward(units_, cfg_.spec, be_, pool_, b, *strategy_, &logits, tp_);
      }
    }
    if (pipelined() && logits.empty()) {  // not the last stage: its token comes from there
      tokens.push_back(receive_sampled_token(0));
      if (on_token) on_token(tokens.back());
      continue;
    }
    if (tp_.active()) {  // every rank's vocabulary columns of the last position, in rank order (padded)
      const int64_t cols = static_cast<int64_t>(logits.size()) / n;
      std::vector<float> whole(static_cast<size_t>(cols * tp_.config.degree));
      tp_.comm->all_gather(std::span<const float>(logits).subspan(static_cast<size_t>((n - 1) * cols), cols),
                           std::span<float>(whole))
          .wait();
      logits.assign(whole.begin(), whole.begin() + V);
    }
    const int64_t rows = static_cast<int64_t>(logits.size()) / V;  // the last row is the next token's
    tokens.push_back(sample_token(std::span<const float>(logits).subspan(static_cast<size_t>((rows - 1) * V), V), c, i));
    if (pipelined()) receive_sampled_token(tokens.back());
    if (on_token) on_token(tokens.back());
  }
  return tokens;
}

float Trainer::evaluate() {
  SHARD_REQUIRE(val_loader_, "no validation data: pass --val-data SRC or --val-fraction F");
  const int64_t T = cfg_.spec.seq, W = mesh_.dp_size(), r = mesh_.dp_rank();
  const int64_t local = cfg_.batch / W, micro = local / cfg_.accum;
  std::vector<float> sums(static_cast<size_t>(val_batches_), 0.f);  // per batch, this rank's share
  EvalScope scope(*this);
  for (int64_t i = 0; i < val_batches_; ++i) {
    double sum = 0;
    if (pipelined()) {
      const std::vector<Batch> batches = pipeline_batches(*val_loader_, i);
      float s = static_cast<float>(
          run_pipeline_forward(pipeline_run(), units_, cfg_.spec, be_, pool_, batches, *strategy_, tp_).loss_sum);
      mesh_.comm(CommAxis::pp).all_reduce(std::span<float>(&s, 1)).wait();  // the last stage's
      sums[static_cast<size_t>(i)] = s;
      continue;
    }
    for (int64_t k = 0; k < cfg_.accum; ++k) {  // micro-batches of the training size bound the memory
      for (int64_t q = 0; q < W; ++q)
        val_loader_->fill(i, q * local + k * micro, micro, global_inputs_.data() + q * micro * T,
                          global_targets_.data() + q * micro * T);
      Batch b{global_inputs_.data() + r * micro * T, global_targets_.data() + r * micro * T, micro, T,
              global_targets_.data(), static_cast<int>(W)};
      sum += run_forward(units_, cfg_.spec, be_, pool_, b, *strategy_, nullptr, tp_).loss_sum;
    }
    sums[static_cast<size_t>(i)] = static_cast<float>(sum);
  }
  mesh_.dp().all_reduce(std::span<float>(sums)).wait();
  double total = 0;
  for (float v : sums) total += v;
  return static_cast<float>(total / static_cast<double>(val_batches_ * cfg_.batch * T));
}

std::vector<std::string> Trainer::unit_names() const {
  std::vector<std::string> names;
  for (const auto& u : units_) names.push_back(u->name());
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

MemoryRow Trainer::memory_row(const std::string& label) const {
  const int64_t micro = cfg_.batch / mesh_.dp_size() / cfg_.accum;
  MemoryRow row;
  row.label = label;
  row.predicted = predict_step(cfg_, comm_.world_size(), comm_.rank(), micro);
  const Ledger& L = pool_.ledger();
  row.measured = true;
  row.measured_states = states_;
  row.measured_peak = L.peak_total();
  row.measured_at_peak = L.composition_at_peak();
  row.measured_peak_by_category = L.peak_by_category();
  row.measured_phase = L.phase_at_peak();
  row.measured_host = host_estimate(L, host_states_);
  if (cfg_.record_step) {
    row.measured_timeline = L.timeline();  // cleared at the start of each step
    for (const CommEvent& e : comm_.stats().events)
      row.measured_comm.push_back(
          {std::chrono::duration<double, std::milli>(e.issued - L.start()).count(), comm_op_name(e.op), e.bytes});
  }
  if (comm_.stats().steps > 0) row.comm_bytes = comm_.stats().last_step_bytes;
  return row;
}

CheckpointState Trainer::checkpoint_state() {
  return CheckpointState{be_, comm_, *strategy_, units_, cfg_, cfg_.shuffle, data_record_.get()};
}

void Trainer::save(const std::string& path) {
  std::vector<std::vector<float>> host;
  for (size_t u = 0; u < units_.size(); ++u) host.push_back(strategy_->gather_unit_params(u));
  if (!tp_.active() && !pipelined()) {
    if (comm_.rank() == 0) write_units(path, cfg_.spec, units_, host);
    return;
  }
  const ModelFamily& family = family_of(cfg_.spec);
  const std::vector<UnitLayout> whole = family.layout(cfg_.spec);
  auto whole_of = [&](const std::string& name) -> const UnitLayout& {
    for (const UnitLayout& l : whole)
      if (l.name == name) return l;
    SHARD_CHECK(false, "unit {} is not the model's", name);
    return whole.front();
  };
  // This rank's units without their tied copies (appended last: the owner's stage saves the tensor).
  std::vector<UnitLayout> local, wanted;
  for (size_t u = 0; u < units_.size(); ++u) {
    UnitLayout l = units_[u]->layout();
    while (!l.tensors.empty() && l.tensors.back().tied_copy) {
      l.numel = l.tensors.back().offset;
      l.tensors.pop_back();
    }
    host[u].resize(static_cast<size_t>(l.numel));
    wanted.push_back(whole_of(l.name));
    local.push_back(std::move(l));
  }
  // Each rank holds its tensor-parallel part: tp rank 0 assembles whole units.
  if (tp_.active()) host = gather_tp_units(*tp_.comm, local, wanted, host);
  if (!pipelined()) {
    if (comm_.rank() == 0) write_units(path, cfg_.spec, family.make_units(cfg_.spec), host);
    return;
  }
  // Every stage's first rank (data-parallel and tensor-parallel rank 0) sends its whole units to
  // world rank 0, the first stage's, over their pipeline group; world rank 0 writes the model.
  if (mesh_.dp_rank() != 0 || mesh_.rank(CommAxis::tp) != 0) return;
  Communicator& pp = mesh_.comm(CommAxis::pp);
  const int me = mesh_.rank(CommAxis::pp);
  if (me != 0) {
    for (std::vector<float>& v : host) pp.send(Tensor::of(std::span<const float>(v)), 0).wait();
    return;
  }
  std::vector<std::vector<float>> all(whole.size());
  for (int s = 0; s < split_->pp; ++s) {
    const std::vector<int> units = split_->units_of(s);
    for (size_t i = 0; i < units.size(); ++i) {
      std::vector<float>& v = all[static_cast<size_t>(units[i])];
      if (s == 0) {
        v = std::move(host[i]);
        continue;
      }
      v.resize(static_cast<size_t>(whole[static_cast<size_t>(units[i])].numel));
      pp.recv(Tensor::of(std::span<float>(v)), s).wait();
    }
  }
  write_units(path, cfg_.spec, family.make_units(cfg_.spec), all);
}

}  // namespace shardlab
