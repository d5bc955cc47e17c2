// units.cpp — Llama's units with explicit forward and backward: the token embedding, each
// decoder layer (pre-RMSNorm grouped-query attention with RoPE, then a pre-RMSNorm SwiGLU MLP,
// each added to the residual stream), and the head (the final RMSNorm, then the logits through
// lm_head, or through the token embedding when tied).
//
// q, k and v come from one GEMM by the stacked (q_proj; k_proj; v_proj) matrix, straight into the
// [q | k | v] rows attention reads, and gate and up from one GEMM by (gate_proj; up_proj) into the
// [gate | up] rows SwiGLU reads: the tensors are adjacent in every ParamSet (layout.cpp), so the
// stacks are views, and one wide product runs faster than three narrow ones. RoPE rotates q and k
// in place; attention's backward needs them rotated, so the rotated qkv is what is saved.
//
// Tensor parallelism (Megatron's, tp.hpp): the same code on a rank's part. The embedding looks up
// its vocabulary rows and leaves as a region output; a layer's q/k/v and gate/up GEMMs produce the
// rank's heads and MLP columns, attention runs on its H/T query and KV/T K/V heads, and o_proj and
// down_proj give partial sums that leave as region outputs; the head enters as a region input and
// gives the rank's vocabulary columns of the logits. At degree 1 every tp_region_* call and
// TpPartialGrads is a no-op on the same buffer and whole_rows allocates nothing, so the kernels,
// allocations and results are the ones of the code before tensor parallelism.
#include <algorithm>
#include <vector>

#include "src/model/blocks/attention.hpp"
#include "src/model/blocks/linear.hpp"
#include "src/model/blocks/moe.hpp"
#include "src/model/blocks/loss_head.hpp"
#include "src/model/llama/llama.hpp"
#include "src/model/tp.hpp"
#include "src/backend/ops/activation.hpp"
#include "src/backend/ops/embedding.hpp"
#include "src/backend/ops/norm.hpp"
#include "src/backend/ops/rope.hpp"
#include "src/model/blocks/weight_grad.hpp"
#include "src/model/parallel/cp.hpp"

namespace shardlab {
namespace {

using blocks::linear_backward;
using blocks::linear_forward;
using blocks::stacked;

float eps(const ModelSpec& s) { return static_cast<float>(s.norm_eps); }

int64_t local_elems(const ModelSpec& s, const TpConfig& tp, int64_t B, int64_t T) {
  return tp_local_rows(TpContext{tp, nullptr}, B * T) * s.dim;
}

class EmbeddingUnit final : public Unit {
 public:
  EmbeddingUnit(UnitLayout layout, const TpConfig& tp) : Unit(std::move(layout)), tp_(tp) {}
  bool backward_reads_params() const override { return false; }  // it scatters into the gradients only
  int64_t out_elems(const ModelSpec& s, int64_t B, int64_t T) const override { return local_elems(s, tp_, B, T); }

  void forward(UnitContext& c, const ParamSet& p, Tensor, Tensor out, Saved&) override {
    tp_unit_rows(c, tp_);  // checks c.tp is the group the unit was built for
    // No learned positions: RoPE places tokens inside attention.
    if (!c.tp.active()) {
      ops::embedding_forward(c.be, out, c.batch.tokens, c.batch.B, c.batch.T, p("model.embed_tokens.weight"), Tensor());
      return;
    }
    // Vocabulary-parallel: each rank looks up the tokens in its rows (zeros for the others'), and
    // the region output sums the ranks' lookups.
    Block whole = tp_whole_rows(c, "embedding partial");
    Tensor partial = tp_whole_or(whole, c, out);
    ops::embedding_forward_shard(c.be, partial, c.batch.tokens, c.batch.B, c.batch.T, p("model.embed_tokens.weight"),
                                 Tensor(), vocab_begin(c));
    tp_region_output(c, partial, out);
  }
  void backward(UnitContext& c, const ParamSet&, const ParamSet& g, Saved&, Tensor, Tensor dout, Tensor) override {
    if (!c.tp.active()) {
      ops::embedding_backward(c.be, g("model.embed_tokens.weight"), Tensor(), dout, c.batch.tokens, c.batch.B,
                              c.batch.T);
      return;
    }
    Block whole = tp_whole_rows(c, "embedding backward dout");
    ops::embedding_backward_shard(c.be, g("model.embed_tokens.weight"), Tensor(),
                                  tp_region_output_backward(c, dout, tp_whole_or(whole, c, dout)), c.batch.tokens,
                                  c.batch.B, c.batch.T, vocab_begin(c));
  }
  bool decodes() const override { return tp_.degree == 1; }  // tensor-parallel parts: the whole forward
  void forward_cached(UnitContext& c, const ParamSet& p, Tensor in, Tensor out, Saved&, int64_t) override {
    Saved none;  // a token's embedding is its own: the position enters through RoPE
    forward(c, p, in, out, none);
  }

