// units.cpp — GPT-2's units with explicit forward and backward: the embedding (wte + wpe), each
// pre-LayerNorm transformer block, and the head (ln_f, then logits through the tied wte).
//
// Tensor parallelism (Megatron, tp.hpp's regions): a rank computes its H/T heads (c_attn's local
// [q | k | v] columns) and F/T of the MLP's hidden columns; attn.c_proj and mlp.c_proj are
// row-parallel, their outputs partial sums that leave the region reduced, and their replicated
// biases are added once, after the reduction. The embedding looks up its vocabulary rows (rank 0
// adds wpe, so the group's sum holds it once) and leaves as a region output; the head enters as a
// region input and computes its vocabulary columns of the logits. The same code runs at tp 1,
// where every region call is a no-op. With sequence parallelism a rank keeps only its own rows of
// each region's input for backward and all-gathers them again there, as Megatron does: one more
// all-gather per region input (activations / T instead of the whole (N, C)).
#include <algorithm>

#include "src/model/blocks/attention.hpp"
#include "src/model/blocks/linear.hpp"
#include "src/model/blocks/loss_head.hpp"
#include "src/model/blocks/weight_grad.hpp"
#include "src/model/gpt2/gpt2.hpp"
#include "src/model/parallel/cp.hpp"
#include "src/model/tp.hpp"
#include "src/backend/ops/activation.hpp"
#include "src/backend/ops/embedding.hpp"
#include "src/backend/ops/norm.hpp"

