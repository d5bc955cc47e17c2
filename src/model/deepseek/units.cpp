// units.cpp — DeepSeek-V3's decoder layer with explicit forward and backward (deepseek.hpp); the
// embedding and the head are Llama's.
//
// Latent attention, as transformers' DeepseekV3Attention computes it: q (N, H qk) from ln1 through
// q_a_proj, its RMSNorm and q_b_proj (or q_proj); kva (N, kv_rank + rope) = ln1 kv_a_proj_with_mqa^T,
// whose latent columns are normalised (kv_a_layernorm) into kv (N, H (nope + v)) by kv_b_proj. The
// packed [q | k | v] rows (ops::mla_qkv_forward, RoPE on the rope channels of every query and of
// the shared key) go to the attention core with values of their own head dimension, saved rotated
// as every family's; the core's output (N, H v) through o_proj. q, kv and kva are the packing's
// inputs only: workspace, not saved. Both RMSNorms of the low-rank paths use eps 1e-6, as
// transformers builds them whatever rms_norm_eps says.
//
// The MLP: a dense SwiGLU in the first layers, else the experts (blocks/moe.hpp) plus the shared
// experts' SwiGLU on the same rows, added.
//
// YaRN (MlaSpec::yarn): its frequencies in freqs_ (deepseek_rope_freqs), its softmax scale on the
// queries (q_scale_).
//
// Tensor parallelism (tp.hpp) as Llama's: the rank's heads and MLP columns; the low-rank
// projections run whole on each rank, their weights' gradients are partial sums over the heads
// (TpPartialGrads by heads, computed at once rather than held for a zero-bubble W pass).
#include <algorithm>
#include <optional>

#include "src/backend/ops/activation.hpp"
#include "src/backend/ops/kv_cache.hpp"
#include "src/backend/ops/mla.hpp"
#include "src/backend/ops/norm.hpp"
#include "src/model/blocks/attention.hpp"
#include "src/model/blocks/linear.hpp"
#include "src/model/blocks/moe.hpp"
#include "src/model/blocks/weight_grad.hpp"
#include "src/model/deepseek/deepseek.hpp"
#include "src/model/llama/llama.hpp"
#include "src/model/parallel/cp.hpp"
#include "src/model/tp.hpp"

namespace shardlab {
namespace {

using blocks::linear_backward;
using blocks::linear_forward;
using blocks::stacked;

constexpr float kLowRankEps = 1e-6f;  // transformers' q_a_layernorm and kv_a_layernorm

class DeepseekLayerUnit final : public Unit {
 public:
  DeepseekLayerUnit(UnitLayout layout, int64_t index, const ModelSpec& spec, const TpConfig& tp)
      : Unit(std::move(layout)),
        prefix_("model.layers." + std::to_string(index) + "."),
        index_(index),
        sparse_(spec.moe.sparse(index)),
        freqs_(deepseek_rope_freqs(spec)),
        q_scale_(static_cast<float>(spec.mla.yarn.softmax_scale())),
        tp_(tp) {}
  bool recomputable() const override { return true; }
  int64_t out_elems(const ModelSpec& s, int64_t B, int64_t T) const override {
    return tp_local_rows(TpContext{tp_, nullptr}, B * T) * s.dim;
  }
  // forward's ln1, qkv, the low-rank paths' activations, atty, x2, ln2 and the MLP's: the dense
  // SwiGLU's gate_up and swiglu, or the router's scores, the routing, the slots' weights and outputs,
  // the experts' gate_up and swiglu rows (without expert parallelism: with it they are the rows a
  // rank receives) and the shared experts' SwiGLU; the scores without the fused kernel (unless
  // checkpointed); not the norms' statistics.
  int64_t saved_elems_at_least(const ModelSpec& s, int64_t B, int64_t T, Checkpointing ck, bool cp) const override {
    if (ck == Checkpointing::blocks) return 0;
    const MlaSpec& a = s.mla;
    const int64_t N = B * T, rows_c = out_elems(s, B, T), H = s.heads / tp_.degree;  // rows_c: Nl x C
    int64_t n = 3 * rows_c + N * H * (2 * a.qk() + a.v) + 2 * N * (a.kv_rank + a.q_rank) + N * H * a.v;
    if (!sparse_) {
      n += N * 3 * (s.ffn_hidden() / tp_.degree);
    } else {
      const int64_t P = N * s.moe.top_k, E = s.moe.experts;
      n += N * E + (3 * P + E) + P + P * s.dim + N * 3 * (s.moe.shared_ffn / tp_.degree);
      if (layout().ep.degree == 1) n += P * 3 * (s.moe.ffn_dim / tp_.degree);
    }
    if (s.attention == AttentionKernel::naive && !cp && ck == Checkpointing::none) n += B * H * T * T;
    return n;
  }