 private:
  int64_t vocab_begin(const UnitContext& c) const { return vocab_shard(c.spec.vocab, tp_.degree, tp_.rank).begin; }
  TpConfig tp_;
};

class DecoderLayerUnit final : public Unit {
 public:
  DecoderLayerUnit(UnitLayout layout, int64_t index, const ModelSpec& spec, const TpConfig& tp)
      : Unit(std::move(layout)),
        prefix_("model.layers." + std::to_string(index) + "."),
        freqs_(llama_rope_freqs(spec)),
        tp_(tp) {}
  bool recomputable() const override { return true; }
  bool gemm_only(const std::string& t) const override {  // the dense projections' weights (wg, stack)
    for (const char* m : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                          "mlp.down_proj.weight"})
      if (t == prefix_ + m) return true;
    return false;
  }
  int64_t out_elems(const ModelSpec& s, int64_t B, int64_t T) const override { return local_elems(s, tp_, B, T); }
  // forward's ln1, x2, ln2, qkv, atty and the dense MLP's gate_up and swiglu; the scores without
  // the fused kernel (unless checkpointed); not the norms' statistics, q/k norms or experts.
  int64_t saved_elems_at_least(const ModelSpec& s, int64_t B, int64_t T, Checkpointing ck, bool cp) const override {
    if (ck == Checkpointing::blocks) return 0;
    const int64_t N = B * T, rows_c = local_elems(s, tp_, B, T), hd = s.head_size();  // rows_c: Nl x C
    const int64_t H = s.heads / tp_.degree, KV = s.num_kv_heads() / tp_.degree, F = s.ffn_hidden() / tp_.degree;
    int64_t n = 3 * rows_c + N * (H + 2 * KV) * hd + N * H * hd;
    if (!s.moe.enabled()) n += N * 3 * F;
    if (s.attention == AttentionKernel::naive && !cp && ck == Checkpointing::none) n += B * H * T * T;
    return n;
  }