namespace shardlab {
namespace {

// inp's dtype: f32, or rounded already (blocks::save_product_operand).
GemmDesc forward_desc(const Tensor& inp, const Tensor& w, int64_t N, int64_t IC, int64_t OC) {
  GemmDesc d = gemm_with(w);
  d.a_type = inp.dtype();
  d.m = N, d.n = OC, d.k = IC;
  d.lda = IC, d.ldb = OC, d.ldc = OC;
  return d;
}

// out (N, OC) = inp (N, IC) @ W (IC, OC)
void linear_forward(Backend& be, Tensor out, Tensor inp, Tensor w, int64_t N, int64_t IC, int64_t OC) {
  be.gemm(forward_desc(inp, w, N, IC, OC), inp.data(), w.data(), out.data());
}

// out (N, OC) = inp (N, IC) @ W (IC, OC) + bias, the bias in the product's epilogue where the
// backend fuses one (blocks::gemm_epilogue); out f32, or bf16 written so by the product.
void matmul_forward(UnitContext& c, Tensor out, Tensor inp, Tensor w, Tensor bias, int64_t N, int64_t IC, int64_t OC) {
  blocks::gemm_epilogue(c, forward_desc(inp, w, N, IC, OC), inp.data(), w.data(), out, GemmEpilogue::bias, bias, {});
}

// out (N, OC) += inp (N, IC) @ W (IC, OC) + bias: the product summed into the residual out holds
// (beta 1, in the epilogue's pass where the backend fuses one); out f32.
void matmul_forward_onto(UnitContext& c, Tensor out, Tensor inp, Tensor w, Tensor bias, int64_t N, int64_t IC,
                         int64_t OC) {
  GemmDesc d = forward_desc(inp, w, N, IC, OC);
  d.beta = 1.f;
  blocks::gemm_epilogue(c, d, inp.data(), w.data(), out, GemmEpilogue::bias, bias, {});
}

// out = gelu(pre), pre (N, OC) = inp (N, IC) @ W (IC, OC) + bias: one product with its epilogue
// where the backend fuses one; out and pre both f32 or both bf16.
void matmul_gelu_forward(UnitContext& c, Tensor out, Tensor pre, Tensor inp, Tensor w, Tensor bias, int64_t N,
                         int64_t IC, int64_t OC) {
  blocks::gemm_epilogue(c, forward_desc(inp, w, N, IC, OC), inp.data(), w.data(), out, GemmEpilogue::bias_gelu, bias,
                        pre);
}

// Whether the MLP keeps GELU's argument and output in bf16, written so by c_fc's product (its
// epilogue rounds each once, as narrowing them would): under --activation-dtype bf16 where the
// products round to bf16 (c_proj's weight `product`), the only readers being c_proj's products and
// GELU's backward in c_proj's epilogue.
bool mlp_in_bf16(const UnitContext& c, DType product) {
  return blocks::activations_written_bf16(c) && product == DType::bf16;
}

// dinp (N, IC) = dout @ W^T (overwritten, in dinp's dtype: f32, or bf16 where its readers take
// it so; times gelu'(gelu_at) when given, GELU's backward in the product's epilogue where the
// backend fuses one); dW += inp^T @ dout (held for the W pass under a split backward:
// blocks/weight_grad.hpp); dbias += column sums of dout.
// dout_rounded (optional): dout as the products read it, rounded already by its producer; the
// bias gradient still sums dout itself. dbias_zero: dbias holds zeros no other producer wrote
// (ParamSet::claim_zeroed), so where the products read dout as it is (bf16 already: no rounding
// between) the weight's product may write the bias gradient too (its BGRAD epilogue).
void matmul_backward(UnitContext& c, Tensor dinp, Tensor dw, Tensor dbias, bool dbias_zero, Tensor dout, Tensor inp,
                     Tensor w, int64_t N, int64_t IC, int64_t OC, Tensor gelu_at = {}, Tensor dout_rounded = {}) {
  Backend& be = c.be;
  Block held;  // dout as both products read it
  const Tensor dy = dout_rounded.data()
                        ? dout_rounded
                        : blocks::rounded_once(c, dout, w.dtype(), held, "matmul backward rounded dout");
  GemmDesc dx = gemm_with(w);
  dx.a_type = dy.dtype();
  dx.c_type = dinp.dtype();
  dx.trans_b = Trans::T;
  dx.m = N, dx.n = IC, dx.k = OC;
  dx.lda = OC, dx.ldb = OC, dx.ldc = IC;
  if (gelu_at.data() != nullptr)
    blocks::gemm_epilogue(c, dx, dy.data(), w.data(), dinp, GemmEpilogue::dgelu, {}, gelu_at);
  else
    be.gemm(dx, dy.data(), w.data(), dinp.data());
  const GemmDesc wd = weight_grad_desc(w.dtype(), IC, OC, N);
  if (dbias_zero && dy.data() == dout.data() && weight_gemm_bias_grad(c, wd, inp, dy, dw, dbias)) return;
  weight_gemm(c, wd, inp, dy, dw);
  be.sum_rows(Tensor(dout.data(), dout.dtype(), {N, OC}, dout.device()), dbias, true);
}

Tensor flat_view(const Block& b, std::initializer_list<int64_t> shape) { return b.view(DType::f32, shape); }

float eps(const ModelSpec& s) { return static_cast<float>(s.norm_eps); }

// Token rows of the residual stream a unit's input and output hold (tp.hpp): N / T with sequence
// parallelism, else N.
int64_t stream_rows(const TpConfig& tp, int64_t B, int64_t T) { return tp_local_rows(TpContext{tp}, B * T); }

// With sequence parallelism, workspace for all N rows of a region: its input gathered, or its
// partial output before the reduce-scatter; empty without (the rank's rows are all rows).
Block region_rows(UnitContext& c, const std::string& what) {
  if (!c.tp.sequence_parallel()) return {};
  return c.pool.alloc(DType::f32, c.batch.B * c.batch.T * c.spec.dim, Category::workspace, what);
}
// b's first rows x C floats, or `otherwise` when b is empty.
Tensor rows_of(const Block& b, int64_t rows, int64_t C, Tensor otherwise = {}) {
  return b ? b.view(DType::f32, {rows, C}) : otherwise;
}

// A row-parallel projection into out (n, C): the rank's partial product, reduced over the group,
// then the replicated bias added once, to the sum. Without tensor parallelism there is nothing to
// reduce, and the bias rides in the product's epilogue where the backend fuses one.
void row_parallel_forward(UnitContext& c, Tensor out, Tensor inp, Tensor w, Tensor bias, const Block& rows, int64_t N,
                          int64_t IC, int64_t OC) {
  if (!c.tp.active()) return matmul_forward(c, out, inp, w, bias, N, IC, OC);
  Tensor partial = rows_of(rows, N, OC, out);
  linear_forward(c.be, partial, inp, w, N, IC, OC);
  tp_region_output(c, partial, out);
  c.be.add_bias(out, bias);
}

// wpe from row pos0 on (empty stays empty): positions pos0, pos0 + 1, ... read rows 0, 1, ...
Tensor from_position(const Tensor& wpe, int64_t pos0) {
  if (wpe.data() == nullptr || pos0 == 0) return wpe;
  const int64_t C = wpe.dim(1);
  return Tensor(wpe.ptr<float>() + pos0 * C, DType::f32, {wpe.dim(0) - pos0, C}, wpe.device());
}

// f(rows x of the batch, their tokens, B, T, wpe from their first position): once over the whole
// batch, or under --cp piece by piece (each piece's positions start at its own).
template <class F>
void by_position(const UnitContext& c, Tensor x, const Tensor& wpe, F f) {
  if (!c.batch.context_parallel()) return f(x, c.batch.tokens, c.batch.B, c.batch.T, wpe);
  const int64_t C = c.spec.dim;
  for (const CpPiece& p : c.batch.cp->batch_pieces(c.batch.B)) {
    const int64_t shape[] = {p.len, C};
    f(x.slice(p.row0 * C, p.len * C).reshape(shape), c.batch.tokens + p.row0, 1, p.len, from_position(wpe, p.pos0));
  }
}

class EmbeddingUnit final : public Unit {
 public:
  EmbeddingUnit(UnitLayout layout, const TpConfig& tp) : Unit(std::move(layout)), tp_(tp) {}
  bool backward_reads_params() const override { return false; }  // it scatters into the gradients only
  int64_t out_elems(const ModelSpec& s, int64_t B, int64_t T) const override { return stream_rows(tp_, B, T) * s.dim; }