  void forward(UnitContext& c, const ParamSet& p, Tensor in, Tensor out, Saved& s) override {
    const Dims d(c, tp_);
    Backend& be = c.be;
    Tensor ln1 = s.add(c.pool, "ln1", {d.Nl, d.C}), ln1_rstd = s.add_f32(c.pool, "ln1_rstd", {d.Nl});
    ops::rmsnorm_forward(be, ln1, ln1_rstd, in, w(p, "input_layernorm.weight"), eps(c));
    Block whole = tp_whole_rows(c, prefix_ + "region rows");
    const Tensor x = tp_region_input(c, ln1, tp_whole_or(whole, c, ln1));  // all N rows
    Tensor qkv = s.add(c.pool, "qkv", {d.B, d.T, d.heads().width()});
    {
      Block q = c.pool.alloc(DType::f32, d.N * d.H * d.qk, Category::workspace, prefix_ + "mla q");
      Block kv = c.pool.alloc(DType::f32, d.N * d.H * d.kvw, Category::workspace, prefix_ + "mla kv");
      Block kva = c.pool.alloc(DType::f32, d.N * d.kva, Category::workspace, prefix_ + "mla kva");
      queries(c, p, s, x, q.view(DType::f32, {d.N, d.H * d.qk}), d);
      if (q_scale_ != 1.f) be.scale(q.flat(DType::f32), q_scale_);  // YaRN's softmax scale (q_scale_)
      linear_forward(be, kva.view(DType::f32, {d.N, d.kva}), x, wg(p, "self_attn.kv_a_proj_with_mqa.weight"), d.N);
      Tensor lat = s.add(c.pool, "mla_latent", {d.N, d.r}), lat_n = s.add(c.pool, "mla_latent_norm", {d.N, d.r});
      ops::copy_rows(be, lat, d.r, kva.flat(DType::f32), d.kva, d.N, d.r);
      ops::rmsnorm_forward(be, lat_n, s.add_f32(c.pool, "mla_latent_rstd", {d.N}), lat,
                           w(p, "self_attn.kv_a_layernorm.weight"), kLowRankEps);
      linear_forward(be, kv.view(DType::f32, {d.N, d.H * d.kvw}), lat_n, wg(p, "self_attn.kv_b_proj.weight"), d.N);
      pack(c, qkv, q.flat(DType::f32), kv.flat(DType::f32), kva.flat(DType::f32), d);
    }
    Tensor atty = blocks::attention_forward(c, s, qkv, d.attention());
    Tensor x2 = s.add(c.pool, "x2", {d.Nl, d.C});
    Tensor attn_out = tp_whole_or(whole, c, x2);
    linear_forward(be, attn_out, atty, wg(p, "self_attn.o_proj.weight"), d.N);
    tp_region_output(c, attn_out, x2);
    be.add(x2, in, x2);  // residual
    Tensor ln2 = s.add(c.pool, "ln2", {d.Nl, d.C}), ln2_rstd = s.add_f32(c.pool, "ln2_rstd", {d.Nl});
    ops::rmsnorm_forward(be, ln2, ln2_rstd, x2, w(p, "post_attention_layernorm.weight"), eps(c));
    mlp_forward(c, p, s, tp_region_input(c, ln2, tp_whole_or(whole, c, ln2)), tp_whole_or(whole, c, out), d);
    tp_region_output(c, tp_whole_or(whole, c, out), out);
    be.add(out, x2, out);  // residual
  }