  // Under tensor parallelism in, out, ln1, x2 and ln2 hold the rank's rows (Nl); the rest all N.
  void forward(UnitContext& c, const ParamSet& p, Tensor in, Tensor out, Saved& s) override {
    const Dims d(c, tp_);
    Backend& be = c.be;
    // ln1, ln2 (dense) and swiglu only products read: saved as they read them (save_product_operand).
    Tensor ln1_rstd = s.add_f32(c.pool, "ln1_rstd", {d.Nl});
    Tensor ln1 = blocks::save_product_operand(c, s, "ln1", {d.Nl, d.C}, qkv_weight(p).dtype(), true, [&](Tensor t) {
      ops::rmsnorm_forward(be, t, ln1_rstd, in, w(p, "input_layernorm.weight"), eps(c.spec));
    }, true);
    // Sequence parallelism: ln1 gathered, o_proj's partial sums, ln2 gathered, down_proj's, in turn.
    Block whole = tp_whole_rows(c, prefix_ + "region rows");
    Tensor qkv = s.add(c.pool, "qkv", {d.B, d.T, d.W});
    linear_forward(be, qkv, tp_region_input(c, ln1, tp_whole_or(whole, c, ln1)), qkv_weight(p), d.N);
    qk_norm(c, p, s, qkv, d);
    rope(c, qkv, d, false);  // q and k: the first H + KV heads of each row
    Tensor atty = blocks::attention_forward(c, s, qkv, d.attention(), wg(p, "self_attn.o_proj.weight").dtype());
    // x2, the residual stream after attention: saved for ln2's backward. Where the activations are
    // written in bf16 it is saved as ln2's forward rounds it, and kept in f32 for this forward alone:
    // in `out` itself, onto which down_proj's product then sums the MLP's output (no add pass), or,
    // under tensor parallelism or with experts, in a workspace.
    const bool direct = blocks::activations_written_bf16(c);
    const bool onto_out = direct && !c.tp.active() && !c.spec.moe.enabled();
    Block x2_wide;
    Tensor x2, x2_saved;
    if (direct) {
      x2_saved = s.add_as(c.pool, "x2", {d.Nl, d.C}, DType::bf16);
      if (!onto_out)
        x2_wide = c.pool.alloc(DType::f32, d.Nl * d.C, Category::workspace, prefix_ + "x2 (f32, forward)");
      x2 = onto_out ? Tensor(out.data(), DType::f32, {d.Nl, d.C}, out.device())
                    : x2_wide.view(DType::f32, {d.Nl, d.C});
    } else {
      x2 = s.add(c.pool, "x2", {d.Nl, d.C});
    }
    Tensor attn_out = tp_whole_or(whole, c, x2);
    linear_forward(be, attn_out, atty, wg(p, "self_attn.o_proj.weight"), d.N);
    tp_region_output(c, attn_out, x2);
    be.add(x2, in, x2);  // residual
    // A mixture of experts' router and dispatch read ln2 too: f32 there.
    Tensor ln2_rstd = s.add_f32(c.pool, "ln2_rstd", {d.Nl});
    const bool dense = !c.spec.moe.enabled();
    Tensor ln2 = blocks::save_product_operand(c, s, "ln2", {d.Nl, d.C}, dense ? gate_up_weight(p).dtype() : DType::f32,
                                              dense, [&](Tensor t) {
      ops::rmsnorm_forward(be, t, ln2_rstd, x2, w(p, "post_attention_layernorm.weight"), eps(c.spec), x2_saved);
    }, true);
    // The MLP region (a mixture of experts too: every rank routes all N rows, gathered under SP,
    // through its slices of the experts, and the partial sums are reduced as the dense MLP's).
    mlp_forward(c, p, s, tp_region_input(c, ln2, tp_whole_or(whole, c, ln2)), tp_whole_or(whole, c, out), d,
                onto_out);
    if (onto_out) return;  // out holds x2 + the MLP's output already
    tp_region_output(c, tp_whole_or(whole, c, out), out);
    be.add(out, x2, out);  // residual
  }

