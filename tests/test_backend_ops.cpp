// Every operation family (src/backend/ops/) on every backend, against the CPU (ggml's
// test-backend-ops): one table of cases, each running a family's operations on deterministic
// inputs; the CPU backend gives the reference. The meta backend computes nothing, so it is held to
// shapes and allocations: every case runs there (its checks pass) and allocates what the CPU's
// run allocates. The [cuda] case compares each output with the CPU's (cuda_tests; skipped, visibly,
// without a device). A new operation adds its case here.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "memory/pool.hpp"
#include "src/backend/ops/activation.hpp"
#include "src/backend/ops/attention.hpp"
#include "src/backend/ops/embedding.hpp"
#include "src/backend/ops/flash_attention.hpp"
#include "src/backend/ops/kv_cache.hpp"
#include "src/backend/ops/loss.hpp"
#include "src/backend/ops/mla.hpp"
#include "optim/muon.hpp"
#include "src/backend/ops/moe.hpp"
#include "src/backend/ops/muon.hpp"
#include "src/backend/ops/norm.hpp"
#include "src/backend/ops/optimizer.hpp"
#include "src/backend/ops/quantize.hpp"
#include "src/backend/ops/rope.hpp"
#include "tests/test_util.hpp"

using namespace shardlab;

namespace {

// One run of a case on one backend: its tensors live in a Pool of that backend, inputs are
// deterministic random values uploaded from the host, and outputs are read back by results().
class Run {
 public:
  explicit Run(Backend& backend) : be(backend), pool_(backend) {}
  Backend& be;

  // Random values in [lo, hi), the same for a given name on every backend.
  Tensor in(const std::string& name, std::initializer_list<int64_t> shape, float lo = -1.f, float hi = 1.f) {
    Tensor t = alloc(name, shape);
    std::vector<float> host = test::random_vector("ops " + name, static_cast<size_t>(t.numel()), lo, hi);
    be.copy(t, Tensor::flat(host.data(), DType::f32, t.numel()));
    return t;
  }
  // An output read back after the run: zeros, or (accumulated gradients, state) random values.
  Tensor out(const std::string& name, std::initializer_list<int64_t> shape, bool random = false, float lo = -1.f,
             float hi = 1.f) {
    Tensor t = random ? in(name, shape, lo, hi) : alloc(name, shape);
    if (!random) be.fill(t, 0.f);
    outs_.emplace_back(name, t);
    return t;
  }
  // Workspace whose contents are the implementation's own (not compared).
  Tensor work(const std::string& name, std::initializer_list<int64_t> shape) { return alloc(name, shape); }
  // x rounded to bf16 on the backend (cast), 1-D: inputs of kernels that read bf16.
  Tensor bf16_of(const std::string& name, const Tensor& x) {
    Tensor t = alloc(name, {x.numel()}, DType::bf16);
    be.cast(t, x);
    return t;
  }
  std::map<std::string, std::vector<float>> results() {
    std::map<std::string, std::vector<float>> r;
    for (const auto& [name, t] : outs_) {
      std::vector<float>& host = r[name];
      host.resize(static_cast<size_t>(t.numel()));
      be.copy(Tensor::flat(host.data(), DType::f32, t.numel()), t);
    }
    be.synchronize();
    return r;
  }
  uint64_t bytes_allocated() const { return bytes_; }
  Pool& pool() { return pool_; }  // for what allocates its own workspace (Muon's iteration)

 private:
  Tensor alloc(const std::string& name, std::initializer_list<int64_t> shape, DType dtype = DType::f32) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    blocks_.push_back(pool_.alloc(dtype, n, Category::workspace, name));
    bytes_ += blocks_.back().bytes();
    return blocks_.back().view(dtype, shape);
  }
  Pool pool_;
  std::vector<Block> blocks_;
  std::vector<std::pair<std::string, Tensor>> outs_;
  uint64_t bytes_ = 0;
};

struct OpCase {
  std::string name;  // family: what it runs
  double tol;        // another backend's max |error| / max(1, max |cpu|), per output
  std::function<void(Run&)> run;
};

const std::vector<int32_t> kTokens = {3, 0, 7, 3, 10, 1, 2, 7, 9, 3};  // B = 2, T = 5, ids < 11

void embedding_case(Run& r) {
  const int64_t B = 2, T = 5, C = 8, V = 11;
  ops::embedding_forward(r.be, r.out("out", {B * T, C}), kTokens.data(), B, T, r.in("wte", {V, C}),
                         r.in("wpe", {T, C}));
  ops::embedding_backward(r.be, r.out("dwte", {V, C}, true), r.out("dwpe", {T, C}, true), r.in("dout", {B * T, C}),
                          kTokens.data(), B, T);
  // A shard of rows [4, 9): tokens outside give zero rows and no gradient.
  ops::embedding_forward_shard(r.be, r.out("out shard", {B * T, C}), kTokens.data(), B, T, r.in("wte shard", {5, C}),
                               Tensor(), 4);
  ops::embedding_backward_shard(r.be, r.out("dwte shard", {5, C}, true), Tensor(), r.in("dout", {B * T, C}),
                                kTokens.data(), B, T, 4);
}