  void backward(UnitContext& c, const ParamSet& p, const ParamSet& g, Saved& s, Tensor in, Tensor dout,
                Tensor din) override {
    const Dims d(c, tp_);
    Backend& be = c.be;
    Block scratch = blocks::attention_scratch(c, d.attention(), prefix_);
    Block whole = tp_whole_rows(c, prefix_ + "backward region rows");
    Block local = c.tp.sequence_parallel()
                      ? c.pool.alloc(DType::f32, d.Nl * d.C, Category::workspace, prefix_ + "backward dln rows")
                      : Block();
    Block small =
        c.pool.alloc(DType::f32, d.N * std::max(d.C, d.H * d.v), Category::workspace, prefix_ + "backward dln");
    Tensor dsmall = small.view(DType::f32, {d.N, d.C});
    Tensor dln = local ? local.view(DType::f32, {d.Nl, d.C}) : dsmall;
    TpPartialGrads norm_grads(c, g, {prefix_ + "input_layernorm.weight", prefix_ + "post_attention_layernorm.weight"},
                              prefix_ + "norms");
    // MLP: out = x2 + mlp(ln2), ln2 = rmsnorm(x2)
    const Tensor dmlp_out = tp_region_output_backward(c, dout, tp_whole_or(whole, c, dout));  // all N rows
    mlp_backward(c, p, g, s, dsmall, dmlp_out, d);
    tp_region_input_backward(c, dsmall, dln);
    be.copy(din, dout);  // din accumulates the residual stream: now d(x2)
    ops::rmsnorm_backward(be, din, norm_grads(prefix_ + "post_attention_layernorm.weight"), dln, s("x2"),
                          w(p, "post_attention_layernorm.weight"), s("ln2_rstd"));
    // Attention: x2 = in + o_proj(attn(pack(q, kv, kva))), all from ln1 = rmsnorm(in)
    Tensor datty = small.view(DType::f32, {d.N, d.H * d.v});
    const Tensor dattn_out = tp_region_output_backward(c, din, tp_whole_or(whole, c, din));
    linear_backward(c, datty, w(g, "self_attn.o_proj.weight"), dattn_out, s("atty"), wg(p, "self_attn.o_proj.weight"),
                    d.N);
    Block dqkv = c.pool.alloc(DType::f32, d.N * d.heads().width(), Category::workspace, prefix_ + "backward dqkv");
    blocks::attention_backward(c, s, dqkv.view(DType::f32, {d.B, d.T, d.heads().width()}), datty,
                               scratch.flat(DType::f32), d.attention(), prefix_);
    scratch.reset();
    Block dq = c.pool.alloc(DType::f32, d.N * d.H * d.qk, Category::workspace, prefix_ + "backward mla dq");
    Block dkv = c.pool.alloc(DType::f32, d.N * d.H * d.kvw, Category::workspace, prefix_ + "backward mla dkv");
    Block dkva = c.pool.alloc(DType::f32, d.N * d.kva, Category::workspace, prefix_ + "backward mla dkva");
    unpack(c, dq.flat(DType::f32), dkv.flat(DType::f32), dkva.flat(DType::f32), dqkv.flat(DType::f32), d);
    dqkv.reset();
    if (q_scale_ != 1.f) c.be.scale(dq.flat(DType::f32), q_scale_);
    low_rank_backward(c, p, g, s, dsmall, dq.view(DType::f32, {d.N, d.H * d.qk}),
                      dkv.view(DType::f32, {d.N, d.H * d.kvw}), dkva.view(DType::f32, {d.N, d.kva}),
                      tp_region_input(c, s("ln1"), tp_whole_or(whole, c, s("ln1"))), d);
    tp_region_input_backward(c, dsmall, dln);
    ops::rmsnorm_backward(be, din, norm_grads(prefix_ + "input_layernorm.weight"), dln, in,
                          w(p, "input_layernorm.weight"), s("ln1_rstd"));
    norm_grads.reduce();
  }

