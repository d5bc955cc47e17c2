#include "src/model/runner.hpp"

#include <optional>

#include "src/comm/communicator.hpp"
#include "src/backend/ops/loss.hpp"
#include "src/model/blocks/loss_head.hpp"
#include "src/model/family.hpp"
#include "src/model/blocks/weight_grad.hpp"

namespace shardlab {

void add_unit_views(ParamSet& set, const UnitLayout& unit, Tensor flat) {
  for (const TensorDecl& t : unit.tensors) set.set(t.name, flat.slice(t.offset, t.numel).reshape(t.shape));
}

namespace {
// The sum of x, reduced into `slot` (one f32 on the device) and read back.
float sum_to_host(Backend& be, Tensor x, Tensor slot) {
  be.sum(x, slot, false);
  float sum = 0.f;
  be.copy(Tensor::flat(&sum, DType::f32, 1), slot);
  return sum;
}

// The sum of the batch's cross-entropy losses; with dlogits, also their gradient (times scale).
double cross_entropy_sum(Backend& be, Pool& pool, Tensor logits, const Batch& batch, Tensor dlogits, float scale) {
  const int64_t N = batch.B * batch.T;
  Block losses = pool.alloc(DType::f32, N + 1, Category::activations, "losses");
  Tensor l = losses.flat(DType::f32);
  ops::cross_entropy(be, l.slice(0, N), dlogits, logits, batch.targets, scale);
  return sum_to_host(be, l.slice(0, N), l.slice(N, 1));
}

// The last unit's output as (N, V) logits (this rank's vocabulary columns under tensor
// parallelism), copied to *logits when asked for.
Tensor final_logits(Backend& be, const Block& out, int64_t N, std::vector<float>* logits) {
  const int64_t V = static_cast<int64_t>(out.bytes() / sizeof(float)) / N;
  Tensor t = out.view(DType::f32, {N, V});
  if (logits) {
    logits->resize(static_cast<size_t>(N * V));
    be.copy(Tensor::of(std::span<float>(*logits)), t);
  }
  return t;
}
}  // namespace

double vocab_parallel_loss(Backend& be, Pool& pool, const TpContext& tp, const ModelSpec& spec, Tensor logits,
                           const Batch& batch, Tensor dlogits, float scale) {
  const int64_t N = batch.B * batch.T;
  const VocabShard v = vocab_shard(spec.vocab, tp.config.degree, tp.config.rank);
  SHARD_CHECK(logits.numel() == N * v.rows, "vocabulary-parallel loss: logits {} for {} rows of {} vocabulary rows",
              logits.shape_str(), N, v.rows);
  // mx, then [sumexp | tlogit] (reduced together), losses, and their sum.
  Block stats = pool.alloc(DType::f32, 4 * N + 1, Category::activations, "vocab-parallel loss");
  Tensor all = stats.flat(DType::f32), losses = all.slice(3 * N, N);
  UnitContext c{be, pool, spec, batch, Checkpointing::none, tp};
  blocks::cross_entropy_rows(c, losses, dlogits, logits, batch.targets, all.slice(0, 3 * N), scale);
  return sum_to_host(be, losses, all.slice(4 * N, 1));
}

double UnitHooks::loss(Backend& be, Pool& pool, Tensor logits, const Batch& batch, float dlogit_scale,
                       DType grad_dtype, Block& dlogits) {
  if (grad_dtype == DType::f32) return cross_entropy_sum(be, pool, logits, batch, logits, dlogit_scale);
  dlogits = logits_grad_block(pool, grad_dtype, logits.numel());
  return cross_entropy_sum(be, pool, logits, batch, dlogits.flat(grad_dtype), dlogit_scale);
}

double UnitHooks::forward_loss(Backend& be, Pool& pool, Tensor logits, const Batch& batch) {
  return cross_entropy_sum(be, pool, logits, batch, Tensor(), 0.f);
}

double UnitHooks::loss_rows(Backend& be, Pool& pool, Tensor losses, const Batch&, float dloss_scale, bool backward) {
  Block sum_block = pool.alloc(DType::f32, 1, Category::activations, "loss sum");
  const float sum = sum_to_host(be, losses, sum_block.flat(DType::f32));
  if (backward) be.fill(losses, dloss_scale);
  return sum;
}

double head_loss(UnitHooks& hooks, Backend& be, Pool& pool, const TpContext& tp, const ModelSpec& spec, Tensor out,
                 const Batch& batch, float dlogit_scale, bool backward, DType grad_dtype, Block* dlogits) {
  SHARD_CHECK(grad_dtype == DType::f32 ||
                  (dlogits && backward && !tp.active() && !blocks::chunked_loss(spec, tp.config)),
              "the logits' gradient in {} is the whole cross-entropy's, in a backward, into a block",
              dtype_name(grad_dtype));
  if (blocks::chunked_loss(spec, tp.config)) {  // the head gave its N losses (as it decided by the same test)
    const std::vector<int64_t> rows{batch.B * batch.T};
    return hooks.loss_rows(be, pool, out.reshape(rows), batch, dlogit_scale, backward);
  }
  if (tp.active())
    return vocab_parallel_loss(be, pool, tp, spec, out, batch, backward ? out : Tensor(),
                               backward ? dlogit_scale : 0.f);
  if (!backward) return hooks.forward_loss(be, pool, out, batch);
  Block in_place;
  return hooks.loss(be, pool, out, batch, dlogit_scale, grad_dtype, dlogits ? *dlogits : in_place);
}

Block logits_grad_block(Pool& pool, DType t, int64_t n) {
  return pool.alloc(t, n, Category::activations, "dlogits (" + std::string(dtype_name(t)) + ")");
}

DType logits_grad_dtype(const Unit& head, const TpContext& tp, const ModelSpec& spec, bool backward) {
  if (!backward || tp.active() || blocks::chunked_loss(spec, tp.config)) return DType::f32;
  return head.output_grad_dtype();
}

Block forward_unit(Unit& unit, size_t u, UnitContext& ctx, UnitHooks& hooks, Tensor in, Saved& saved,
                   bool train, Block* release) {
  ctx.pool.ledger().set_phase(Phase::forward(u));
  Backend::Range range(ctx.be, ("forward " + unit.name()).c_str());  // NVTX on CUDA
  Block out = ctx.pool.alloc(DType::f32, unit.out_elems(ctx.spec, ctx.batch.B, ctx.batch.T), Category::activations,
                             unit.name() + " output");
  unit.forward(ctx, hooks.forward_params(u), in, out.flat(DType::f32), saved);
  hooks.after_forward(u);
  if (!train || (ctx.checkpointing == Checkpointing::blocks && unit.recomputable())) saved.clear();
  else if (ctx.spec.activation_dtype != DType::f32) saved.narrow(ctx.be, ctx.pool, ctx.spec.activation_dtype);
  if (release) release->reset();
  return out;
}

void backward_unit(Unit& unit, size_t u, UnitContext& ctx, UnitHooks& hooks, Tensor in, Block& out,
                   Saved& saved, Tensor dout, int64_t din_elems, Block& grad, DeferredWeightGrads* deferred) {
  ctx.pool.ledger().set_phase(Phase::backward(u));
  Backend::Range range(ctx.be, ("backward " + unit.name()).c_str());
  saved.widen(ctx.be, ctx.pool);  // --activation-dtype bf16: back to f32 for the kernels
  Block din;
  if (din_elems > 0) din = ctx.pool.alloc(DType::f32, din_elems, Category::activations, unit.name() + " dinput");
  const Tensor dinput = din ? din.flat(DType::f32) : Tensor();
  // The backward itself; a split one holds its weight-gradient GEMMs in `deferred`, keeping as
  // they are the operands that are blocks freed below (saved activations, the output, the
  // incoming gradient) and handed over here.
  const auto backward = [&](const ParamSet& p, const ParamSet& g) {
    if (deferred) {
      deferred->set_grads(&g);
      deferred->set_sources(saved.block_starts());
      for (const Block* b : {&out, &grad})
        if (*b) deferred->add_source(b->data());
    }
    ctx.deferred = deferred;
    unit.backward(ctx, p, g, saved, in, dout, dinput);
    ctx.deferred = nullptr;
    if (!deferred) return;
    deferred->set_grads(nullptr);
    for (const void* data : deferred->wanted()) {
      if (Block b = saved.take(data)) deferred->adopt(std::move(b));
      else if (out && out.data() == data) deferred->adopt(std::move(out));
      else if (grad && grad.data() == data) deferred->adopt(std::move(grad));
      else SHARD_CHECK(false, "{}: a held weight-gradient operand at {} was freed during its backward", unit.name(), data);
    }
  };
  if (saved.empty() && ctx.checkpointing == Checkpointing::blocks && unit.recomputable()) {
    // The block's forward again, with the parameters its backward uses (under ZeRO-3 gathered for
    // backward already: no extra communication); a kept output is rewritten unchanged.
    ParamSet p = hooks.backward_params(u);
    Block scratch;
    if (!out)
      scratch = ctx.pool.alloc(DType::f32, unit.out_elems(ctx.spec, ctx.batch.B, ctx.batch.T), Category::activations,
                               unit.name() + " recomputed output");
    ctx.recomputing = true;  // a MoE layer's statistics were counted by the first forward
    unit.forward(ctx, p, in, out ? out.flat(DType::f32) : scratch.flat(DType::f32), saved);
    ctx.recomputing = false;
    backward(p, hooks.grads(u));
  } else {
    backward(hooks.backward_params(u), hooks.grads(u));
  }
  saved.clear();
  out.reset();
  grad = std::move(din);
  if (deferred) hooks.after_input_grad(u);
  else hooks.after_backward(u);
}

void weight_unit(Unit& unit, size_t u, UnitContext& ctx, UnitHooks& hooks, DeferredWeightGrads& held) {
  ctx.pool.ledger().set_phase(Phase::weight(u));
  Backend::Range range(ctx.be, ("weight grads " + unit.name()).c_str());
  // Nothing held (an embedding, a head whose GEMM ran in B): no gradient views to ask for, which
  // under mixed precision would be an f32 copy of the unit's gradient, zeroed and flushed.
  if (!held.empty()) held.run(ctx.be, hooks.grads(u));
  hooks.after_backward(u);
}

namespace {
// Forward through every unit; outs[u] is unit u's output, saved[u] what its backward needs (kept
// only when `keep_saved`: evaluation frees each unit's input as soon as the next unit has run).
void forward_units(const std::vector<std::unique_ptr<Unit>>& units, UnitContext& ctx, UnitHooks& hooks,
                   std::vector<Block>& outs, std::vector<Saved>& saved, bool keep_saved) {
  for (size_t u = 0; u < units.size(); ++u) {
    const Tensor in = u == 0 ? Tensor() : outs[u - 1].flat(DType::f32);
    outs[u] = forward_unit(*units[u], u, ctx, hooks, in, saved[u], keep_saved,
                           !keep_saved && u > 0 ? &outs[u - 1] : nullptr);
  }
}
}  // namespace

RunResult run_forward(const std::vector<std::unique_ptr<Unit>>& units, const ModelSpec& spec, Backend& be, Pool& pool,
                      const Batch& batch, UnitHooks& hooks, std::vector<float>* logits, const TpContext& tp,
                      EpContext* ep) {
  SHARD_REQUIRE(batch.T <= spec.seq, "sequence length {} exceeds the model's {} positions", batch.T, spec.seq);
  UnitContext ctx{be, pool, spec, batch, Checkpointing::none, tp, ep};
  const int64_t N = batch.B * batch.T;
  std::vector<Block> outs(units.size());
  std::vector<Saved> saved(units.size());
  forward_units(units, ctx, hooks, outs, saved, false);
  Tensor out = final_logits(be, outs.back(), N, blocks::chunked_loss(spec, tp.config) ? nullptr : logits);
  pool.ledger().set_phase({PhaseKind::loss});
  RunResult r;
  r.positions = N;
  r.loss_sum = head_loss(hooks, be, pool, tp, spec, out, batch, 0.f, false);
  pool.ledger().set_phase({});
  return r;
}

namespace {
// The micro-step's auxiliary channel summed over the group and finished (its loss, and what the
// backward reads).
void finish_aux(UnitHooks& hooks, AuxChannel& aux, float dlogit_scale, int64_t positions, RunResult& r) {
  std::vector<float> packed = aux.pack();
  hooks.reduce_aux(packed);
  aux.unpack(packed);
  aux.finish(dlogit_scale);
  r.aux_sum = aux.loss() * static_cast<double>(positions);
  aux.add_stats(r.aux_stats);
}
}  // namespace

RunResult run_forward_backward(const std::vector<std::unique_ptr<Unit>>& units, const ModelSpec& spec, Backend& be,
                               Pool& pool, const Batch& batch, UnitHooks& hooks, float dlogit_scale,
                               std::vector<float>* logits, Checkpointing checkpointing, const TpContext& tp,
                               EpContext* ep) {
  SHARD_REQUIRE(batch.T <= spec.seq, "sequence length {} exceeds the model's {} positions", batch.T, spec.seq);
  UnitContext ctx{be, pool, spec, batch, checkpointing, tp, ep};
  const size_t U = units.size();
  const int64_t N = batch.B * batch.T;
  std::vector<Block> outs(U);
  std::vector<Saved> saved(U);
  const std::unique_ptr<AuxChannel> aux = family_of(spec).aux_channel(spec);
  ctx.aux = aux.get();
  forward_units(units, ctx, hooks, outs, saved, true);
  Tensor out = final_logits(be, outs.back(), N, blocks::chunked_loss(spec, tp.config) ? nullptr : logits);
  pool.ledger().set_phase({PhaseKind::loss});
  RunResult r;
  r.positions = N;
  if (aux) finish_aux(hooks, *aux, dlogit_scale, N, r);
  // The gradient flowing into unit u's output: the last unit's in the logits, or (a GPU's bf16
  // head) in a block of its own, the f32 logits then freed.
  const DType grad_dtype = logits_grad_dtype(*units.back(), tp, spec, true);
  Block dnext;
  r.loss_sum = head_loss(hooks, be, pool, tp, spec, out, batch, dlogit_scale, true, grad_dtype, &dnext);
  Tensor dout = out;
  if (dnext) {
    dout = dnext.view(grad_dtype, {N, out.numel() / N});
    outs.back().reset();
  }
  for (size_t u = U; u-- > 0;) {
    const Tensor in = u == 0 ? Tensor() : outs[u - 1].flat(DType::f32);
    const int64_t din_elems = u == 0 ? 0 : static_cast<int64_t>(outs[u - 1].bytes() / sizeof(float));
    backward_unit(*units[u], u, ctx, hooks, in, outs[u], saved[u], dout, din_elems, dnext);
    dout = dnext ? dnext.flat(DType::f32) : Tensor();
  }
  pool.ledger().set_phase({});
  return r;
}

}  // namespace shardlab
