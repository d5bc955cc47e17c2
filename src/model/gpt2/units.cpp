// units.cpp — GPT-2's units with explicit forward and backward: the embedding (wte + wpe), each
// pre-LayerNorm transformer block, and the head (ln_f, then logits through the tied wte).
#include <algorithm>

#include "src/model/gpt2/gpt2.hpp"

namespace shardlab {
namespace {

// out (N, OC) = inp (N, IC) @ W (IC, OC) + bias
void matmul_forward(Backend& be, Tensor out, Tensor inp, Tensor w, Tensor bias, int64_t N, int64_t IC, int64_t OC) {
  GemmDesc d = gemm_with(w);
  d.m = N, d.n = OC, d.k = IC;
  d.lda = IC, d.ldb = OC, d.ldc = OC;
  be.gemm(d, inp.data(), w.data(), out.data());
  be.add_bias(out, bias);
}

// dinp (N, IC) = dout @ W^T (overwritten); dW += inp^T @ dout; dbias += column sums of dout.
void matmul_backward(Backend& be, Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, int64_t N,
                     int64_t IC, int64_t OC) {
  GemmDesc dx = gemm_with(w);
  dx.trans_b = Trans::T;
  dx.m = N, dx.n = IC, dx.k = OC;
  dx.lda = OC, dx.ldb = OC, dx.ldc = IC;
  be.gemm(dx, dout.data(), w.data(), dinp.data());
  GemmDesc dW;  // both operands f32 activations, rounded as the weight is
  dW.round_inputs_to = w.dtype();
  dW.trans_a = Trans::T;
  dW.m = IC, dW.n = OC, dW.k = N;
  dW.lda = IC, dW.ldb = OC, dW.ldc = OC;
  dW.beta = 1.f;
  be.gemm(dW, inp.data(), dout.data(), dw.data());
  be.sum_rows(Tensor(dout.data(), DType::f32, {N, OC}), dbias, true);
}

Tensor flat_view(const Block& b, std::initializer_list<int64_t> shape) { return b.view(DType::f32, shape); }

float eps(const ModelSpec& s) { return static_cast<float>(s.norm_eps); }

class EmbeddingUnit final : public Unit {
 public:
  using Unit::Unit;
  void forward(UnitContext& c, const ParamSet& p, Tensor, Tensor out, Saved&) override {
    c.be.embedding_forward(out, c.batch.tokens, c.batch.B, c.batch.T, p("wte.weight"), p("wpe.weight"));
  }
  void backward(UnitContext& c, const ParamSet&, const ParamSet& g, Saved&, Tensor, Tensor dout, Tensor) override {
    c.be.embedding_backward(g("wte.weight"), g("wpe.weight"), dout, c.batch.tokens, c.batch.B, c.batch.T);
  }
  bool decodes() const override { return true; }
  // Positions pos0 on: wpe from its row pos0.
  void forward_cached(UnitContext& c, const ParamSet& p, Tensor, Tensor out, Saved&, int64_t pos0) override {
    const Tensor wpe = p("wpe.weight");
    const int64_t C = wpe.dim(1);
    const Tensor from(wpe.ptr<float>() + pos0 * C, DType::f32, {wpe.dim(0) - pos0, C}, wpe.device());
    c.be.embedding_forward(out, c.batch.tokens, c.batch.B, c.batch.T, p("wte.weight"), from);
  }
};

class BlockUnit final : public Unit {
 public:
  BlockUnit(UnitLayout layout, int64_t index) : Unit(std::move(layout)), prefix_("h." + std::to_string(index) + ".") {}
  bool recomputable() const override { return true; }