void norm_case(Run& r) {
  const int64_t N = 6, C = 40;
  Tensor x = r.in("x", {N, C}, -2.f, 2.f), w = r.in("w", {C}), b = r.in("b", {C}), dout = r.in("dout", {N, C});
  Tensor mean = r.out("mean", {N}), rstd = r.out("rstd", {N});
  ops::layernorm_forward(r.be, r.out("ln", {N, C}), mean, rstd, x, w, b, 1e-5f);
  ops::layernorm_backward(r.be, r.out("ln dx", {N, C}, true), r.out("ln dw", {C}, true), r.out("ln db", {C}, true),
                          dout, x, w, mean, rstd);
  Tensor rms = r.out("rms rstd", {N});
  ops::rmsnorm_forward(r.be, r.out("rms", {N, C}), rms, x, w, 1e-6f);
  ops::rmsnorm_backward(r.be, r.out("rms dx", {N, C}, true), r.out("rms dw", {C}, true), dout, x, w, rms);
  // Per head (Qwen3's q/k norms): heads 1 and 2 of 8 in rows of 4 heads, in place.
  const int64_t hd = 8, W = 4 * hd;
  Tensor hw = r.in("head w", {hd}), pre = r.out("head pre", {N, 2 * hd}), hr = r.out("head rstd", {N * 2});
  ops::head_rmsnorm_forward(r.be, r.out("head x", {N, W}, true, -2.f, 2.f), pre, hr, hw, hd, 1e-6f);
  ops::head_rmsnorm_backward(r.be, r.out("head dx", {N, W}, true), r.out("head dw", {hd}, true), pre, hw, hr, hd);
}

// The mixture-of-experts row moves: 5 tokens, 2 slots each, 7 kept rows sorted by expert, token
// 1's second slot and both of token 4's dropped.
void moe_case(Run& r) {
  const int64_t N = 5, k = 2, rows = 7, C = 8;
  const std::vector<int32_t> pos = {0, 3, 1, -1, 2, 4, 5, 6, -1, -1}, token_of = {0, 1, 2, 0, 2, 3, 3};
  const auto ints = [&](const char* name, const std::vector<int32_t>& v) {
    Tensor t = r.work(name, {static_cast<int64_t>(v.size())});
    r.be.copy(t, Tensor::flat(const_cast<int32_t*>(v.data()), DType::f32, t.numel()));  // int32 bits
    return static_cast<const int32_t*>(t.data());
  };
  const int32_t* p = ints("pos", pos);
  const int32_t* tok = ints("token_of", token_of);
  Tensor x = r.in("x", {N, C}), y = r.in("y", {rows, C}), w = r.in("w", {N * k}), dout = r.in("dout", {N, C});
  ops::moe_gather(r.be, r.out("gathered", {rows, C}), x, tok);
  ops::moe_combine(r.be, r.out("combined", {N, C}), y, p, w, k, false);
  ops::moe_combine(r.be, r.out("scattered", {N, C}, true), y, p, Tensor(), k, true);
  ops::moe_combine_backward(r.be, r.out("dy", {rows, C}), r.out("dw", {N * k}, true), dout, y, p, w, k);
}

void rope_case(Run& r) {
  const int64_t B = 2, T = 3, heads = 3, hd = 8;
  RopeFreqs f;
  f.half = hd / 2;
  for (int64_t i = 0; i < f.half; ++i)
    f.inv_freq[static_cast<size_t>(i)] = static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / hd));
  Tensor x = r.out("x", {B, T, (heads + 1) * hd}, true);  // the last head is not rotated
  ops::rope(r.be, x, heads, hd, f, 3, false);
  Tensor dx = r.out("dx", {B, T, (heads + 1) * hd}, true);
  ops::rope(r.be, dx, heads, hd, f, 0, true);
}

// The latent attention's packing and its backward (DeepSeek-V3): odd head parts, both RoPE pairings,
// positions from 3; dkva starts random (its latent columns are left as they are).
void mla_case(Run& r) {
  for (bool interleave : {true, false}) {
    const MlaHeads m{3, 5, 6, 7, 4, interleave};
    const int64_t B = 2, T = 5, N = B * T, H = m.heads, qk = m.qk(), kvw = m.nope + m.v, kva = m.kv_rank + m.rope;
    RopeFreqs f;
    f.half = m.rope / 2;
    for (int64_t i = 0; i < f.half; ++i)
      f.inv_freq[static_cast<size_t>(i)] = static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / 6));
    const std::string tag = interleave ? " (interleaved)" : " (rotate_half)";
    ops::mla_qkv_forward(r.be, r.out("mla qkv" + tag, {B, T, m.width()}), r.in("mla q" + tag, {N, H * qk}),
                         r.in("mla kv" + tag, {N, H * kvw}), r.in("mla kva" + tag, {N, kva}), m, f, 3);
    ops::mla_qkv_backward(r.be, r.out("mla dq" + tag, {N, H * qk}), r.out("mla dkv" + tag, {N, H * kvw}),
                          r.out("mla dkva" + tag, {N, kva}, true), r.in("mla dqkv" + tag, {B, T, m.width()}), m, f,
                          3);
  }
}

void activation_case(Run& r) {
  const int64_t N = 5, F = 12;
  Tensor x = r.in("x", {N, F}, -4.f, 4.f), gate_up = r.in("gate_up", {N, 2 * F}, -4.f, 4.f);
  ops::gelu_forward(r.be, r.out("gelu", {N, F}), x);
  ops::gelu_backward(r.be, r.out("gelu dx", {N, F}), x, r.in("dout", {N, F}));
  ops::swiglu_forward(r.be, r.out("swiglu", {N, F}), gate_up);
  ops::swiglu_backward(r.be, r.out("swiglu dgate_up", {N, 2 * F}), gate_up, r.in("dout", {N, F}));
}