  void backward(UnitContext& c, const ParamSet& p, const ParamSet& g, Saved& s, Tensor in, Tensor dout,
                Tensor din) override {
    const Dims d(c, tp_);
    Backend& be = c.be;
    // big holds d(gate_up), then d(qkv); mid d(swiglu); small d(ln2), d(atty), then d(ln1).
    const int64_t F = c.spec.moe.enabled() ? 0 : d.F;  // the dense MLP's width (MoE: blocks/moe.cpp's buffers)
    Block big = c.pool.alloc(DType::f32, d.N * std::max(2 * F, d.W), Category::workspace,
                             prefix_ + "backward dgate_up");
    Block mid = F > 0 ? c.pool.alloc(DType::f32, d.N * F, Category::workspace, prefix_ + "backward dswiglu") : Block();
    Block small = c.pool.alloc(DType::f32, d.N * std::max(d.C, d.H * d.hd), Category::workspace,
                               prefix_ + "backward dln");
    Block scratch = blocks::attention_scratch(c, d.attention(), prefix_);
    // Sequence parallelism: whole holds what a GEMM needs of all N rows, gathered: d(out), ln2,
    // d(x2), ln1 in turn (forward kept only the rank's rows of ln1 and ln2, Megatron's activations
    // / T, so they are gathered again); local the rank's rows of d(ln2), then d(ln1).
    Block whole = tp_whole_rows(c, prefix_ + "backward region rows");
    Block local = c.tp.sequence_parallel() ? c.pool.alloc(DType::f32, d.Nl * d.C, Category::workspace,
                                                          prefix_ + "backward dln rows")
                                           : Block();
    // d(gate_up) in gate_up's dtype: bf16 written so by SwiGLU's backward for its products.
    const DType gu = F > 0 ? s("gate_up").dtype() : DType::f32;
    Tensor dgate_up = big.view(gu, {d.N, 2 * F}), dact = mid ? mid.view(DType::f32, {d.N, F}) : Tensor();
    Tensor dsmall = small.view(DType::f32, {d.N, d.C});
    Tensor dln = local ? local.view(DType::f32, {d.Nl, d.C}) : dsmall;
    TpPartialGrads norm_grads(c, g, {prefix_ + "input_layernorm.weight", prefix_ + "post_attention_layernorm.weight"},
                              prefix_ + "norms");
    // MLP: out = x2 + down(silu(gate(ln2)) * up(ln2)), ln2 = rmsnorm(x2)
    const Tensor dmlp_out = tp_region_output_backward(c, dout, tp_whole_or(whole, c, dout));  // all N rows
    if (c.spec.moe.enabled()) {
      // d(ln2): this rank's partial sum (moe.hpp), reduced as the dense MLP's. The experts read
      // d(out) and ln2 together: under SP ln2's gathered rows need a buffer of their own.
      Block ln2_rows = c.tp.sequence_parallel()
                           ? c.pool.alloc(DType::f32, d.N * d.C, Category::workspace, prefix_ + "moe backward ln2 rows")
                           : Block();
      const Tensor ln2 = tp_region_input(c, s("ln2"), ln2_rows ? ln2_rows.view(DType::f32, {d.N, d.C}) : s("ln2"));
      blocks::moe_backward(c, s, dsmall, dmlp_out, ln2, moe_weights(c.spec, p, true), moe_weights(c.spec, g, false));
      tp_region_input_backward(c, dsmall, dln);
    } else {
      linear_backward(c, dact, w(g, "mlp.down_proj.weight"), dmlp_out, s("swiglu"), wg(p, "mlp.down_proj.weight"),
                      d.N);
      ops::swiglu_backward(be, dgate_up, s("gate_up"), dact);
      linear_backward(c, dsmall, gate_up_weight(g, false), dgate_up,
                      tp_region_input(c, s("ln2"), tp_whole_or(whole, c, s("ln2"))), gate_up_weight(p), d.N);
      tp_region_input_backward(c, dsmall, dln);
    }
    // din = d(x2): the residual stream's gradient plus ln2's, in one pass; where o_proj's products
    // round their operand (and no sequence-parallel gather moves it), rounded once there too.
    const DType o_proj = wg(p, "self_attn.o_proj.weight").dtype();
    Block dx2_held;
    Tensor dx2_rounded;
    if (blocks::products_round(c, o_proj) && !c.tp.sequence_parallel()) {
      dx2_held = c.pool.alloc(o_proj, d.Nl * d.C, Category::workspace, prefix_ + "backward rounded d(x2)");
      dx2_rounded = dx2_held.view(o_proj, {d.Nl, d.C});
    }
    ops::rmsnorm_backward(be, din, norm_grads(prefix_ + "post_attention_layernorm.weight"), dln, s("x2"),
                          w(p, "post_attention_layernorm.weight"), s("ln2_rstd"), dout, dx2_rounded);
    // Attention: x2 = in + o_proj(attn(rope(qkv(ln1)))), ln1 = rmsnorm(in)
    // d(atty) as the attention's backward reads it (bf16 where it kept q, k, v so: o_proj's
    // product writes it so).
    Tensor datty = small.view(s("qkv").dtype(), {d.N, d.H * d.hd});
    const Tensor dattn_out = dx2_rounded.data() ? dx2_rounded
                                                : tp_region_output_backward(c, din, tp_whole_or(whole, c, din));
    linear_backward(c, datty, w(g, "self_attn.o_proj.weight"), dattn_out, s("atty"), wg(p, "self_attn.o_proj.weight"),
                    d.N);
    dx2_held.reset();  // read by both products (a split backward's W pass keeps a copy)
    Tensor dqkv = big.view(DType::f32, {d.B, d.T, d.W});
    blocks::attention_backward(c, s, dqkv, datty, scratch.flat(DType::f32), d.attention(), prefix_);
    rope(c, dqkv, d, true);  // a rotation's gradient rotates back
    qk_norm_backward(c, p, g, s, dqkv, d);
    Tensor dln1 = dsmall;  // d(atty) is consumed: reuse its buffer
    linear_backward(c, dln1, qkv_weight(g, false), dqkv, tp_region_input(c, s("ln1"), tp_whole_or(whole, c, s("ln1"))),
                    qkv_weight(p), d.N);
    tp_region_input_backward(c, dln1, dln);
    ops::rmsnorm_backward(be, din, norm_grads(prefix_ + "input_layernorm.weight"), dln, in,
                          w(p, "input_layernorm.weight"), s("ln1_rstd"));
    norm_grads.reduce();
  }