  void forward(UnitContext& c, const ParamSet& p, Tensor, Tensor out, Saved&) override {
    const Tensor wte = p("wte.weight");
    if (!c.tp.active()) {
      by_position(c, out, p("wpe.weight"), [&](Tensor x, const int32_t* tokens, int64_t B, int64_t T, Tensor wpe) {
        ops::embedding_forward(c.be, x, tokens, B, T, wte, wpe);
      });
      return;
    }
    // Each rank's lookup is zero for other ranks' tokens: the group's sum is the embedding.
    Block rows = region_rows(c, "embedding partial sums");
    Tensor partial = rows_of(rows, c.batch.B * c.batch.T, c.spec.dim, out);
    by_position(c, partial, c.tp.config.rank == 0 ? p("wpe.weight") : Tensor(),
                [&](Tensor x, const int32_t* tokens, int64_t B, int64_t T, Tensor wpe) {
                  ops::embedding_forward_shard(c.be, x, tokens, B, T, wte, wpe, v0(c));
                });
    tp_region_output(c, partial, out);
  }
  void backward(UnitContext& c, const ParamSet&, const ParamSet& g, Saved&, Tensor, Tensor dout, Tensor) override {
    const Tensor dwte = g("wte.weight");
    if (!c.tp.active()) {
      by_position(c, dout, g("wpe.weight"), [&](Tensor x, const int32_t* tokens, int64_t B, int64_t T, Tensor dwpe) {
        ops::embedding_backward(c.be, dwte, dwpe, x, tokens, B, T);
      });
      return;
    }
    // Every rank gets wpe's whole gradient (it is replicated) and its vocabulary rows' part of wte's.
    Block rows = region_rows(c, "embedding backward gathered rows");
    Tensor dy = tp_region_output_backward(c, dout, rows_of(rows, c.batch.B * c.batch.T, c.spec.dim));
    by_position(c, dy, g("wpe.weight"), [&](Tensor x, const int32_t* tokens, int64_t B, int64_t T, Tensor dwpe) {
      ops::embedding_backward_shard(c.be, dwte, dwpe, x, tokens, B, T, v0(c));
    });
  }
  bool decodes() const override { return tp_.degree == 1; }  // tensor-parallel parts: the whole forward
  // Positions pos0 on: wpe from its row pos0.
  void forward_cached(UnitContext& c, const ParamSet& p, Tensor, Tensor out, Saved&, int64_t pos0) override {
    ops::embedding_forward(c.be, out, c.batch.tokens, c.batch.B, c.batch.T, p("wte.weight"),
                           from_position(p("wpe.weight"), pos0));
  }