// Forward then backward with H query heads sharing KV K/V heads (KV == H: multi-head); values of
// vd channels a head (0: as many as the queries' and keys' 4).
std::function<void(Run&)> attention_case(int64_t H, int64_t KV, int64_t vd = 0) {
  return [H, KV, vd](Run& r) {
    const int64_t B = 2, T = 7, hd = 4, v = vd > 0 ? vd : hd, R = (H + KV) * hd + KV * v;
    Tensor qkv = r.in("qkv", {B, T, R}), att = r.out("att", {B, H, T, T});
    ops::attention_forward(r.be, r.out("out", {B, T, H * v}), att, qkv, H, KV, vd);
    Tensor scratch = r.work("scratch", {attention_scratch_elems(T, H)});
    ops::attention_backward(r.be, r.out("dqkv", {B, T, R}), r.in("dout", {B, T, H * v}), qkv, att, H, KV, scratch,
                            vd);
  };
}

// The same over bf16 operands, as a GPU whose products round runs it (ops/attention.hpp): qkv and
// dout rounded on the backend, the probabilities and (mha) the output and dqkv kept in bf16, each cast
// back to f32 to be compared. The CPU computes in f32 on widened copies; CUDA's products round
// their scores to bf16 before the softmax: roundings apart.
std::function<void(Run&)> attention_bf16_case(int64_t H, int64_t KV) {
  return [H, KV](Run& r) {
    const int64_t B = 2, T = 37, hd = 16, R = (H + 2 * KV) * hd;
    const bool mha = KV == H;  // dqkv in bf16 too (no K/V head sums over a group)
    const DType out_type = mha ? DType::bf16 : DType::f32;
    const Tensor qkv = r.bf16_of("qkv bf16", r.in("qkv", {B, T, R})).reshape(std::vector<int64_t>{B, T, R});
    const Tensor att = r.bf16_of("att bf16", r.in("att init", {B * H * T * T})).reshape(std::vector<int64_t>{B, H, T, T});
    const Tensor out = mha ? r.bf16_of("out bf16", r.in("out init", {B, T, H * hd})).reshape(std::vector<int64_t>{B, T, H * hd})
                           : r.out("out", {B, T, H * hd});
    ops::attention_forward(r.be, out, att, qkv, H, KV);
    r.be.cast(r.out("att", {B * H * T * T}), att);
    if (mha) r.be.cast(r.out("out", {B * T * H * hd}), out);
    const Tensor dout = r.bf16_of("dout bf16", r.in("dout", {B, T, H * hd})).reshape(std::vector<int64_t>{B, T, H * hd});
    const Tensor dqkv = mha ? r.bf16_of("dqkv bf16", r.in("dqkv init", {B * T * R})).reshape(std::vector<int64_t>{B, T, R})
                            : r.out("dqkv", {B, T, R});
    Tensor scratch = r.work("scratch", {attention_scratch_elems(T, H)});
    ops::attention_backward(r.be, dqkv, dout, qkv, att, H, KV, scratch);
    if (mha) r.be.cast(r.out("dqkv", {B * T * R}), dqkv);
    CHECK(out_type == out.dtype());
  };
}

// The fused kernels, forward then backward: T spans more than one tile of each kind and ends in a
// partial one, so tails, the diagonal and (causal) skipped tiles all run.
std::function<void(Run&)> flash_case(int64_t H, int64_t KV, int64_t T, int64_t hd, bool causal, int64_t vd = 0) {
  return [=](Run& r) {
    const int64_t B = 2, v = vd > 0 ? vd : hd, R = (H + KV) * hd + KV * v;
    Tensor qkv = r.in("qkv", {B, T, R}), out = r.out("out", {B, T, H * v}), lse = r.out("lse", {B, H, T});
    Tensor fwd = r.work("forward tiles", {flash_attention_workspace_elems(B, T, H, KV, hd, false, false, vd)});
    ops::flash_attention_forward(r.be, out, lse, qkv, H, KV, causal, fwd, vd);
    Tensor bwd = r.work("backward tiles", {flash_attention_workspace_elems(B, T, H, KV, hd, true, false, vd)});
    ops::flash_attention_backward(r.be, r.out("dqkv", {B, T, R}), r.in("dout", {B, T, H * v}), qkv, out, lse, H, KV,
                                  causal, bwd, vd);
  };
}

// The same over bf16 inputs (qkv and dout rounded on the backend): out, bf16, is cast back to f32
// to be compared; lse and dqkv are f32.
std::function<void(Run&)> flash_bf16_case(int64_t H, int64_t KV, int64_t T, int64_t hd, bool causal) {
  return [=](Run& r) {
    const int64_t B = 2, R = (H + 2 * KV) * hd;
    const std::vector<int64_t> qkv_shape{B, T, R}, out_shape{B, T, H * hd};
    Tensor qkv = r.bf16_of("qkv bf16", r.in("qkv", {B, T, R})).reshape(qkv_shape);
    Tensor out = r.bf16_of("out bf16", r.in("out init", {B, T, H * hd})).reshape(out_shape);
    Tensor lse = r.out("lse", {B, H, T});
    Tensor fwd = r.work("forward tiles", {flash_attention_workspace_elems(B, T, H, KV, hd, false, true)});
    ops::flash_attention_forward(r.be, out, lse, qkv, H, KV, causal, fwd);
    r.be.cast(r.out("out", {B, T, H * hd}), out);
    Tensor dout = r.bf16_of("dout bf16", r.in("dout", {B, T, H * hd})).reshape(out_shape);
    Tensor bwd = r.work("backward tiles", {flash_attention_workspace_elems(B, T, H, KV, hd, true, true)});
    ops::flash_attention_backward(r.be, r.out("dqkv", {B, T, R}), dout, qkv, out, lse, H, KV, causal, bwd);
  };
}