  void forward(UnitContext& c, const ParamSet& p, Tensor in, Tensor out, Saved& s) override {
    const int64_t B = c.batch.B, T = c.batch.T, C = c.spec.dim, H = c.spec.heads, N = B * T;
    const int64_t F = c.spec.ffn_hidden();  // 4C
    Backend& be = c.be;
    Tensor ln1 = s.add(c.pool, "ln1", {N, C}), ln1_mean = s.add(c.pool, "ln1_mean", {N}),
           ln1_rstd = s.add(c.pool, "ln1_rstd", {N});
    be.layernorm_forward(ln1, ln1_mean, ln1_rstd, in, w(p, "ln_1.weight"), w(p, "ln_1.bias"), eps(c.spec));
    Tensor qkv = s.add(c.pool, "qkv", {B, T, 3 * C});
    matmul_forward(be, qkv, ln1, wg(p, "attn.c_attn.weight"), w(p, "attn.c_attn.bias"), N, C, 3 * C);
    Tensor atty = s.add(c.pool, "atty", {N, C}), att = s.add(c.pool, "att", {B, H, T, T});
    be.attention_forward(atty, att, qkv, H, H);
    if (c.checkpointing == Checkpointing::attention) s.drop("att");  // recomputed in backward
    Tensor x2 = s.add(c.pool, "x2", {N, C});
    matmul_forward(be, x2, atty, wg(p, "attn.c_proj.weight"), w(p, "attn.c_proj.bias"), N, C, C);
    be.add(x2, in, x2);  // residual
    Tensor ln2 = s.add(c.pool, "ln2", {N, C}), ln2_mean = s.add(c.pool, "ln2_mean", {N}),
           ln2_rstd = s.add(c.pool, "ln2_rstd", {N});
    be.layernorm_forward(ln2, ln2_mean, ln2_rstd, x2, w(p, "ln_2.weight"), w(p, "ln_2.bias"), eps(c.spec));
    Tensor fch = s.add(c.pool, "fch", {N, F}), fch_gelu = s.add(c.pool, "fch_gelu", {N, F});
    matmul_forward(be, fch, ln2, wg(p, "mlp.c_fc.weight"), w(p, "mlp.c_fc.bias"), N, C, F);
    be.gelu_forward(fch_gelu, fch);
    matmul_forward(be, out, fch_gelu, wg(p, "mlp.c_proj.weight"), w(p, "mlp.c_proj.bias"), N, F, C);
    be.add(out, x2, out);  // residual
  }

  void backward(UnitContext& c, const ParamSet& p, const ParamSet& g, Saved& s, Tensor in, Tensor dout,
                Tensor din) override {
    const int64_t B = c.batch.B, T = c.batch.T, C = c.spec.dim, H = c.spec.heads, N = B * T;
    const int64_t F = c.spec.ffn_hidden();  // 4C
    Backend& be = c.be;
    // big holds d(fch), then d(qkv): F >= 3C unless a config's n_inner says otherwise.
    Block big = c.pool.alloc(DType::f32, N * std::max(F, 3 * C), Category::workspace, prefix_ + "backward dfch");
    Block small = c.pool.alloc(DType::f32, N * C, Category::workspace, prefix_ + "backward dln");
    Block scratch = c.pool.alloc(DType::f32, attention_scratch_elems(T, H), Category::workspace,
                                 prefix_ + "attention scratch");
    Tensor dfch = flat_view(big, {N, F}), dsmall = flat_view(small, {N, C});
    // MLP: out = x2 + c_proj(gelu(c_fc(ln_2(x2))))
    matmul_backward(be, dfch, w(g, "mlp.c_proj.weight"), w(g, "mlp.c_proj.bias"), dout, s("fch_gelu"),
                    wg(p, "mlp.c_proj.weight"), N, F, C);
    be.gelu_backward(dfch, s("fch"), dfch);
    matmul_backward(be, dsmall, w(g, "mlp.c_fc.weight"), w(g, "mlp.c_fc.bias"), dfch, s("ln2"),
                    wg(p, "mlp.c_fc.weight"), N, C, F);
    be.copy(din, dout);  // din accumulates the residual stream: now d(x2)
    be.layernorm_backward(din, w(g, "ln_2.weight"), w(g, "ln_2.bias"), dsmall, s("x2"), w(p, "ln_2.weight"),
                          s("ln2_mean"), s("ln2_rstd"));
    // Attention: x2 = x + c_proj(attn(c_attn(ln_1(x))))
    matmul_backward(be, dsmall, w(g, "attn.c_proj.weight"), w(g, "attn.c_proj.bias"), din, s("atty"),
                    wg(p, "attn.c_proj.weight"), N, C, C);
    Tensor dqkv = big.view(DType::f32, {B, T, 3 * C});
    Block att_again;  // --activation-checkpointing attention: the probabilities again, from q and k
    if (!s.has("att")) {
      att_again = c.pool.alloc(DType::f32, B * H * T * T, Category::activations, prefix_ + "att (recomputed)");
      be.attention_forward(s("atty"), att_again.view(DType::f32, {B, H, T, T}), s("qkv"), H, H);  // atty: same values
    }
    Tensor att = att_again ? att_again.view(DType::f32, {B, H, T, T}) : s("att");
    be.attention_backward(dqkv, dsmall, s("qkv"), att, H, H, scratch.flat(DType::f32));
    Tensor dln1 = dsmall;  // d(atty) is consumed: reuse its buffer
    matmul_backward(be, dln1, w(g, "attn.c_attn.weight"), w(g, "attn.c_attn.bias"), dqkv, s("ln1"),
                    wg(p, "attn.c_attn.weight"), N, C, 3 * C);
    be.layernorm_backward(din, w(g, "ln_1.weight"), w(g, "ln_1.bias"), dln1, in, w(p, "ln_1.weight"),
                          s("ln1_mean"), s("ln1_rstd"));
  }