 private:
  static int64_t v0(const UnitContext& c) {
    return vocab_shard(c.spec.vocab, c.tp.config.degree, c.tp.config.rank).begin;
  }
  TpConfig tp_;
};

class BlockUnit final : public Unit {
 public:
  BlockUnit(UnitLayout layout, int64_t index, const TpConfig& tp)
      : Unit(std::move(layout)), prefix_("h." + std::to_string(index) + "."), tp_(tp) {}
  bool recomputable() const override { return true; }
  bool gemm_only(const std::string& t) const override {  // the four projections' weights (wg)
    for (const char* m : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"})
      if (t == prefix_ + m) return true;
    return false;
  }
  int64_t out_elems(const ModelSpec& s, int64_t B, int64_t T) const override { return stream_rows(tp_, B, T) * s.dim; }
  // forward's ln1, x2, ln2, qkv, atty, fch and fch_gelu; the scores without the fused kernel
  // (unless checkpointed); not the norms' statistics.
  int64_t saved_elems_at_least(const ModelSpec& s, int64_t B, int64_t T, Checkpointing ck, bool cp) const override {
    if (ck == Checkpointing::blocks) return 0;
    const int64_t N = B * T, n = stream_rows(tp_, B, T), A = s.dim / tp_.degree, F = s.ffn_hidden() / tp_.degree;
    int64_t e = 3 * n * s.dim + N * 4 * A + N * 2 * F;
    if (s.attention == AttentionKernel::naive && !cp && ck == Checkpointing::none) e += B * (s.heads / tp_.degree) * T * T;
    return e;
  }

  // n: the residual stream's rows (tp.hpp); H, A = H * head size and F: this rank's heads, attention
  // width and MLP hidden columns (all of them at tp 1).
  void forward(UnitContext& c, const ParamSet& p, Tensor in, Tensor out, Saved& s) override {
    const int64_t B = c.batch.B, T = c.batch.T, C = c.spec.dim, N = B * T, n = stream_rows(tp_, B, T);
    const int64_t D = tp_.degree, H = c.spec.heads / D, A = C / D, F = c.spec.ffn_hidden() / D;  // F: 4C / D
    Backend& be = c.be;
    Block rows = region_rows(c, prefix_ + "region rows");
    // ln1, ln2 and fch_gelu only products read: saved as they read them (save_product_operand).
    Tensor ln1_mean = s.add_f32(c.pool, "ln1_mean", {n}), ln1_rstd = s.add_f32(c.pool, "ln1_rstd", {n});
    Tensor ln1 = blocks::save_product_operand(c, s, "ln1", {n, C}, wg(p, "attn.c_attn.weight").dtype(), true,
                                              [&](Tensor t) {
      ops::layernorm_forward(be, t, ln1_mean, ln1_rstd, in, w(p, "ln_1.weight"), w(p, "ln_1.bias"), eps(c.spec));
    }, true);
    // q, k, v in the dtype the attention keeps them in: bf16 written so by the product's epilogue.
    const DType proj = wg(p, "attn.c_proj.weight").dtype();
    Tensor qkv = blocks::attention_operand_dtype(c, proj) == DType::bf16
                     ? s.add_as(c.pool, "qkv", {B, T, 3 * A}, DType::bf16)
                     : s.add(c.pool, "qkv", {B, T, 3 * A});
    matmul_forward(c, qkv, tp_region_input(c, ln1, rows_of(rows, N, C)), wg(p, "attn.c_attn.weight"),
                   w(p, "attn.c_attn.bias"), N, C, 3 * A);
    Tensor atty = blocks::attention_forward(c, s, qkv, {B, T, H, H, A / H}, proj);
    // x2, the residual stream after attention: saved for ln_2's backward. Where the activations are
    // written in bf16 it is saved as ln_2's forward rounds it, and kept in f32 for this forward alone:
    // in `out` itself, onto which c_proj's product then sums the MLP's output (no add pass), or, under
    // tensor parallelism (whose region reduces the partial sums first), in a workspace.
    const bool direct = blocks::activations_written_bf16(c), onto_out = direct && !c.tp.active();
    Block x2_wide;
    Tensor x2, x2_saved;
    if (direct) {
      x2_saved = s.add_as(c.pool, "x2", {n, C}, DType::bf16);
      if (!onto_out) x2_wide = c.pool.alloc(DType::f32, n * C, Category::workspace, prefix_ + "x2 (f32, forward)");
      x2 = onto_out ? Tensor(out.data(), DType::f32, {n, C}, out.device()) : x2_wide.view(DType::f32, {n, C});
    } else {
      x2 = s.add(c.pool, "x2", {n, C});
    }
    row_parallel_forward(c, x2, atty, wg(p, "attn.c_proj.weight"), w(p, "attn.c_proj.bias"), rows, N, A, C);
    be.add(x2, in, x2);  // residual
    Tensor ln2_mean = s.add_f32(c.pool, "ln2_mean", {n}), ln2_rstd = s.add_f32(c.pool, "ln2_rstd", {n});
    Tensor ln2 = blocks::save_product_operand(c, s, "ln2", {n, C}, wg(p, "mlp.c_fc.weight").dtype(), true,
                                              [&](Tensor t) {
      ops::layernorm_forward(be, t, ln2_mean, ln2_rstd, x2, w(p, "ln_2.weight"), w(p, "ln_2.bias"), eps(c.spec),
                             x2_saved);
    }, true);
    const DType mlp_proj = wg(p, "mlp.c_proj.weight").dtype();
    Tensor fch_gelu;
    if (mlp_in_bf16(c, mlp_proj)) {
      Tensor fch = s.add_as(c.pool, "fch", {N, F}, DType::bf16);
      fch_gelu = s.add_as(c.pool, "fch_gelu", {N, F}, DType::bf16);
      matmul_gelu_forward(c, fch_gelu, fch, tp_region_input(c, ln2, rows_of(rows, N, C)), wg(p, "mlp.c_fc.weight"),
                          w(p, "mlp.c_fc.bias"), N, C, F);
    } else {
      Tensor fch = s.add(c.pool, "fch", {N, F});
      fch_gelu = blocks::save_product_operand(c, s, "fch_gelu", {N, F}, mlp_proj, true, [&](Tensor t) {
        matmul_gelu_forward(c, t, fch, tp_region_input(c, ln2, rows_of(rows, N, C)), wg(p, "mlp.c_fc.weight"),
                            w(p, "mlp.c_fc.bias"), N, C, F);
      });
    }
    if (onto_out)
      return matmul_forward_onto(c, x2, fch_gelu, wg(p, "mlp.c_proj.weight"), w(p, "mlp.c_proj.bias"), N, F, C);
    row_parallel_forward(c, out, fch_gelu, wg(p, "mlp.c_proj.weight"), w(p, "mlp.c_proj.bias"), rows, N, F, C);
    be.add(out, x2, out);  // residual
  }

  void backward(UnitContext& c, const ParamSet& p, const ParamSet& g, Saved& s, Tensor in, Tensor dout,
                Tensor din) override {
    const int64_t B = c.batch.B, T = c.batch.T, C = c.spec.dim, N = B * T, n = stream_rows(tp_, B, T);
    const int64_t D = tp_.degree, H = c.spec.heads / D, A = C / D, F = c.spec.ffn_hidden() / D;
    Backend& be = c.be;
    // big holds d(fch), then d(qkv): F >= 3C unless a config's n_inner says otherwise.
    Block big = c.pool.alloc(DType::f32, N * std::max(F, 3 * A), Category::workspace, prefix_ + "backward dfch");
    Block small = c.pool.alloc(DType::f32, N * C, Category::workspace, prefix_ + "backward dln");
    const blocks::AttentionShape shape{B, T, H, H, A / H};
    Block scratch = blocks::attention_scratch(c, shape, prefix_);
    // With sequence parallelism: each region's output gradient gathered, its input gathered again,
    // then this rank's rows of the input's gradient.
    Block rows = region_rows(c, prefix_ + "backward region rows");
    TpPartialGrads norms(c, g, {prefix_ + "ln_1.weight", prefix_ + "ln_1.bias", prefix_ + "ln_2.weight",
                                prefix_ + "ln_2.bias"}, prefix_ + "norms");
    // d(fch) in fch's dtype (bf16: c_proj's GELU epilogue writes it so for c_fc's products).
    Tensor dfch = big.view(s("fch").dtype(), {N, F}), dsmall = flat_view(small, {N, C});
    // MLP: out = x2 + c_proj(gelu(c_fc(ln_2(x2)))). The bias's gradient sums every row's: those of
    // dy, which under sequence parallelism holds every rank's rows.
    Tensor dy = tp_region_output_backward(c, dout, rows_of(rows, N, C));
    matmul_backward(c, dfch, w(g, "mlp.c_proj.weight"), w(g, "mlp.c_proj.bias"), zeroed(g, "mlp.c_proj.bias"), dy,
                    s("fch_gelu"), wg(p, "mlp.c_proj.weight"), N, F, C, s("fch"));  // dfch through GELU's backward
    matmul_backward(c, dsmall, w(g, "mlp.c_fc.weight"), w(g, "mlp.c_fc.bias"), zeroed(g, "mlp.c_fc.bias"), dfch,
                    tp_region_input(c, s("ln2"), rows_of(rows, N, C)), wg(p, "mlp.c_fc.weight"), N, C, F);
    Tensor dln2 = rows_of(rows, n, C, dsmall);
    tp_region_input_backward(c, dsmall, dln2);
    // din = d(x2): the residual stream's gradient plus ln_2's, in one pass; where c_proj's products
    // round their operand (and no sequence-parallel gather moves it), rounded once there too.
    const DType proj = wg(p, "attn.c_proj.weight").dtype();
    Block dx2_held;
    Tensor dx2_rounded;
    if (blocks::products_round(c, proj) && !c.tp.sequence_parallel()) {
      dx2_held = c.pool.alloc(proj, n * C, Category::workspace, prefix_ + "backward rounded d(x2)");
      dx2_rounded = dx2_held.view(proj, {n, C});
    }
    ops::layernorm_backward(be, din, norms(prefix_ + "ln_2.weight"), norms(prefix_ + "ln_2.bias"), dln2, s("x2"),
                            w(p, "ln_2.weight"), s("ln2_mean"), s("ln2_rstd"), dout, dx2_rounded);
    // Attention: x2 = x + c_proj(attn(c_attn(ln_1(x))))
    // d(atty) as the attention's backward reads it: bf16 where it kept q, k, v so (written so by
    // c_proj's product), else f32.
    Tensor datty = small.view(s("qkv").dtype(), {N, A});
    matmul_backward(c, datty, w(g, "attn.c_proj.weight"), w(g, "attn.c_proj.bias"), zeroed(g, "attn.c_proj.bias"),
                    tp_region_output_backward(c, din, rows_of(rows, N, C)), s("atty"), wg(p, "attn.c_proj.weight"),
                    N, A, C, {}, dx2_rounded);
    dx2_held.reset();  // read by both products (a split backward's W pass keeps a copy)
    // Where the attention kept q, k, v in bf16 (cuDNN's, or the naive one's under --activation-dtype
    // bf16: blocks::attention_forward), it writes their gradient in bf16 too: c_attn's products read
    // it as they would round it, its bias gradient widens it as it sums.
    Tensor dqkv = big.view(s("qkv").dtype(), {B, T, 3 * A});
    blocks::attention_backward(c, s, dqkv, datty, scratch.flat(DType::f32), shape, prefix_);
    Tensor dln1 = dsmall;  // d(atty) is consumed: reuse its buffer
    matmul_backward(c, dln1, w(g, "attn.c_attn.weight"), w(g, "attn.c_attn.bias"), zeroed(g, "attn.c_attn.bias"), dqkv,
                    tp_region_input(c, s("ln1"), rows_of(rows, N, C)), wg(p, "attn.c_attn.weight"), N, C, 3 * A);
    Tensor dln1_rows = rows_of(rows, n, C, dln1);
    tp_region_input_backward(c, dln1, dln1_rows);
    ops::layernorm_backward(be, din, norms(prefix_ + "ln_1.weight"), norms(prefix_ + "ln_1.bias"), dln1_rows, in,
                            w(p, "ln_1.weight"), s("ln1_mean"), s("ln1_rstd"));
    norms.reduce();
  }

  // forward() with the new positions' keys and values appended to the cache (spec.seq rows each)
  // and attention over it; the activations are this call's only.
  bool decodes() const override { return tp_.degree == 1; }  // tensor-parallel parts: the whole forward
  void forward_cached(UnitContext& c, const ParamSet& p, Tensor in, Tensor out, Saved& cache, int64_t pos0) override {
    const int64_t B = c.batch.B, T = c.batch.T, C = c.spec.dim, H = c.spec.heads, N = B * T;
    const int64_t F = c.spec.ffn_hidden();
    Backend& be = c.be;
    const blocks::AttentionShape shape{B, T, H, H, C / H};
    blocks::kv_cache_open(c, cache, shape, prefix_, pos0);
    Saved s;
    Tensor ln1 = s.add(c.pool, "ln1", {N, C}), ln1_mean = s.add_f32(c.pool, "ln1_mean", {N}),
           ln1_rstd = s.add_f32(c.pool, "ln1_rstd", {N});
    ops::layernorm_forward(be, ln1, ln1_mean, ln1_rstd, in, w(p, "ln_1.weight"), w(p, "ln_1.bias"), eps(c.spec));
    Tensor qkv = s.add(c.pool, "qkv", {B, T, 3 * C});
    matmul_forward(c, qkv, ln1, wg(p, "attn.c_attn.weight"), w(p, "attn.c_attn.bias"), N, C, 3 * C);
    Tensor atty = blocks::attention_cached(c, cache, s, qkv, shape, prefix_, pos0);
    Tensor x2 = s.add(c.pool, "x2", {N, C});
    matmul_forward(c, x2, atty, wg(p, "attn.c_proj.weight"), w(p, "attn.c_proj.bias"), N, C, C);
    be.add(x2, in, x2);  // residual
    Tensor ln2 = s.add(c.pool, "ln2", {N, C}), ln2_mean = s.add_f32(c.pool, "ln2_mean", {N}),
           ln2_rstd = s.add_f32(c.pool, "ln2_rstd", {N});
    ops::layernorm_forward(be, ln2, ln2_mean, ln2_rstd, x2, w(p, "ln_2.weight"), w(p, "ln_2.bias"), eps(c.spec));
    Tensor fch = s.add(c.pool, "fch", {N, F}), fch_gelu = s.add(c.pool, "fch_gelu", {N, F});
    matmul_gelu_forward(c, fch_gelu, fch, ln2, wg(p, "mlp.c_fc.weight"), w(p, "mlp.c_fc.bias"), N, C, F);
    matmul_forward(c, out, fch_gelu, wg(p, "mlp.c_proj.weight"), w(p, "mlp.c_proj.bias"), N, F, C);
    be.add(out, x2, out);  // residual
  }

 private:
  Tensor w(const ParamSet& p, const char* suffix) const { return p(prefix_ + suffix); }
  bool zeroed(const ParamSet& g, const char* suffix) const { return g.claim_zeroed(prefix_ + suffix); }
  Tensor wg(const ParamSet& p, const char* suffix) const { return p.gemm(prefix_ + suffix); }
  std::string prefix_;
  TpConfig tp_;
};

class HeadUnit final : public Unit {
 public:
  HeadUnit(UnitLayout layout, const TpConfig& tp) : Unit(std::move(layout)), tp_(tp) {}
  std::vector<std::string> borrowed() const override { return {"wte.weight"}; }
  bool gemm_only(const std::string& t) const override { return t == "wte.weight"; }  // the logits' products
  // This rank's vocabulary columns (padded) of the logits; every column at tp 1. The chunked loss
  // head (--loss-chunk) gives each position's loss instead.
  int64_t out_elems(const ModelSpec& s, int64_t B, int64_t T) const override {
    return blocks::chunked_loss(s, tp_) ? B * T : B * T * vocab_rows(s);
  }