// Context parallelism's pieces (src/model/parallel/cp_attention.cpp): a qkv's K/V columns copied
// into their own rows (copy_rows), the fused kernel on a piece of queries (positions 64-95) over
// two parts of the keys, positions 0-63 (all seen: offset 64) and 64-95 (the diagonal), merged
// through the log-sum-exp; then backward over the first part adding into gradients that already
// hold values (accumulate).
void flash_pieces_case(Run& r) {
  const int64_t B = 2, T = 96, H = 4, KV = 2, hd = 8, R = (H + 2 * KV) * hd, W = 2 * KV * hd, len = 32, pos0 = 64;
  Tensor qkv = r.in("qkv", {B, T, R}), kv = r.out("kv rows", {B, T, W});
  auto from = [](const Tensor& t, int64_t offset) { return t.slice(offset, t.numel() - offset); };
  ops::copy_rows(r.be, kv, W, from(qkv, H * hd), R, B * T, W);
  auto part = [&](int64_t k0, int64_t Tk) {
    FlashShape s;
    s.B = B, s.Tq = len, s.Tk = Tk, s.H = H, s.KV = KV, s.hd = hd;
    s.q_ld = R, s.q_b = T * R, s.k_ld = s.v_ld = W, s.k_b = s.v_b = T * W, s.o_ld = H * hd, s.o_b = len * H * hd;
    s.offset = pos0 - k0, s.scale = 1.f / std::sqrt(static_cast<float>(hd));
    return s;
  };
  const FlashShape early = part(0, pos0), diagonal = part(pos0, len);
  Tensor out = r.out("merged out", {B, len, H * hd}), lse = r.out("merged lse", {B, H, len});
  Tensor part_out = r.work("part out", {B, len, H * hd}), part_lse = r.work("part lse", {B, H, len});
  const Tensor q = from(qkv, pos0 * R);
  ops::flash_attention_forward(r.be, early, {q, kv, from(kv, KV * hd), out, lse},
                               r.work("tiles early", {flash_forward_workspace_elems(early)}));
  ops::flash_attention_forward(r.be, diagonal, {q, from(kv, pos0 * W), from(kv, pos0 * W + KV * hd), part_out, part_lse},
                               r.work("tiles diagonal", {flash_forward_workspace_elems(diagonal)}));
  ops::flash_attention_merge(r.be, diagonal, out, lse, part_out, part_lse);
  FlashShape back = early;
  back.accumulate = true;
  Tensor dqkv = r.out("dqkv (accumulated)", {B, T, R}, true), dkv = r.out("dkv (accumulated)", {B, T, W}, true);
  ops::flash_attention_backward(r.be, back, {q, kv, from(kv, KV * hd), out, lse},
                                {from(dqkv, pos0 * R), dkv, from(dkv, KV * hd), r.in("dout", {B, len, H * hd})},
                                r.work("tiles backward", {flash_backward_workspace_elems(back)}));
}

// Three positions written at once, then one more: attention over the cache as it grows.
void kv_cache_case(Run& r) {
  const int64_t B = 2, S = 6, H = 4, KV = 2, hd = 4, R = (H + 2 * KV) * hd;
  Tensor k = r.out("k cache", {B, S, KV * hd}), v = r.out("v cache", {B, S, KV * hd});
  Tensor first = r.in("qkv 0", {B, 3, R}), next = r.in("qkv 3", {B, 1, R});
  ops::kv_cache_write(r.be, k, v, first, H, KV, 0);
  ops::attention_cached(r.be, r.out("out 0", {B, 3, H * hd}), first, k, v, H, KV, 0);
  ops::kv_cache_write(r.be, k, v, next, H, KV, 3);
  ops::attention_cached(r.be, r.out("out 3", {B, 1, H * hd}), next, k, v, H, KV, 3);
  // The fused kernel over the same cache: the fourth position.
  Tensor tiles = r.work("flash tiles", {flash_cached_workspace_elems(B, 1, S, H, KV, hd, 3)});
  ops::flash_attention_cached(r.be, r.out("flash out 3", {B, 1, H * hd}), next, k, v, H, KV, 3, tiles);
}

// The whole loss, then the vocabulary-parallel steps on one shard holding every column (the last
// of them padding), with no group to reduce over.
void loss_case(Run& r) {
  const int64_t N = 4, V = 9;
  const std::vector<int32_t> targets = {0, 7, 3, 7};
  Tensor logits = r.in("logits", {N, V}, -3.f, 3.f);
  ops::cross_entropy(r.be, r.out("losses", {N}), r.out("dlogits", {N, V}), logits, targets.data(), 0.25f);
  Tensor mx = r.out("mx", {N}), sumexp = r.out("sumexp", {N}), tlogit = r.out("tlogit", {N});
  ops::vocab_ce_max(r.be, mx, logits, V - 1);
  ops::vocab_ce_sums(r.be, sumexp, tlogit, logits, targets.data(), 0, V - 1, mx);
  ops::vocab_ce_finish(r.be, r.out("vocab losses", {N}), r.out("vocab dlogits", {N, V}), logits, targets.data(), 0,
                       V - 1, mx, sumexp, tlogit, 0.25f);
}

// The cross-entropy writing its gradient in bf16, a buffer of its own (what a GPU's head reads),
// cast back to f32 to be compared; the logits stay as they were.
void loss_bf16_case(Run& r) {
  const int64_t N = 5, V = 300;
  const std::vector<int32_t> targets = {0, 299, 3, 7, 150};
  Tensor logits = r.out("logits kept", {N, V}, true, -3.f, 3.f);
  Tensor d = r.bf16_of("dlogits bf16", r.in("dlogits init", {N * V}));
  ops::cross_entropy(r.be, r.out("losses", {N}), d, logits, targets.data(), 0.25f);
  r.be.cast(r.out("dlogits", {N * V}), d);
}