  // forward() with q and k rotated for positions pos0 on, the new keys and values appended to the
  // cache (spec.seq rows of KV heads each) and attention over it; the activations are this call's only.
  bool decodes() const override { return tp_.degree == 1; }  // tensor-parallel parts: the whole forward
  void forward_cached(UnitContext& c, const ParamSet& p, Tensor in, Tensor out, Saved& cache, int64_t pos0) override {
    const Dims d(c, tp_);
    Backend& be = c.be;
    blocks::kv_cache_open(c, cache, d.attention(), prefix_, pos0);
    Saved s;
    Tensor ln1 = s.add(c.pool, "ln1", {d.N, d.C}), ln1_rstd = s.add_f32(c.pool, "ln1_rstd", {d.N});
    ops::rmsnorm_forward(be, ln1, ln1_rstd, in, w(p, "input_layernorm.weight"), eps(c.spec));
    Tensor qkv = s.add(c.pool, "qkv", {d.B, d.T, d.W});
    linear_forward(be, qkv, ln1, qkv_weight(p), d.N);
    qk_norm(c, p, s, qkv, d);
    ops::rope(be, qkv, d.H + d.KV, d.hd, freqs_, pos0, false);
    Tensor atty = blocks::attention_cached(c, cache, s, qkv, d.attention(), prefix_, pos0);
    Tensor x2 = s.add(c.pool, "x2", {d.N, d.C});
    linear_forward(be, x2, atty, wg(p, "self_attn.o_proj.weight"), d.N);
    be.add(x2, in, x2);  // residual
    Tensor ln2 = s.add(c.pool, "ln2", {d.N, d.C}), ln2_rstd = s.add_f32(c.pool, "ln2_rstd", {d.N});
    ops::rmsnorm_forward(be, ln2, ln2_rstd, x2, w(p, "post_attention_layernorm.weight"), eps(c.spec));
    mlp_forward(c, p, s, ln2, out, d);
    be.add(out, x2, out);  // residual
  }