 private:
  // The rank's sizes: H its heads, F and Fs its slices of the dense and shared MLPs, Nl its token
  // rows between the regions; kvw a head's [k_nope | v] columns of kv, kva kva's row.
  struct Dims {
    int64_t B, T, N, Nl, C, H, nope, rope, qk, v, r, rq, kvw, kva, F, Fs;
    bool interleave;
    Dims(const UnitContext& c, const TpConfig& tp)
        : B(c.batch.B),
          T(c.batch.T),
          N(B * T),
          Nl(tp_unit_rows(c, tp)),
          C(c.spec.dim),
          H(c.spec.heads / tp.degree),
          nope(c.spec.mla.nope),
          rope(c.spec.mla.rope),
          qk(nope + rope),
          v(c.spec.mla.v),
          r(c.spec.mla.kv_rank),
          rq(c.spec.mla.q_rank),
          kvw(nope + v),
          kva(r + rope),
          F(c.spec.ffn_hidden() / tp.degree),
          Fs(c.spec.moe.shared_ffn / tp.degree),
          interleave(c.spec.mla.interleave) {}
    MlaHeads heads() const { return {H, nope, rope, v, r, interleave}; }
    blocks::AttentionShape attention() const { return {B, T, H, H, qk, v}; }
  };
  static float eps(const UnitContext& c) { return static_cast<float>(c.spec.norm_eps); }

  // q (N, H qk) from the layer's normalised input x (N, C): the low-rank path (its activations
  // saved for backward) or one product.
  void queries(UnitContext& c, const ParamSet& p, Saved& s, Tensor x, Tensor q, const Dims& d) const {
    if (d.rq == 0) return linear_forward(c.be, q, x, wg(p, "self_attn.q_proj.weight"), d.N);
    Tensor qa = s.add(c.pool, "mla_qa", {d.N, d.rq}), qa_n = s.add(c.pool, "mla_qa_norm", {d.N, d.rq});
    linear_forward(c.be, qa, x, wg(p, "self_attn.q_a_proj.weight"), d.N);
    ops::rmsnorm_forward(c.be, qa_n, s.add_f32(c.pool, "mla_qa_rstd", {d.N}), qa,
                         w(p, "self_attn.q_a_layernorm.weight"), kLowRankEps);
    linear_forward(c.be, q, qa_n, wg(p, "self_attn.q_b_proj.weight"), d.N);
  }

  // The packing at the rows' positions: 0 on, or under --cp each piece's own.
  template <class F>
  void for_each_piece(const UnitContext& c, const Dims& d, F f) const {
    if (!c.batch.context_parallel()) return f(int64_t{0}, d.B, d.T, int64_t{0});
    for (const CpPiece& piece : c.batch.cp->batch_pieces(d.B)) f(piece.row0, int64_t{1}, piece.len, piece.pos0);
  }
  void pack(UnitContext& c, Tensor qkv, Tensor q, Tensor kv, Tensor kva, const Dims& d) const {
    const MlaHeads m = d.heads();
    for_each_piece(c, d, [&](int64_t row0, int64_t B, int64_t T, int64_t pos0) {
      const int64_t n = B * T, shape[] = {B, T, m.width()};
      ops::mla_qkv_forward(c.be, qkv.slice(row0 * m.width(), n * m.width()).reshape(shape),
                           q.slice(row0 * d.H * d.qk, n * d.H * d.qk), kv.slice(row0 * d.H * d.kvw, n * d.H * d.kvw),
                           kva.slice(row0 * d.kva, n * d.kva), m, freqs_, pos0);
    });
  }
  void unpack(UnitContext& c, Tensor dq, Tensor dkv, Tensor dkva, Tensor dqkv, const Dims& d) const {
    const MlaHeads m = d.heads();
    for_each_piece(c, d, [&](int64_t row0, int64_t B, int64_t T, int64_t pos0) {
      const int64_t n = B * T, shape[] = {B, T, m.width()};
      ops::mla_qkv_backward(c.be, dq.slice(row0 * d.H * d.qk, n * d.H * d.qk),
                            dkv.slice(row0 * d.H * d.kvw, n * d.H * d.kvw), dkva.slice(row0 * d.kva, n * d.kva),
                            dqkv.slice(row0 * m.width(), n * m.width()).reshape(shape), m, freqs_, pos0);
    });
  }