void optimizer_case(Run& r) {
  const int64_t n = 37;  // not a multiple of 4: the CUDA kernels' scalar path
  AdamWArgs a;
  a.step = 3, a.weight_decay = 0.1f, a.grad_scale = 0.5f;
  ops::adamw_update(r.be, r.out("adamw p", {n}, true), r.in("g", {n}), r.out("adamw m", {n}, true),
                    r.out("adamw v", {n}, true, 0.f, 1.f), a);  // a second moment: not negative
  SgdArgs s;
  s.weight_decay = 0.01f;
  ops::sgd_update(r.be, r.out("sgd p", {n}, true), r.in("g", {n}), r.out("sgd b", {n}, true), s);
}

// Muon: the momentum pass (Nesterov and not), the update, the normalisation in f32, and the whole
// Newton-Schulz iteration (GEMMs through the backend) on a wide and a tall matrix in `ns` arithmetic.
void muon_case(Run& r, DType ns) {
  const int64_t n = 37;
  if (ns == DType::f32) {
    MuonMomentumArgs a;
    a.grad_scale = 0.5f;
    ops::muon_momentum(r.be, r.in("g", {n}), r.out("muon buf", {n}, true), r.out("muon update", {n}), a);
    a.nesterov = false, a.momentum = 0.3f;
    ops::muon_momentum(r.be, r.in("g", {n}), r.out("muon buf 2", {n}, true), r.out("muon update 2", {n}), a);
    ops::muon_apply(r.be, r.out("muon p", {n}, true), r.in("u", {n}), 0.999f, 0.02f);
    Tensor x = r.out("muon normalized", {n}, true);
    ops::muon_normalize(r.be, x, 1e-7f, false);
  }
  MuonConfig cfg;
  cfg.ns_dtype = ns;
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{12, 20}, {20, 12}}) {
    const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
    Tensor out = r.out("muon orthogonalized " + shape, {rows * cols});
    newton_schulz(r.pool(), r.in("muon g " + shape, {rows * cols}), out, rows, cols, cfg);
  }
}

// ZeRO++'s block quantization: int8 rows read at a stride, with a short last block, dequantized;
// int4 dequantized into an accumulating f32 buffer. The codes themselves are compared through what
// they dequantize to (the words are bit patterns, not numbers).
void quantize_case(Run& r) {
  const int64_t rows = 3, n = 300, stride = 310;
  const QuantSpec q8{8, 64}, q4{4, 32};
  Tensor x = r.in("x", {rows * stride}, -2.f, 2.f);
  Tensor w8 = r.work("q8", {rows * q8.words(n)}), w4 = r.work("q4", {rows * q4.words(n)});
  ops::quantize_blocks(r.be, w8, x, stride, rows, n, q8);
  ops::dequantize_blocks(r.be, r.out("int8", {rows * n}), w8, rows, n, q8, false);
  ops::quantize_blocks(r.be, w4, x, stride, rows, n, q4);
  ops::dequantize_blocks(r.be, r.out("int4 accumulated", {rows * stride}, true), w4, rows, n, q4, true, stride);
}

std::vector<OpCase> op_cases() {
  return {
      {"embedding", 1e-6, embedding_case},
      {"norm", 1e-4, norm_case},
      {"rope", 1e-5, rope_case},
      {"mla", 1e-5, mla_case},
      {"activation", 1e-5, activation_case},
      {"attention (multi-head)", 1e-4, attention_case(2, 2)},
      {"attention (grouped-query)", 1e-4, attention_case(4, 2)},
      {"attention (values of their own head dimension)", 1e-4, attention_case(4, 4, 6)},
      {"attention (grouped-query, wider values)", 1e-4, attention_case(4, 2, 10)},
      // bf16 operands, scores and probabilities: roundings apart (2^-8 relative each)
      {"attention (bf16 operands, multi-head)", 2e-2, attention_bf16_case(2, 2)},
      {"attention (bf16 operands, grouped-query)", 2e-2, attention_bf16_case(4, 2)},
      {"flash attention (multi-head, causal)", 1e-4, flash_case(2, 2, 150, 8, true)},
      {"flash attention (grouped-query, causal)", 1e-4, flash_case(4, 2, 137, 16, true)},
      {"flash attention (multi-query, not causal)", 1e-4, flash_case(4, 1, 70, 8, false)},
      {"flash attention (values of their own head dimension, causal)", 1e-4, flash_case(4, 4, 137, 24, true, 16)},
      {"flash attention (grouped-query, wider values, not causal)", 1e-4, flash_case(4, 2, 70, 8, false, 20)},
      // out is bf16: a rounding apart where the f32 sums differ in their last bits (2^-8 relative)
      {"flash attention (bf16 inputs, grouped-query, causal)", 1e-2, flash_bf16_case(4, 2, 137, 64, true)},
      {"flash attention pieces (context parallelism)", 1e-4, flash_pieces_case},
      {"kv_cache", 1e-4, kv_cache_case},
      {"loss", 1e-5, loss_case},
      {"loss (bf16 gradient)", 1e-2, loss_bf16_case},  // a rounding apart where the f32 values straddle one
      {"optimizer", 1e-5, optimizer_case},
      {"muon (f32 iteration)", 1e-4, [](Run& r) { muon_case(r, DType::f32); }},
      // bf16 storage on a GPU against f32 storage rounded to bf16 on the CPU: roundings apart
      {"muon (bf16 iteration)", 2e-2, [](Run& r) { muon_case(r, DType::bf16); }},
      {"quantize", 1e-6, quantize_case},
      {"moe", 1e-5, moe_case},  // d(weight): a warp's butterfly on CUDA, column order on the CPU
  };
}

// Runs a case on be; the outputs (none on the meta backend) and the bytes its pool handed out.
std::map<std::string, std::vector<float>> run_case(const OpCase& c, Backend& be, uint64_t* bytes = nullptr) {
  Run r(be);
  c.run(r);
  if (bytes != nullptr) *bytes = r.bytes_allocated();
  return be.device() == Device::meta ? std::map<std::string, std::vector<float>>{} : r.results();
}

}  // namespace