  void forward(UnitContext& c, const ParamSet& p, Tensor in, Tensor out, Saved& s) override {
    const int64_t N = c.batch.B * c.batch.T, n = stream_rows(tp_, c.batch.B, c.batch.T), C = c.spec.dim,
                  V = vocab_rows(c.spec);
    Tensor lnf = s.add(c.pool, "lnf", {n, C}), mean = s.add_f32(c.pool, "lnf_mean", {n}),
           rstd = s.add_f32(c.pool, "lnf_rstd", {n});
    ops::layernorm_forward(c.be, lnf, mean, rstd, in, p("ln_f.weight"), p("ln_f.bias"), eps(c.spec));
    Block rows = region_rows(c, "head region rows");
    const Tensor x = tp_region_input(c, lnf, rows_of(rows, N, C));
    const Tensor wte = p.gemm("wte.weight");
    // The logits' gradient as the backward's products read it (where the loss writes it so:
    // runner.hpp's logits_grad_dtype).
    output_grad_dtype_ = blocks::product_operand_dtype(c, wte.dtype());
    if (blocks::chunked_loss(c.spec, tp_)) return blocks::chunked_loss_forward(c, out, x, wte);
    GemmDesc d = gemm_with(wte);  // logits (N, V) = lnf (N, C) @ wte^T
    d.trans_b = Trans::T;
    d.m = N, d.n = V, d.k = C;
    d.lda = C, d.ldb = C, d.ldc = V;
    c.be.gemm(d, x.data(), wte.data(), out.data());
  }