  // From the packing's gradients back to the layer's normalised input: dx (N, C) overwritten with
  // this rank's partial sum (its heads'), the projections' gradients accumulated.
  void low_rank_backward(UnitContext& c, const ParamSet& p, const ParamSet& g, Saved& s, Tensor dx, Tensor dq,
                         Tensor dkv, Tensor dkva, Tensor x, const Dims& d) const {
    const std::string kv_a = prefix_ + "self_attn.kv_a_proj_with_mqa.weight",
                      kv_norm = prefix_ + "self_attn.kv_a_layernorm.weight";
    const std::string q_a = prefix_ + "self_attn.q_a_proj.weight", q_norm = prefix_ + "self_attn.q_a_layernorm.weight";
    std::vector<std::string> replicated{kv_a, kv_norm};
    if (d.rq > 0) replicated.insert(replicated.end(), {q_a, q_norm});
    TpPartialGrads grads(c, g, replicated, prefix_ + "latent projections", true);
    std::optional<WeightGradsNow> now;  // partial sums are reduced below: no W pass may hold them
    if (c.tp.active()) now.emplace(c);
    // Keys and values: kv = kv_b(norm(latent)), latent = kva's first kv_rank columns.
    Block work = c.pool.alloc(DType::f32, 2 * d.N * std::max(d.r, d.rq), Category::workspace,
                              prefix_ + "backward mla latent");
    const Tensor dlat = norm_up_backward(c, p, g, s, grads, work, "kv_b_proj", kv_norm, "mla_latent", dkv, d.r, d);
    ops::copy_rows(c.be, dkva, d.kva, dlat, d.r, d.N, d.r);  // beside the shared key's gradient
    linear_backward(c, dx, grads(kv_a), dkva, x, p.gemm(kv_a), d.N);
    // Queries: their own product, or the low-rank path; added to dx.
    Block dxq = c.pool.alloc(DType::f32, d.N * d.C, Category::workspace, prefix_ + "backward mla dx (queries)");
    Tensor dq_x = dxq.view(DType::f32, {d.N, d.C});
    if (d.rq == 0) {
      linear_backward(c, dq_x, w(g, "self_attn.q_proj.weight"), dq, x, wg(p, "self_attn.q_proj.weight"), d.N);
    } else {
      const Tensor dqa = norm_up_backward(c, p, g, s, grads, work, "q_b_proj", q_norm, "mla_qa", dq, d.rq, d);
      linear_backward(c, dq_x, grads(q_a), dqa, x, p.gemm(q_a), d.N);
    }
    c.be.add(dx, dq_x, dx);
    grads.reduce();
  }