TEST_CASE("every operation family on the cpu and meta backends", "[ops]") {
  auto cpu = make_cpu_backend(BackendConfig{});
  auto meta = make_meta_backend();
  for (const OpCase& c : op_cases()) {
    INFO("case " << c.name);
    uint64_t cpu_bytes = 0, meta_bytes = 0;
    const auto ref = run_case(c, *cpu, &cpu_bytes);
    REQUIRE_FALSE(ref.empty());
    // The reference is deterministic: a second run gives the same bits.
    CHECK(run_case(c, *cpu) == ref);
    // Meta: every check passes on the same shapes, and the same memory is allocated.
    REQUIRE_NOTHROW(run_case(c, *meta, &meta_bytes));
    CHECK(meta_bytes == cpu_bytes);
  }
}

TEST_CASE("every operation family on the cuda backend matches the cpu", "[cuda][ops]") {
  auto cpu = make_cpu_backend(BackendConfig{});
  auto gpu = make_cuda_backend(BackendConfig{});
  for (const OpCase& c : op_cases()) {
    const auto ref = run_case(c, *cpu), got = run_case(c, *gpu);
    REQUIRE(got.size() == ref.size());
    for (const auto& [name, want] : ref) {
      const std::vector<float>& have = got.at(name);
      REQUIRE(have.size() == want.size());
      double err = 0, scale = 1;
      for (size_t i = 0; i < want.size(); ++i) {
        err = std::max(err, std::fabs(static_cast<double>(have[i]) - want[i]));
        scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
      }
      INFO("case " << c.name << ", output " << name << ": max |error| " << err << " against max |cpu| " << scale);
      CHECK(err <= c.tol * scale);
    }
  }
}

TEST_CASE("the cross-entropy's bf16 gradient is its f32 gradient rounded once", "[ops]") {
  auto cpu = make_cpu_backend(BackendConfig{});
  const int64_t N = 3, V = 257;
  const std::vector<int32_t> targets = {5, 0, 256};
  std::vector<float> logits = test::random_vector("ce bf16 logits", N * V, -4.f, 4.f), losses(N), want(N * V);
  std::vector<bf16> got(N * V);
  const Tensor z = Tensor::of(std::span<float>(logits)).reshape(std::vector<int64_t>{N, V});
  ops::cross_entropy(*cpu, Tensor::of(std::span<float>(losses)), Tensor::of(std::span<float>(want)), z,
                     targets.data(), 0.5f);
  ops::cross_entropy(*cpu, Tensor::of(std::span<float>(losses)), Tensor::of(std::span<bf16>(got)), z, targets.data(),
                     0.5f);
  for (size_t i = 0; i < want.size(); ++i) REQUIRE(float(got[i]) == test::round_to(want[i], DType::bf16));
  // Not over the logits themselves: their rows are read while others are written.
  CHECK_THROWS_WITH(ops::cross_entropy(*cpu, Tensor::of(std::span<float>(losses)),
                                       Tensor(z.data(), DType::bf16, {N * V}), z, targets.data(), 0.5f),
                    Catch::Contains("a buffer of their own"));
}