  // forward() with the new positions' keys and values appended to the cache (spec.seq rows each)
  // and attention over it; the activations are this call's only.
  bool decodes() const override { return true; }
  void forward_cached(UnitContext& c, const ParamSet& p, Tensor in, Tensor out, Saved& cache, int64_t pos0) override {
    const int64_t B = c.batch.B, T = c.batch.T, C = c.spec.dim, H = c.spec.heads, N = B * T;
    const int64_t F = c.spec.ffn_hidden();
    Backend& be = c.be;
    const std::string k_name = prefix_ + "k cache", v_name = prefix_ + "v cache";
    if (pos0 == 0) {
      cache.clear();
      cache.add(c.pool, k_name, {B, c.spec.seq, C});
      cache.add(c.pool, v_name, {B, c.spec.seq, C});
    }
    Saved s;
    Tensor ln1 = s.add(c.pool, "ln1", {N, C}), ln1_mean = s.add(c.pool, "ln1_mean", {N}),
           ln1_rstd = s.add(c.pool, "ln1_rstd", {N});
    be.layernorm_forward(ln1, ln1_mean, ln1_rstd, in, w(p, "ln_1.weight"), w(p, "ln_1.bias"), eps(c.spec));
    Tensor qkv = s.add(c.pool, "qkv", {B, T, 3 * C});
    matmul_forward(be, qkv, ln1, wg(p, "attn.c_attn.weight"), w(p, "attn.c_attn.bias"), N, C, 3 * C);
    be.kv_cache_write(cache(k_name), cache(v_name), qkv, H, H, pos0);
    Tensor atty = s.add(c.pool, "atty", {N, C});
    be.attention_cached(atty, qkv, cache(k_name), cache(v_name), H, H, pos0);
    Tensor x2 = s.add(c.pool, "x2", {N, C});
    matmul_forward(be, x2, atty, wg(p, "attn.c_proj.weight"), w(p, "attn.c_proj.bias"), N, C, C);
    be.add(x2, in, x2);  // residual
    Tensor ln2 = s.add(c.pool, "ln2", {N, C}), ln2_mean = s.add(c.pool, "ln2_mean", {N}),
           ln2_rstd = s.add(c.pool, "ln2_rstd", {N});
    be.layernorm_forward(ln2, ln2_mean, ln2_rstd, x2, w(p, "ln_2.weight"), w(p, "ln_2.bias"), eps(c.spec));
    Tensor fch = s.add(c.pool, "fch", {N, F}), fch_gelu = s.add(c.pool, "fch_gelu", {N, F});
    matmul_forward(be, fch, ln2, wg(p, "mlp.c_fc.weight"), w(p, "mlp.c_fc.bias"), N, C, F);
    be.gelu_forward(fch_gelu, fch);
    matmul_forward(be, out, fch_gelu, wg(p, "mlp.c_proj.weight"), w(p, "mlp.c_proj.bias"), N, F, C);
    be.add(out, x2, out);  // residual
  }