  void backward(UnitContext& c, const ParamSet& p, const ParamSet& g, Saved& s, Tensor in, Tensor dout,
                Tensor din) override {
    const int64_t N = c.batch.B * c.batch.T, n = stream_rows(tp_, c.batch.B, c.batch.T), C = c.spec.dim,
                  V = vocab_rows(c.spec);
    Block dlnf_block = c.pool.alloc(DType::f32, N * C, Category::workspace, "head backward dlnf");
    Block rows = region_rows(c, "head backward region rows");  // lnf gathered again, then dlnf's rows
    TpPartialGrads norm(c, g, {"ln_f.weight", "ln_f.bias"}, "ln_f");
    const Tensor wte = p.gemm("wte.weight");
    if (blocks::chunked_loss(c.spec, tp_)) {
      blocks::chunked_loss_backward(c, dlnf_block.flat(DType::f32), g("wte.weight"), dout,
                                    tp_region_input(c, s("lnf"), rows_of(rows, N, C)), wte);
    } else {
      Block held;  // d(logits) as both products read it
      const Tensor dlogits = blocks::rounded_once(c, dout, wte.dtype(), held, "head backward rounded dlogits");
      GemmDesc dx = gemm_with(wte);  // dlnf (N, C) = dlogits (N, V) @ wte (V, C)
      dx.a_type = dlogits.dtype();
      dx.m = N, dx.n = C, dx.k = V;
      dx.lda = V, dx.ldb = C, dx.ldc = C;
      c.be.gemm(dx, dlogits.data(), wte.data(), dlnf_block.data());
      // dwte (V, C) += dlogits^T (V, N) @ lnf (N, C)
      const GemmDesc dw = weight_grad_desc(wte.dtype(), V, C, N);
      const WeightGradsNow now(c);  // d(logits) is too large to hold for a W pass
      weight_gemm(c, dw, dlogits, tp_region_input(c, s("lnf"), rows_of(rows, N, C)), g("wte.weight"));
    }
    const Tensor dlnf = dlnf_block.view(DType::f32, {N, C}), dlnf_rows = rows_of(rows, n, C, dlnf);
    tp_region_input_backward(c, dlnf, dlnf_rows);
    c.be.fill(din, 0.f);
    ops::layernorm_backward(c.be, din, norm("ln_f.weight"), norm("ln_f.bias"), dlnf_rows, in, p("ln_f.weight"),
                            s("lnf_mean"), s("lnf_rstd"));
    norm.reduce();
  }
  bool decodes() const override { return tp_.degree == 1; }  // tensor-parallel parts: the whole forward
  void forward_cached(UnitContext& c, const ParamSet& p, Tensor in, Tensor out, Saved&, int64_t) override {
    Saved s;  // each position's logits depend on that position alone
    forward(c, p, in, out, s);
  }

 private:
  int64_t vocab_rows(const ModelSpec& s) const { return vocab_shard(s.vocab, tp_.degree, tp_.rank).rows; }
  TpConfig tp_;
};

}  // namespace

std::vector<std::unique_ptr<Unit>> make_gpt2_units(const ModelSpec& spec, const TpConfig& tp) {
  std::vector<UnitLayout> layout = gpt2_layout(spec, tp);
  std::vector<std::unique_ptr<Unit>> units;
  units.push_back(std::make_unique<EmbeddingUnit>(std::move(layout[0]), tp));
  for (int64_t l = 0; l < spec.layers; ++l)
    units.push_back(std::make_unique<BlockUnit>(std::move(layout[static_cast<size_t>(l + 1)]), l, tp));
  units.push_back(std::make_unique<HeadUnit>(std::move(layout.back()), tp));
  return units;
}

}  // namespace shardlab