TEST_CASE("the norms' and SwiGLU's bf16 forms are their f32 forms on the same values, rounded once", "[ops]") {
  auto cpu = make_cpu_backend(BackendConfig{});
  const int64_t N = 5, C = 67;
  std::vector<float> x = test::random_vector("norm bf16 x", N * C, -3.f, 3.f);
  std::vector<float> w = test::random_vector("norm bf16 w", C, 0.5f, 1.5f), b = test::random_vector("norm bf16 b", C);
  std::vector<float> want(N * C), mean(N), rstd(N);
  std::vector<bf16> got(N * C);
  const std::vector<int64_t> shape{N, C};
  const auto f32 = [&](std::vector<float>& v) { return Tensor::of(std::span<float>(v)); };
  const Tensor in = f32(x).reshape(shape), wide = f32(want).reshape(shape);
  const Tensor narrow = Tensor::of(std::span<bf16>(got)).reshape(shape);
  const auto check = [&](const char* what) {
    INFO(what);
    for (size_t i = 0; i < want.size(); ++i) REQUIRE(float(got[i]) == test::round_to(want[i], DType::bf16));
  };
  ops::layernorm_forward(*cpu, wide, f32(mean), f32(rstd), in, f32(w), f32(b), 1e-5f);
  std::vector<bf16> x16(N * C);  // the input rounded as well, in the same call
  const Tensor in16 = Tensor::of(std::span<bf16>(x16)).reshape(shape);
  ops::layernorm_forward(*cpu, narrow, f32(mean), f32(rstd), in, f32(w), f32(b), 1e-5f, in16);
  check("layernorm");
  for (size_t i = 0; i < x.size(); ++i) REQUIRE(float(x16[i]) == test::round_to(x[i], DType::bf16));
  // Its backward from that bf16 input: the f32 backward of the widened input, bit for bit; with
  // dinp_from, the same as copying it into dinp first; its bf16 copy, dinp rounded once.
  std::vector<float> x_wide(x.size()), dout = test::random_vector("norm bf16 dout", N * C);
  for (size_t i = 0; i < x.size(); ++i) x_wide[i] = float(x16[i]);
  std::vector<float> resid = test::random_vector("norm bf16 residual grad", N * C);
  std::vector<float> dw_want(C), db_want(C), dw_got(C), db_got(C), dinp_want = resid, dinp_got(N * C, 7.f);
  ops::layernorm_backward(*cpu, f32(dinp_want).reshape(shape), f32(dw_want), f32(db_want), f32(dout).reshape(shape),
                          f32(x_wide).reshape(shape), f32(w), f32(mean), f32(rstd));
  std::vector<bf16> dinp16(N * C);
  ops::layernorm_backward(*cpu, f32(dinp_got).reshape(shape), f32(dw_got), f32(db_got), f32(dout).reshape(shape),
                          in16, f32(w), f32(mean), f32(rstd), f32(resid).reshape(shape),
                          Tensor::of(std::span<bf16>(dinp16)).reshape(shape));
  CHECK(dinp_got == dinp_want);
  CHECK(dw_got == dw_want);
  CHECK(db_got == db_want);
  for (size_t i = 0; i < dinp16.size(); ++i) REQUIRE(float(dinp16[i]) == test::round_to(dinp_want[i], DType::bf16));
  ops::rmsnorm_forward(*cpu, wide, f32(rstd), in, f32(w), 1e-6f);
  std::vector<bf16> rx16(N * C);
  const Tensor rin16 = Tensor::of(std::span<bf16>(rx16)).reshape(shape);
  ops::rmsnorm_forward(*cpu, narrow, f32(rstd), in, f32(w), 1e-6f, rin16);
  check("rmsnorm");
  CHECK(std::equal(rx16.begin(), rx16.end(), x16.begin(), [](bf16 u, bf16 v) { return u.bits == v.bits; }));
  // RMSNorm's backward forms, as LayerNorm's above.
  std::vector<float> rdw_want(C), rdw_got(C), rdinp_want = resid, rdinp_got(N * C, 7.f);
  ops::rmsnorm_backward(*cpu, f32(rdinp_want).reshape(shape), f32(rdw_want), f32(dout).reshape(shape),
                        f32(x_wide).reshape(shape), f32(w), f32(rstd));
  std::vector<bf16> rdinp16(N * C);
  ops::rmsnorm_backward(*cpu, f32(rdinp_got).reshape(shape), f32(rdw_got), f32(dout).reshape(shape), rin16, f32(w),
                        f32(rstd), f32(resid).reshape(shape), Tensor::of(std::span<bf16>(rdinp16)).reshape(shape));
  CHECK(rdinp_got == rdinp_want);
  CHECK(rdw_got == rdw_want);
  for (size_t i = 0; i < rdinp16.size(); ++i)
    REQUIRE(float(rdinp16[i]) == test::round_to(rdinp_want[i], DType::bf16));
  // SwiGLU: x's first (N - 1) x 66 values as rows of [gate | up], into (N - 1, 33) outputs.
  const int64_t F = 33;
  std::vector<float> sw_want(static_cast<size_t>((N - 1) * F));
  std::vector<bf16> sw_got(sw_want.size());
  const Tensor gate_up = Tensor(x.data(), DType::f32, {N - 1, 2 * F});
  ops::swiglu_forward(*cpu, f32(sw_want).reshape(std::vector<int64_t>{N - 1, F}), gate_up);
  ops::swiglu_forward(*cpu, Tensor::of(std::span<bf16>(sw_got)).reshape(std::vector<int64_t>{N - 1, F}), gate_up);
  for (size_t i = 0; i < sw_want.size(); ++i) REQUIRE(float(sw_got[i]) == test::round_to(sw_want[i], DType::bf16));
  // From a bf16 gate_up (widened as read), and its backward into a bf16 d(gate_up): the f32 forms
  // on the widened values, rounded once.
  std::vector<bf16> gu16(static_cast<size_t>((N - 1) * 2 * F));
  std::vector<float> gu_wide(gu16.size());
  for (size_t i = 0; i < gu16.size(); ++i) gu16[i] = bf16(x[i]), gu_wide[i] = float(gu16[i]);
  const std::vector<int64_t> gu_shape{N - 1, 2 * F}, act_shape{N - 1, F};
  const Tensor g16 = Tensor::of(std::span<bf16>(gu16)).reshape(gu_shape);
  ops::swiglu_forward(*cpu, f32(sw_want).reshape(act_shape), f32(gu_wide).reshape(gu_shape));
  ops::swiglu_forward(*cpu, Tensor::of(std::span<bf16>(sw_got)).reshape(act_shape), g16);
  for (size_t i = 0; i < sw_want.size(); ++i) REQUIRE(float(sw_got[i]) == test::round_to(sw_want[i], DType::bf16));
  std::vector<float> sw_dout(sw_want.size(), 0.5f), dgu_want(gu16.size());
  for (size_t i = 0; i < sw_dout.size(); ++i) sw_dout[i] = x[(i * 7) % x.size()];
  std::vector<bf16> dgu_got(gu16.size());
  ops::swiglu_backward(*cpu, f32(dgu_want).reshape(gu_shape), f32(gu_wide).reshape(gu_shape),
                       f32(sw_dout).reshape(act_shape));
  ops::swiglu_backward(*cpu, Tensor::of(std::span<bf16>(dgu_got)).reshape(gu_shape), g16,
                       f32(sw_dout).reshape(act_shape));
  for (size_t i = 0; i < dgu_want.size(); ++i) REQUIRE(float(dgu_got[i]) == test::round_to(dgu_want[i], DType::bf16));
}

