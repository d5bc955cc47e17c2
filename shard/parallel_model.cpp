// parallel_model.cpp — this rank's part of the model under every axis (parallel_model.hpp): set-up
// (units, stage split, tied copies) and the step's, evaluation's and sampling's cross-axis work.
// The whole-model gather for a save is in parallel_model_save.cpp.
#include "shard/parallel_model.hpp"

#include <algorithm>
#include <utility>

#include "src/model/family.hpp"

namespace shardlab {

namespace {
StageSplit split_of(const std::vector<std::unique_ptr<Unit>>& units, const ModelSpec& spec,
                    const ParallelLayout& layout) {
  const PipelineConfig& pc = layout.pipeline;
  const int U = static_cast<int>(units.size());
  if (!pc.split.empty()) return explicit_split(pc.split, layout.dims.pp, pc.virtual_stages, U);
  // Each unit's cost: its parameters (the GEMMs' work per token, and the state it keeps), what it
  // borrows (a tied head's GEMM), and a block's attention (6 C T FLOPs per token: 1 per parameter-equivalent).
  std::vector<double> cost;
  for (int u = 0; u < U; ++u) {
    double w = static_cast<double>(units[static_cast<size_t>(u)]->layout().numel);
    for (const BorrowedTensor& b : borrowed_tensors(units, static_cast<size_t>(u))) w += static_cast<double>(b.decl->numel);
    if (units[static_cast<size_t>(u)]->recomputable()) w += static_cast<double>(spec.dim * spec.seq);
    cost.push_back(w);
  }
  return balanced_split(cost, layout.dims.pp, pc.virtual_stages);
}
}  // namespace

// The chunks in model order, placed on the ranks as the schedule places them.
StageSplit stage_split(const std::vector<std::unique_ptr<Unit>>& units, const ModelSpec& spec,
                       const ParallelLayout& layout) {
  StageSplit s = split_of(units, spec, layout);
  s.v_shape = layout.pipeline.schedule->v_shape;
  return s;
}

StageSplit stage_split(const ModelSpec& spec, const ParallelLayout& layout) {
  return stage_split(family_of(spec).make_units(spec, layout.tp(0), layout.ep(0)), spec, layout);
}

ParallelModel::ParallelModel(ParallelModelConfig cfg, Mesh& mesh, Backend& be, Pool& pool)
    : cfg_(std::move(cfg)),
      mesh_(mesh),
      be_(be),
      pool_(pool),
      tp_{cfg_.layout.tp(mesh.rank(CommAxis::tp)), cfg_.layout.dims.tp > 1 ? &mesh.comm(CommAxis::tp) : nullptr},
      ep_{cfg_.layout.ep(mesh.coord().ep), cfg_.layout.dims.ep > 1 ? &mesh.comm(CommAxis::ep) : nullptr},
      units_(family_of(cfg_.spec).make_units(cfg_.spec, tp_.config, ep_.config)) {
  if (const int C = cfg_.layout.dims.cp; C > 1) {
    cp_.degree = C;
    cp_.rank = mesh.rank(CommAxis::cp);
    cp_.config = cfg_.layout.cp;
    cp_.comm = &mesh.comm(CommAxis::cp);
    cp_.seq = cfg_.spec.seq;
    cp_.pieces = cp_pieces(cp_.seq, C, cp_.rank, cp_.config.balance);
  }
  if (cfg_.layout.pipelined()) take_stage_units();
  // Under --pp every micro-batch of this rank's; without, micro_step sizes them for its strategy.
  if (pipelined()) {
    inputs_.resize(static_cast<size_t>(micro() * local_seq() * cfg_.micro_batches));
    targets_.resize(inputs_.size());
  }
}

void ParallelModel::take_stage_units() {
  const ModelSpec& spec = cfg_.spec;
  const PipelineConfig& pc = cfg_.layout.pipeline;
  split_ = stage_split(units_, spec, cfg_.layout);
  schedule_ = build_schedule(pc.schedule, cfg_.layout.dims.pp, pc.virtual_stages, static_cast<int>(cfg_.micro_batches));
  // Borrowed tensors whose owner is on another stage: the owner keeps its tensor, the borrower gets a
  // copy; both sum their gradients over the mesh's tied group (the first and the last stage).
  std::vector<std::pair<size_t, size_t>> cross;  // (owner, borrower), model indices
  for (size_t v = 0; v < units_.size(); ++v)
    for (const BorrowedTensor& b : borrowed_tensors(units_, v)) {
      const int ro = split_->rank_of(split_->chunk_of_unit(static_cast<int>(b.owner)));
      const int rv = split_->rank_of(split_->chunk_of_unit(static_cast<int>(v)));
      if (ro == rv) continue;
      SHARD_CHECK(ro == 0 && rv == cfg_.layout.dims.pp - 1, "unit {} borrows {} from stage {} on stage {}: only the "
                  "first and the last stage share tensors", units_[v]->name(), b.decl->name, ro, rv);
      cross.push_back({b.owner, v});
    }
  model_units_ = family_of(spec).make_units(spec, tp_.config, ep_.config);
  std::vector<std::unique_ptr<Unit>> mine;
  std::vector<int> local(units_.size(), -1);
  for (int u : split_->units_of(mesh_.rank(CommAxis::pp))) {
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

PipelineRun ParallelModel::pipeline_run(int64_t B, int64_t T) {
  PipelineRun run{*split_, *schedule_, mesh_.rank(CommAxis::pp), mesh_.comm(CommAxis::pp), {}, {}, nullptr};
  if (B == 0) B = micro();
  if (T == 0) T = local_seq();
  for (int c = 0; c < split_->chunks(); ++c)
    run.input_elems.push_back(
        c == 0 ? 0 : model_units_[static_cast<size_t>(split_->begin(c) - 1)]->out_elems(cfg_.spec, B, T));
  run.begin_micro = [this](int64_t k, bool last) { strategy_->begin_micro(k, last); };
  return run;
}

void ParallelModel::fill_local(const BatchFill& fill, int64_t first, int64_t count, int32_t* inputs,
                               int32_t* targets) {
  if (!cp_.active()) return fill(first, count, inputs, targets);
  const int64_t T = cp_.seq, Tl = cp_.local();
  whole_inputs_.resize(static_cast<size_t>(count * T));
  whole_targets_.resize(whole_inputs_.size());
  fill(first, count, whole_inputs_.data(), whole_targets_.data());
  for (int64_t b = 0; b < count; ++b)
    for (const CpPiece& p : cp_.pieces) {
      const int64_t from = b * T + p.pos0, to = b * Tl + p.row0;
      std::copy_n(whole_inputs_.data() + from, p.len, inputs + to);
      std::copy_n(whole_targets_.data() + from, p.len, targets + to);
    }
}

Batch ParallelModel::batch_of(int32_t* inputs, int32_t* targets, int64_t n) {
  Batch b{inputs, targets, n, local_seq()};
  if (cp_.active()) b.cp = &cp_;
  return b;
}

std::vector<Batch> ParallelModel::stage_batches(const BatchFill& fill) {
  const int64_t T = local_seq(), local = cfg_.batch / mesh_.dp_size(), n = micro();
  const int64_t first = mesh_.dp_rank() * local;
  std::vector<Batch> batches;
  for (int64_t k = 0; k < cfg_.micro_batches; ++k) {
    int32_t* in = inputs_.data() + k * n * T;
    int32_t* tg = targets_.data() + k * n * T;
    fill_local(fill, first + k * n, n, in, tg);
    Batch b = batch_of(in, tg, n);
    b.global_targets = tg;
    batches.push_back(b);
  }
  return batches;
}

Batch ParallelModel::micro_step(const BatchFill& fill, int64_t k) {
  // This rank computes with its own slice of micro-step k; a strategy that takes the whole batch's
  // loss on one rank (dp) reads every rank's, in rank order. The others get their own alone: W
  // slices on each of W ranks would cost O(W) per rank and micro-step (plan predicts 256-rank steps).
  const int64_t T = local_seq(), W = mesh_.dp_size(), local = cfg_.batch / W, n = micro();
  const bool every_rank = strategy_->kind() == StrategyKind::dp;  // never under --cp (layout.cpp)
  const size_t size = static_cast<size_t>(n * T * (every_rank ? W : 1));
  if (inputs_.size() != size) inputs_.resize(size), targets_.resize(size);
  const int64_t r = mesh_.dp_rank();
  if (!every_rank) {
    fill_local(fill, r * local + k * n, n, inputs_.data(), targets_.data());
    return batch_of(inputs_.data(), targets_.data(), n);
  }
  for (int64_t q = 0; q < W; ++q) fill(q * local + k * n, n, inputs_.data() + q * n * T, targets_.data() + q * n * T);
  return Batch{inputs_.data() + r * n * T, targets_.data() + r * n * T, n, T, targets_.data(), static_cast<int>(W)};
}

double ParallelModel::train(const BatchFill& fill, float dlogit_scale, PipelineTiming* timing) {
  if (pipelined()) {
    const std::vector<Batch> batches = stage_batches(fill);
    if (cfg_.layout.pipeline.align_steps) mesh_.comm(CommAxis::pp).barrier().wait();
    PipelineRun run = pipeline_run();
    run.timing = timing;
    const RunResult r =
        run_pipeline(run, units_, cfg_.spec, be_, pool_, batches, *strategy_, dlogit_scale, cfg_.checkpointing, tp_, &ep_);
    add_aux(r);  // the last chunk's rank's (every micro-batch's)
    return r.loss_sum;
  }
  double loss_sum = 0;
  for (int64_t k = 0; k < cfg_.micro_batches; ++k) {
    const Batch b = micro_step(fill, k);
    strategy_->begin_micro(k, k + 1 == cfg_.micro_batches);
    const RunResult r =
        run_forward_backward(units_, cfg_.spec, be_, pool_, b, *strategy_, dlogit_scale, nullptr, cfg_.checkpointing, tp_,
                             &ep_);
    loss_sum += r.loss_sum;
    add_aux(r);
  }
  return loss_sum;
}

void ParallelModel::add_aux(const RunResult& r) {
  aux_.aux_sum += r.aux_sum;
  if (aux_.stats.size() < r.aux_stats.size()) aux_.stats.resize(r.aux_stats.size(), 0.0);
  for (size_t i = 0; i < r.aux_stats.size(); ++i) aux_.stats[i] += r.aux_stats[i];
}

ParallelModel::AuxStep ParallelModel::take_aux() {
  AuxStep m = std::move(aux_);
  aux_ = {};
  float aux = static_cast<float>(m.aux_sum);
  mesh_.dp_cp().all_reduce(std::span<float>(&aux, 1)).wait();
  m.aux_sum = aux;
  if (pipelined()) {  // the last chunk's stage has them: every stage gets them (zeros elsewhere)
    const std::unique_ptr<AuxChannel> channel = family_of(cfg_.spec).aux_channel(cfg_.spec);
    m.stats.resize(channel ? static_cast<size_t>(channel->stats_size()) : 0, 0.0);
    std::vector<float> v = {static_cast<float>(m.aux_sum)};
    v.insert(v.end(), m.stats.begin(), m.stats.end());
    mesh_.comm(CommAxis::pp).all_reduce(std::span<float>(v)).wait();
    m.aux_sum = v[0];
    for (size_t i = 0; i < m.stats.size(); ++i) m.stats[i] = v[i + 1];
  }
  return m;
}

float ParallelModel::reduce_loss(double loss_sum) {
  float loss = static_cast<float>(loss_sum);
  mesh_.dp_cp().all_reduce(std::span<float>(&loss, 1)).wait();
  if (pipelined()) mesh_.comm(CommAxis::pp).all_reduce(std::span<float>(&loss, 1)).wait();  // the last chunk's stage's
  return loss;
}

double ParallelModel::evaluate(const BatchFill& fill) {
  if (pipelined()) {
    const std::vector<Batch> batches = stage_batches(fill);
    float s = static_cast<float>(
        run_pipeline_forward(pipeline_run(), units_, cfg_.spec, be_, pool_, batches, *strategy_, tp_, &ep_).loss_sum);
    mesh_.comm(CommAxis::pp).all_reduce(std::span<float>(&s, 1)).wait();  // the last chunk's stage's
    return s;
  }
  double sum = 0;
  for (int64_t k = 0; k < cfg_.micro_batches; ++k)  // micro-batches of the training size bound the memory
    sum += run_forward(units_, cfg_.spec, be_, pool_, micro_step(fill, k), *strategy_, nullptr, tp_, &ep_).loss_sum;
  return sum;
}

void ParallelModel::sum_dense_grads_over_ep() {
  if (!ep_.active()) return;
  // The tensors an ep group holds whole (all but the experts) lie at the same offsets of each unit
  // on each of its ranks, whose owned ranges are alike: their reduced gradients, summed over the
  // group in one all-reduce, become every token's.
  struct Piece {
    Tensor g;
    int64_t at;
  };
  std::vector<Piece> pieces;
  int64_t total = 0;
  DType dtype = DType::f32;
  for (size_t u = 0; u < units_.size(); ++u) {
    const auto [begin, end] = strategy_->owned_range(u);
    if (end <= begin) continue;
    Tensor g = strategy_->reduced_grad(u);
    dtype = g.dtype();
    for (const TensorDecl& t : units_[u]->layout().tensors) {
      const int64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
      if (t.expert || lo >= hi) continue;
      pieces.push_back({g.slice(lo - begin, hi - lo), total});
      total += hi - lo;
    }
  }
  Block buf = pool_.alloc(dtype, std::max<int64_t>(total, 1), Category::comm_buffer, "dense gradients over ep");
  Tensor all = buf.flat(dtype).slice(0, total);
  for (const Piece& p : pieces) be_.copy(all.slice(p.at, p.g.numel()), p.g);
  ep_.comm->all_reduce(all).wait();
  for (const Piece& p : pieces) be_.copy(p.g, all.slice(p.at, p.g.numel()));
}

void ParallelModel::sync_tied_grads() {
  sum_dense_grads_over_ep();
  tied_copy_sq_ = 0;
  for (const auto& [u, decl] : tied_) {
    const auto [begin, end] = strategy_->owned_range(u);
    const auto [sbegin, send] = strategy_->saved_range(u);
    Tensor g = strategy_->reduced_grad(u);  // elements [begin, end) of the unit
    Block buf = pool_.alloc(DType::f32, decl->numel + 1, Category::comm_buffer, decl->name + " tied gradient");
    Tensor whole = buf.flat(DType::f32).slice(0, decl->numel);
    be_.fill(whole, 0.f);
    const int64_t t0 = decl->offset, t1 = t0 + decl->numel;
    // Each element once per stage: the ranks that save it (replicas hold the same value) put it in;
    // under --ep those of ep rank 0 (the group's dense gradients are summed already).
    if (int64_t lo = std::max(sbegin, t0), hi = std::min(send, t1); lo < hi && mesh_.coord().ep == 0)
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

double ParallelModel::grad_norm_sq() {
  double all = strategy_->grad_norm_sq() - tied_copy_sq_;  // a tied copy counts at its owner only
  double ep_extra = 0;  // the other ranks' experts (--ep)
  if (ep_.active()) {
    // This rank's experts' squares add up over the ep group; the rest is the same on each of its ranks.
    const double mine = strategy_->expert_grad_norm_sq();
    float group = static_cast<float>(mine);
    ep_.comm->all_reduce(std::span<float>(&group, 1)).wait();
    ep_extra = group - mine;
    all += ep_extra;
  }
  if (tp_.active()) {
    // This rank's part: the split tensors' squares add up over the tensor-parallel group; the
    // replicated ones (the experts among them) are the same on every rank of it and count once.
    const double replicated = strategy_->replicated_grad_norm_sq() + ep_extra;
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

bool ParallelModel::decodes() const { return !pipelined() && !ep_.active(); }  // the decoder holds no ep group

std::vector<std::pair<CommAxis, double>> ParallelModel::take_axis_waits_s() {
  std::vector<std::pair<CommAxis, double>> waits;
  if (cp_.active()) waits.emplace_back(CommAxis::cp, std::exchange(cp_.wait_s, 0.0));
  if (ep_.active()) waits.emplace_back(CommAxis::ep, std::exchange(ep_.wait_s, 0.0));
  return waits;
}

bool ParallelModel::last_logits(std::span<const int32_t> context, std::vector<float>& logits, bool decoded) {
  const int64_t n = static_cast<int64_t>(context.size()), W = mesh_.dp_size(), V = cfg_.spec.vocab;
  if (!decoded) {
    std::vector<int32_t> targets(static_cast<size_t>(n * W), 0);  // the loss is computed and ignored
    Batch b{context.data(), targets.data(), 1, n, targets.data(), static_cast<int>(W)};
    if (pipelined()) {  // the last chunk's stage's logits (zb-v: the first stage); the others' stay empty
      logits.clear();
      run_pipeline_forward(pipeline_run(1, n), units_, cfg_.spec, be_, pool_, std::span<const Batch>(&b, 1),
                           *strategy_, tp_, &ep_, &logits);
    } else {
      run_forward(units_, cfg_.spec, be_, pool_, b, *strategy_, &logits, tp_, &ep_);
    }
  }
  if (pipelined() && logits.empty()) return false;  // not the head's stage: its token comes from there
  if (tp_.active()) {  // every rank's vocabulary columns of the last position, in rank order (padded)
    const int64_t cols = static_cast<int64_t>(logits.size()) / n;
    std::vector<float> whole(static_cast<size_t>(cols * tp_.config.degree));
    tp_.comm->all_gather(std::span<const float>(logits).subspan(static_cast<size_t>((n - 1) * cols), cols),
                         std::span<float>(whole))
        .wait();
    logits.assign(whole.begin(), whole.begin() + V);
  }
  return true;
}

int32_t ParallelModel::share_token(int32_t token) {
  if (!pipelined()) return token;
  // Token ids are below 2^24: a float sum over the pipeline (zeros elsewhere) carries one exactly.
  float v = static_cast<float>(token);
  mesh_.comm(CommAxis::pp).all_reduce(std::span<float>(&v, 1)).wait();
  return static_cast<int32_t>(v);
}

void ParallelModel::print_pipeline(std::FILE* out) const {
  if (!pipelined()) return;
  const int P = split_->pp, M = static_cast<int>(cfg_.micro_batches);
  std::vector<std::string> names;
  for (const auto& u : model_units_) names.push_back(u->name());
  std::fprintf(out, "  pipeline: %s over %d stages%s, %d micro-batches, bubble %s%.1f%% in theory; %s\n",
               schedule_->kind.name(), P,
               split_->virtual_stages > 1 ? fmt::format(" x {} virtual", split_->virtual_stages).c_str() : "", M,
               schedule_->kind->bubble_is_bound ? "at least " : "",
               100 * bubble_fraction(schedule_->kind, P, split_->virtual_stages, M), split_->describe(names).c_str());
  if (const std::string w = schedule_->kind->warning ? schedule_->kind->warning(P, split_->virtual_stages, M) : "";
      !w.empty())
    std::fprintf(out, "  warning: %s\n", w.c_str());
}

}  // namespace shardlab