  // A low-rank path's backward from its up-projection's output gradient dout: self_attn.<up>'s
  // backward into d(norm(pre)), then the RMSNorm's (its weight `norm`; pre, its output and rstd saved
  // as <saved>, <saved>_norm, <saved>_rstd) into d(pre) (N, width), returned. Both in `work`'s halves.
  Tensor norm_up_backward(UnitContext& c, const ParamSet& p, const ParamSet& g, Saved& s, const TpPartialGrads& grads,
                          const Block& work, const char* up, const std::string& norm, const std::string& saved,
                          Tensor dout, int64_t width, const Dims& d) const {
    const int64_t half = d.N * std::max(d.r, d.rq);
    const std::vector<int64_t> shape{d.N, width};
    const Tensor dnormed = work.flat(DType::f32).slice(0, d.N * width).reshape(shape);
    const Tensor dpre = work.flat(DType::f32).slice(half, d.N * width).reshape(shape);
    const std::string weight = prefix_ + "self_attn." + up + ".weight";
    linear_backward(c, dnormed, g(weight), dout, s(saved + "_norm"), p.gemm(weight), d.N);
    c.be.fill(dpre, 0.f);
    ops::rmsnorm_backward(c.be, dpre, grads(norm), dnormed, s(saved), p(norm), s(saved + "_rstd"));
    return dpre;
  }