// The quantization family against its definition (ops/quantize.hpp), worked out here element by
// element: scale amax / qmax per block, codes rounded to nearest even and clamped, int4 packed low
// nibble first; zeros, a short last block, NaN and bf16 input.
TEST_CASE("block quantization against its definition", "[ops][quantize]") {
  auto be = make_cpu_backend(BackendConfig{});
  for (int bits : {8, 4}) {
    const QuantSpec q{bits, 16};
    const int64_t n = 40;  // blocks of 16, 16 and 8
    std::vector<float> x = test::random_vector("quantize def", static_cast<size_t>(n), -3.f, 3.f);
    for (int i = 16; i < 32; ++i) x[static_cast<size_t>(i)] = 0.f;  // a block of zeros
    x[5] = -3.5f;                                                    // block 0's amax, negative
    std::vector<float> words(static_cast<size_t>(q.words(n)), -1.f), back(static_cast<size_t>(n), 0.f);
    ops::quantize_blocks(*be, Tensor::of(std::span<float>(words)), Tensor::of(std::span<float>(x)), n, 1, n, q);
    ops::dequantize_blocks(*be, Tensor::of(std::span<float>(back)), Tensor::of(std::span<float>(words)), 1, n, q, false);
    const int qmax = bits == 8 ? 127 : 7;
    for (int64_t b = 0; b < q.blocks(n); ++b) {
      const int64_t i0 = b * q.block, len = std::min<int64_t>(q.block, n - i0);
      float amax = 0.f;
      for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[static_cast<size_t>(i0 + i)]));
      const float scale = amax / static_cast<float>(qmax);
      const float* rec = words.data() + b * q.record_words();
      INFO(bits << "-bit block " << b);
      CHECK(rec[0] == scale);
      const auto* codes = reinterpret_cast<const uint8_t*>(rec + 1);
      for (int64_t i = 0; i < q.block; ++i) {
        int want = 0;
        if (i < len && scale > 0.f)
          want = static_cast<int>(std::clamp(std::nearbyint(x[static_cast<size_t>(i0 + i)] / scale), float(-qmax), float(qmax)));
        int got = bits == 8 ? static_cast<int8_t>(codes[i]) : ((codes[i / 2] >> (4 * (i % 2))) & 0xF);
        if (bits == 4 && got >= 8) got -= 16;
        CHECK(got == want);
        if (i < len) CHECK(back[static_cast<size_t>(i0 + i)] == static_cast<float>(want) * scale);
      }
    }
  }
  // Many blocks of random values (the vectorised paths), int8 and int4: every code as defined.
  for (int bits : {8, 4}) {
    const QuantSpec q{bits, 256};
    const int64_t n = 100000;
    std::vector<float> x = test::random_vector("quantize many", static_cast<size_t>(n), -5.f, 5.f);
    std::vector<float> words(static_cast<size_t>(q.words(n)));
    ops::quantize_blocks(*be, Tensor::of(std::span<float>(words)), Tensor::of(std::span<float>(x)), n, 1, n, q);
    int64_t wrong = 0;
    const float qmax = bits == 8 ? 127.f : 7.f;
    for (int64_t b = 0; b < q.blocks(n); ++b) {
      const int64_t i0 = b * q.block, len = std::min<int64_t>(q.block, n - i0);
      float amax = 0.f;
      for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[size_t(i0 + i)]));
      const float scale = amax / qmax;
      const float* rec = words.data() + b * q.record_words();
      wrong += rec[0] != scale;
      const auto* codes = reinterpret_cast<const uint8_t*>(rec + 1);
      for (int64_t i = 0; i < len; ++i) {
        const int want = static_cast<int>(std::clamp(std::nearbyint(x[size_t(i0 + i)] / scale), -qmax, qmax));
        int got = bits == 8 ? static_cast<int8_t>(codes[i]) : ((codes[i / 2] >> (4 * (i % 2))) & 0xF);
        if (bits == 4 && got >= 8) got -= 16;
        wrong += got != want;
      }
    }
    // Accumulating adds code x scale with one rounding: fma(code, scale, x).
    std::vector<float> acc = x;
    ops::dequantize_blocks(*be, Tensor::of(std::span<float>(acc)), Tensor::of(std::span<float>(words)), 1, n, q, true);
    for (int64_t i = 0; i < n; ++i) {
      const float* rec = words.data() + (i / q.block) * q.record_words();
      const auto* codes = reinterpret_cast<const uint8_t*>(rec + 1);
      const int64_t k = i % q.block;
      int c = bits == 8 ? static_cast<int8_t>(codes[k]) : ((codes[k / 2] >> (4 * (k % 2))) & 0xF);
      if (bits == 4 && c >= 8) c -= 16;
      wrong += acc[size_t(i)] != std::fma(static_cast<float>(c), rec[0], x[size_t(i)]);
    }
    INFO(bits << "-bit: " << wrong << " codes, scales or accumulated values differ from the definition");
    CHECK(wrong == 0);
  }
  // A NaN poisons its block only; bf16 input quantizes as its f32 value.
  std::vector<float> x(24, 1.f), words(static_cast<size_t>(QuantSpec{8, 8}.words(24))), back(24);
  x[9] = NAN;
  const QuantSpec q{8, 8};
  ops::quantize_blocks(*be, Tensor::of(std::span<float>(words)), Tensor::of(std::span<float>(x)), 24, 1, 24, q);
  ops::dequantize_blocks(*be, Tensor::of(std::span<float>(back)), Tensor::of(std::span<float>(words)), 1, 24, q, false);
  for (int i = 0; i < 24; ++i) CHECK((i >= 8 && i < 16) == std::isnan(back[static_cast<size_t>(i)]));
  std::vector<bf16> xb(24, bf16(0.75f));
  std::vector<float> wb(words.size());
  ops::quantize_blocks(*be, Tensor::of(std::span<float>(wb)), Tensor::of(std::span<bf16>(xb)), 24, 1, 24, q);
  ops::dequantize_blocks(*be, Tensor::of(std::span<float>(back)), Tensor::of(std::span<float>(wb)), 1, 24, q, false);
  for (float v : back) CHECK(std::fabs(v - 0.75f) <= 1e-6f);  // code 127 times the scale 0.75 / 127
}