 private:
  Tensor w(const ParamSet& p, const char* suffix) const { return p(prefix_ + suffix); }
  Tensor wg(const ParamSet& p, const char* suffix) const { return p.gemm(prefix_ + suffix); }
  std::string prefix_;
};

class HeadUnit final : public Unit {
 public:
  using Unit::Unit;
  std::vector<std::string> borrowed() const override { return {"wte.weight"}; }
  int64_t out_elems(const ModelSpec& s, int64_t B, int64_t T) const override { return B * T * s.vocab; }

  void forward(UnitContext& c, const ParamSet& p, Tensor in, Tensor out, Saved& s) override {
    const int64_t N = c.batch.B * c.batch.T, C = c.spec.dim, V = c.spec.vocab;
    Tensor lnf = s.add(c.pool, "lnf", {N, C}), mean = s.add(c.pool, "lnf_mean", {N}),
           rstd = s.add(c.pool, "lnf_rstd", {N});
    c.be.layernorm_forward(lnf, mean, rstd, in, p("ln_f.weight"), p("ln_f.bias"), eps(c.spec));
    const Tensor wte = p.gemm("wte.weight");
    GemmDesc d = gemm_with(wte);  // logits (N, V) = lnf (N, C) @ wte^T
    d.trans_b = Trans::T;
    d.m = N, d.n = V, d.k = C;
    d.lda = C, d.ldb = C, d.ldc = V;
    c.be.gemm(d, lnf.data(), wte.data(), out.data());
  }

  void backward(UnitContext& c, const ParamSet& p, const ParamSet& g, Saved& s, Tensor in, Tensor dout,
                Tensor din) override {
    const int64_t N = c.batch.B * c.batch.T, C = c.spec.dim, V = c.spec.vocab;
    Block dlnf_block = c.pool.alloc(DType::f32, N * C, Category::workspace, "head backward dlnf");
    const Tensor wte = p.gemm("wte.weight");
    GemmDesc dx = gemm_with(wte);  // dlnf (N, C) = dlogits (N, V) @ wte (V, C)
    dx.m = N, dx.n = C, dx.k = V;
    dx.lda = V, dx.ldb = C, dx.ldc = C;
    c.be.gemm(dx, dout.data(), wte.data(), dlnf_block.data());
    GemmDesc dw;  // dwte (V, C) += dlogits^T (V, N) @ lnf (N, C)
    dw.round_inputs_to = wte.dtype();
    dw.trans_a = Trans::T;
    dw.m = V, dw.n = C, dw.k = N;
    dw.lda = V, dw.ldb = C, dw.ldc = C;
    dw.beta = 1.f;
    c.be.gemm(dw, dout.data(), s("lnf").data(), g("wte.weight").data());
    c.be.fill(din, 0.f);
    c.be.layernorm_backward(din, g("ln_f.weight"), g("ln_f.bias"), dlnf_block.view(DType::f32, {N, C}), in,
                            p("ln_f.weight"), s("lnf_mean"), s("lnf_rstd"));
  }
  bool decodes() const override { return true; }
  void forward_cached(UnitContext& c, const ParamSet& p, Tensor in, Tensor out, Saved&, int64_t) override {
    Saved s;  // each position's logits depend on that position alone
    forward(c, p, in, out, s);
  }
};

}  // namespace

std::vector<std::unique_ptr<Unit>> make_gpt2_units(const ModelSpec& spec, const TpConfig& tp) {
  if (tp.degree > 1) throw InputError("tensor-parallel gpt2 units are not written yet");
  std::vector<UnitLayout> layout = gpt2_layout(spec, tp);
  std::vector<std::unique_ptr<Unit>> units;
  units.push_back(std::make_unique<EmbeddingUnit>(std::move(layout[0])));
  for (int64_t l = 0; l < spec.layers; ++l)
    units.push_back(std::make_unique<BlockUnit>(std::move(layout[static_cast<size_t>(l + 1)]), l));
  units.push_back(std::make_unique<HeadUnit>(std::move(layout.back())));
  return units;
}

}  // namespace shardlab