 private:
  // H, KV, W and F are this tensor-parallel rank's: its query heads, K/V heads, qkv width and
  // MLP width; Nl its token rows between the regions.
  struct Dims {
    int64_t B, T, N, Nl, C, hd, H, KV, W, F;
    Dims(const UnitContext& c, const TpConfig& tp)
        : B(c.batch.B),
          T(c.batch.T),
          N(B * T),
          Nl(tp_unit_rows(c, tp)),
          C(c.spec.dim),
          hd(c.spec.head_size()),
          H(c.spec.heads / tp.degree),
          KV(c.spec.num_kv_heads() / tp.degree),
          W((H + 2 * KV) * hd),
          F(c.spec.ffn_hidden() / tp.degree) {}
    blocks::AttentionShape attention() const { return {B, T, H, KV, hd}; }
  };
  // RoPE of q and k in x (B, T, W) at the rows' positions: 0 on, or under --cp each piece's own.
  void rope(const UnitContext& c, Tensor x, const Dims& d, bool inverse) const {
    if (!c.batch.context_parallel()) return ops::rope(c.be, x, d.H + d.KV, d.hd, freqs_, 0, inverse);
    for (const CpPiece& p : c.batch.cp->batch_pieces(d.B)) {
      const int64_t shape[] = {1, p.len, d.W};
      ops::rope(c.be, x.slice(p.row0 * d.W, p.len * d.W).reshape(shape), d.H + d.KV, d.hd, freqs_, p.pos0, inverse);
    }
  }
  // The MLP of ln2's rows (N, C) into out (N, C): dense SwiGLU, or the experts (blocks/moe.hpp).
  // onto: down_proj's product summed onto what out holds (the dense MLP's; beta 1).
  void mlp_forward(UnitContext& c, const ParamSet& p, Saved& s, Tensor ln2, Tensor out, const Dims& d,
                   bool onto = false) const {
    if (c.spec.moe.enabled()) {
      const int64_t shape[] = {d.N, d.C};
      return blocks::moe_forward(c, s, ln2.reshape(shape), out.reshape(shape), moe_weights(c.spec, p, true));
    }
    // [gate | up]: in bf16 written so by its product where the activations are (SwiGLU reads and
    // its backward reads it widened), else f32 (narrowed with the rest under --activation-dtype bf16).
    Tensor gate_up = blocks::activations_written_bf16(c) && gate_up_weight(p).dtype() == DType::bf16
                         ? s.add_as(c.pool, "gate_up", {d.N, 2 * d.F}, DType::bf16)
                         : s.add(c.pool, "gate_up", {d.N, 2 * d.F});
    linear_forward(c.be, gate_up, ln2, gate_up_weight(p), d.N);
    Tensor act = blocks::save_product_operand(c, s, "swiglu", {d.N, d.F}, wg(p, "mlp.down_proj.weight").dtype(), true,
                                              [&](Tensor t) { ops::swiglu_forward(c.be, t, gate_up); }, true);
    linear_forward(c.be, out, act, wg(p, "mlp.down_proj.weight"), d.N, onto ? 1.f : 0.f);
  }
  blocks::MoeWeights moe_weights(const ModelSpec& spec, const ParamSet& p, bool gemm) const {
    blocks::MoeWeights m;
    const auto get = [&](const std::string& name) { return gemm ? p.gemm(name) : p(name); };
    m.router = get(moe_tensor(spec, prefix_, MoePart::router));
    const int64_t local = spec.moe.experts / layout().ep.degree, first = layout().ep.rank * local;  // this rank's
    for (int64_t e = first; e < first + local; ++e) {
      m.gate_up.push_back(stacked({get(moe_tensor(spec, prefix_, MoePart::gate, e)),
                                   get(moe_tensor(spec, prefix_, MoePart::up, e))}));
      m.down.push_back(get(moe_tensor(spec, prefix_, MoePart::down, e)));
    }
    return m;
  }
  // Qwen3's RMSNorm of each query and key head of qkv (B, T, W), in place, before RoPE.
  void qk_norm(UnitContext& c, const ParamSet& p, Saved& s, Tensor qkv, const Dims& d) const {
    if (!c.spec.qk_norm) return;
    const float e = eps(c.spec);
    ops::head_rmsnorm_forward(c.be, qkv, s.add(c.pool, "q_pre", {d.N, d.H * d.hd}),
                              s.add_f32(c.pool, "q_rstd", {d.N * d.H}), w(p, "self_attn.q_norm.weight"), 0, e);
    ops::head_rmsnorm_forward(c.be, qkv, s.add(c.pool, "k_pre", {d.N, d.KV * d.hd}),
                              s.add_f32(c.pool, "k_rstd", {d.N * d.KV}), w(p, "self_attn.k_norm.weight"), d.H * d.hd, e);
  }
  // The norms' weights are replicated and their gradients sum over heads, which --tp splits:
  // partial sums on each rank, added up over the group.
  void qk_norm_backward(UnitContext& c, const ParamSet& p, const ParamSet& g, Saved& s, Tensor dqkv,
                        const Dims& d) const {
    if (!c.spec.qk_norm) return;
    const std::string q = prefix_ + "self_attn.q_norm.weight", k = prefix_ + "self_attn.k_norm.weight";
    TpPartialGrads grads(c, g, {q, k}, prefix_ + "q/k norms", true);
    ops::head_rmsnorm_backward(c.be, dqkv, grads(q), s("q_pre"), p(q), s("q_rstd"), 0);
    ops::head_rmsnorm_backward(c.be, dqkv, grads(k), s("k_pre"), p(k), s("k_rstd"), d.H * d.hd);
    grads.reduce();
  }
  Tensor w(const ParamSet& p, const char* suffix) const { return p(prefix_ + suffix); }
  Tensor wg(const ParamSet& p, const char* suffix) const { return p.gemm(prefix_ + suffix); }
  // The stacked matrices: ((H + 2 KV) hd, C), rows of q, then k, then v; and (2F, C), gate then
  // up. As the GEMMs take the weights (ParamSet::gemm), or as stored (gradients).
  Tensor stack(const ParamSet& p, bool gemm, std::initializer_list<const char*> suffixes) const {
    std::vector<Tensor> parts;
    for (const char* suffix : suffixes) parts.push_back(gemm ? wg(p, suffix) : w(p, suffix));
    return stacked(parts);
  }
  Tensor qkv_weight(const ParamSet& p, bool gemm = true) const {
    return stack(p, gemm, {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"});
  }
  Tensor gate_up_weight(const ParamSet& p, bool gemm = true) const {
    return stack(p, gemm, {"mlp.gate_proj.weight", "mlp.up_proj.weight"});
  }
  std::string prefix_;
  RopeFreqs freqs_;
  TpConfig tp_;
};

class HeadUnit final : public Unit {
 public:
  HeadUnit(UnitLayout layout, bool tied, const TpConfig& tp)
      : Unit(std::move(layout)),
        weight_(tied ? "model.embed_tokens.weight" : "lm_head.weight"),
        tied_(tied),
        tp_(tp) {}
  std::vector<std::string> borrowed() const override {
    return tied_ ? std::vector<std::string>{weight_} : std::vector<std::string>{};
  }
  bool gemm_only(const std::string& t) const override { return t == weight_; }  // the logits' products
  // The rank's vocabulary columns (all V at degree 1); the runner's loss reduces over the group.
  int64_t out_elems(const ModelSpec& s, int64_t B, int64_t T) const override {
    if (blocks::chunked_loss(s, tp_)) return B * T;  // each position's loss (--loss-chunk)
    return B * T * vocab_shard(s.vocab, tp_.degree, tp_.rank).rows;
  }

  // lnf and in hold the rank's rows under sequence parallelism.
  void forward(UnitContext& c, const ParamSet& p, Tensor in, Tensor out, Saved& s) override {
    const int64_t N = c.batch.B * c.batch.T, Nl = tp_unit_rows(c, tp_), C = c.spec.dim;
    Tensor lnf = s.add(c.pool, "lnf", {Nl, C}), rstd = s.add_f32(c.pool, "lnf_rstd", {Nl});
    ops::rmsnorm_forward(c.be, lnf, rstd, in, p("model.norm.weight"), eps(c.spec));
    Block whole = tp_whole_rows(c, "head lnf gathered");
    const Tensor x = tp_region_input(c, lnf, tp_whole_or(whole, c, lnf));  // every position's rows
    const Tensor w = p.gemm(weight_);
    // The logits' gradient as the backward's products read it (where the loss writes it so:
    // runner.hpp's logits_grad_dtype).
    output_grad_dtype_ = blocks::product_operand_dtype(c, w.dtype());
    if (blocks::chunked_loss(c.spec, tp_)) return blocks::chunked_loss_forward(c, out, x, w);
    linear_forward(c.be, out, x, w, N);  // logits
  }

  void backward(UnitContext& c, const ParamSet& p, const ParamSet& g, Saved& s, Tensor in, Tensor dout,
                Tensor din) override {
    const int64_t N = c.batch.B * c.batch.T, Nl = tp_unit_rows(c, tp_), C = c.spec.dim;
    Block dlnf = c.pool.alloc(DType::f32, N * C, Category::workspace, "head backward dlnf");
    // Sequence parallelism: lnf gathered again for the weight's gradient, then the rank's rows of
    // d(lnf) in the same block (lnf is consumed by then).
    Block whole = tp_whole_rows(c, "head backward lnf gathered");
    if (blocks::chunked_loss(c.spec, tp_)) {
      blocks::chunked_loss_backward(c, dlnf.flat(DType::f32), g(weight_), dout,
                                    tp_region_input(c, s("lnf"), tp_whole_or(whole, c, s("lnf"))), p.gemm(weight_));
    } else {
      const WeightGradsNow now(c);  // d(logits) is too large to hold for a W pass
      linear_backward(c, dlnf.view(DType::f32, {N, C}), g(weight_), dout,
                      tp_region_input(c, s("lnf"), tp_whole_or(whole, c, s("lnf"))), p.gemm(weight_), N);
    }
    Tensor dlnf_rows = whole ? whole.view(DType::f32, {Nl, C}) : dlnf.view(DType::f32, {N, C});
    tp_region_input_backward(c, dlnf.view(DType::f32, {N, C}), dlnf_rows);
    c.be.fill(din, 0.f);
    TpPartialGrads norm_grad(c, g, {"model.norm.weight"}, "head");
    ops::rmsnorm_backward(c.be, din, norm_grad("model.norm.weight"), dlnf_rows, in, p("model.norm.weight"),
                          s("lnf_rstd"));
    norm_grad.reduce();
  }
  bool decodes() const override { return tp_.degree == 1; }  // tensor-parallel parts: the whole forward
  void forward_cached(UnitContext& c, const ParamSet& p, Tensor in, Tensor out, Saved&, int64_t) override {
    Saved s;  // each position's logits depend on that position alone
    forward(c, p, in, out, s);
  }

 private:
  std::string weight_;  // the (V, C) matrix the logits come through: the rank's vocabulary rows
  bool tied_;
  TpConfig tp_;
};

}  // namespace

std::unique_ptr<Unit> make_llama_embedding(UnitLayout layout, const TpConfig& tp) {
  return std::make_unique<EmbeddingUnit>(std::move(layout), tp);
}
std::unique_ptr<Unit> make_llama_head(UnitLayout layout, bool tied, const TpConfig& tp) {
  return std::make_unique<HeadUnit>(std::move(layout), tied, tp);
}

std::vector<std::unique_ptr<Unit>> make_llama_units(const ModelSpec& spec, const TpConfig& tp, const EpConfig& ep) {
  std::vector<UnitLayout> layout = llama_layout(spec, tp, ep);
  std::vector<std::unique_ptr<Unit>> units;
  units.push_back(std::make_unique<EmbeddingUnit>(std::move(layout[0]), tp));
  for (int64_t l = 0; l < spec.layers; ++l)
    units.push_back(std::make_unique<DecoderLayerUnit>(std::move(layout[static_cast<size_t>(l + 1)]), l, spec, tp));
  units.push_back(std::make_unique<HeadUnit>(std::move(layout.back()), spec.tied_head, tp));
  return units;
}

}  // namespace shardlab