  // The MLP of ln2's rows (N, C) into out (N, C): the dense SwiGLU, or the experts and the shared
  // experts, added.
  void mlp_forward(UnitContext& c, const ParamSet& p, Saved& s, Tensor ln2, Tensor out, const Dims& d) const {
    const int64_t shape[] = {d.N, d.C};
    if (!sparse_) return swiglu_forward(c, p, s, "mlp.", "", ln2, out.reshape(shape), d.F, d);
    // The shared experts first: under sequence parallelism ln2 and out are one buffer (the region's
    // gathered rows), which the experts' combination overwrites.
    Block shared;
    if (d.Fs > 0) {
      shared = c.pool.alloc(DType::f32, d.N * d.C, Category::workspace, prefix_ + "shared experts out");
      swiglu_forward(c, p, s, "mlp.shared_experts.", "shared_", ln2, shared.view(DType::f32, {d.N, d.C}), d.Fs, d);
    }
    blocks::moe_forward(c, s, ln2.reshape(shape), out.reshape(shape), moe_weights(c.spec, p, true));
    if (shared) c.be.add(out, shared.view(DType::f32, {d.N, d.C}), out);
  }
  // down(silu(gate(x)) up(x)) of the MLP `mlp` (width F), its activations saved as <tag>gate_up, <tag>swiglu.
  void swiglu_forward(UnitContext& c, const ParamSet& p, Saved& s, const std::string& mlp, const std::string& tag,
                      Tensor x, Tensor out, int64_t F, const Dims& d) const {
    Tensor gate_up = s.add(c.pool, tag + "gate_up", {d.N, 2 * F}), act = s.add(c.pool, tag + "swiglu", {d.N, F});
    linear_forward(c.be, gate_up, x, gate_up_weight(p, mlp, true), d.N);
    ops::swiglu_forward(c.be, act, gate_up);
    linear_forward(c.be, out, act, p.gemm(prefix_ + mlp + "down_proj.weight"), d.N);
  }
  // dx (N, C) overwritten with the MLP's input gradient (this rank's partial sum), from d(out) (N, C).
  void mlp_backward(UnitContext& c, const ParamSet& p, const ParamSet& g, Saved& s, Tensor dx, Tensor dout,
                    const Dims& d) const {
    // Under sequence parallelism ln2's rows gathered again (forward kept the rank's), into a buffer
    // of their own: d(out) is read beside them.
    Block rows = c.tp.sequence_parallel()
                     ? c.pool.alloc(DType::f32, d.N * d.C, Category::workspace, prefix_ + "backward ln2 rows")
                     : Block();
    const Tensor ln2 = tp_region_input(c, s("ln2"), rows ? rows.view(DType::f32, {d.N, d.C}) : s("ln2"));
    if (!sparse_) return swiglu_backward(c, p, g, s, "mlp.", "", dx, dout, ln2, d.F, d);
    blocks::moe_backward(c, s, dx, dout, ln2, moe_weights(c.spec, p, true), moe_weights(c.spec, g, false));
    if (d.Fs == 0) return;
    Block shared = c.pool.alloc(DType::f32, d.N * d.C, Category::workspace, prefix_ + "backward shared experts dx");
    Tensor dshared = shared.view(DType::f32, {d.N, d.C});
    swiglu_backward(c, p, g, s, "mlp.shared_experts.", "shared_", dshared, dout, ln2, d.Fs, d);
    c.be.add(dx, dshared, dx);
  }
  void swiglu_backward(UnitContext& c, const ParamSet& p, const ParamSet& g, Saved& s, const std::string& mlp,
                       const std::string& tag, Tensor dx, Tensor dout, Tensor x, int64_t F, const Dims& d) const {
    Block dgu = c.pool.alloc(DType::f32, d.N * 2 * F, Category::workspace, prefix_ + "backward " + tag + "dgate_up");
    Block da = c.pool.alloc(DType::f32, d.N * F, Category::workspace, prefix_ + "backward " + tag + "dswiglu");
    Tensor dgate_up = dgu.view(DType::f32, {d.N, 2 * F}), dact = da.view(DType::f32, {d.N, F});
    const std::string down = prefix_ + mlp + "down_proj.weight";
    linear_backward(c, dact, g(down), dout, s(tag + "swiglu"), p.gemm(down), d.N);
    ops::swiglu_backward(c.be, dgate_up, s(tag + "gate_up"), dact);
    linear_backward(c, dx, gate_up_weight(g, mlp, false), dgate_up, x, gate_up_weight(p, mlp, true), d.N);
  }
  blocks::MoeWeights moe_weights(const ModelSpec& spec, const ParamSet& p, bool gemm) const {
    blocks::MoeWeights m;
    const auto get = [&](const std::string& name) { return gemm ? p.gemm(name) : p(name); };
    m.router = get(moe_tensor(spec, prefix_, MoePart::router));
    m.bias = p(prefix_ + std::string(kCorrectionBias));
    m.sparse_layer = index_ - spec.moe.dense_layers;
    const int64_t local = spec.moe.experts / layout().ep.degree, first = layout().ep.rank * local;
    for (int64_t e = first; e < first + local; ++e) {
      m.gate_up.push_back(
          stacked({get(moe_tensor(spec, prefix_, MoePart::gate, e)), get(moe_tensor(spec, prefix_, MoePart::up, e))}));
      m.down.push_back(get(moe_tensor(spec, prefix_, MoePart::down, e)));
    }
    return m;
  }
  Tensor gate_up_weight(const ParamSet& p, const std::string& mlp, bool gemm) const {
    const std::string gate = prefix_ + mlp + "gate_proj.weight", up = prefix_ + mlp + "up_proj.weight";
    return gemm ? stacked({p.gemm(gate), p.gemm(up)}) : stacked({p(gate), p(up)});
  }
  Tensor w(const ParamSet& p, const char* suffix) const { return p(prefix_ + suffix); }
  Tensor wg(const ParamSet& p, const char* suffix) const { return p.gemm(prefix_ + suffix); }

  std::string prefix_;
  int64_t index_;
  bool sparse_;
  RopeFreqs freqs_;
  // YaRN's mscale^2 (1 without it): transformers multiplies the scores by it beside 1/sqrt(qk); here
  // the queries are, before the attention core (the same product, one pass over q instead of a
  // scale in every attention kernel), and their gradient likewise.
  float q_scale_;
  TpConfig tp_;
};

}  // namespace

std::vector<std::unique_ptr<Unit>> make_deepseek_units(const ModelSpec& spec, const TpConfig& tp, const EpConfig& ep) {
  std::vector<UnitLayout> layout = deepseek_layout(spec, tp, ep);
  std::vector<std::unique_ptr<Unit>> units;
  units.push_back(make_llama_embedding(std::move(layout[0]), tp));
  for (int64_t l = 0; l < spec.layers; ++l)
    units.push_back(std::make_unique<DeepseekLayerUnit>(std::move(layout[static_cast<size_t>(l + 1)]), l, spec, tp));
  units.push_back(make_llama_head(std::move(layout.back()), spec.tied_head, tp));
  return units;
}

}  // namespace shardlab
