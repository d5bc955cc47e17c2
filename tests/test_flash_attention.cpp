// The fused (flash) attention kernels against three references: attention computed here in double
// precision (causal and not, grouped-query, tails, T = 1), the naive kernels that keep the
// probabilities (causal), and PyTorch's scaled_dot_product_attention (a committed file,
// tests/reference/make_sdpa_reference.py). Forward within 1e-5 and gradients within 1e-4 of the
// largest reference value; the log-sum-exp within 1e-5. bf16 inputs: against the reference over the
// same (widened) values, the output within 1e-5 plus its own rounding, and bit for bit against the
// f32 kernels over those values.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "src/backend/ops/attention.hpp"
#include "src/backend/ops/flash_attention.hpp"
#include "src/backend/ops/kv_cache.hpp"
#include "src/model/safetensors.hpp"
#include "tests/test_util.hpp"

using namespace shardlab;

namespace {

// vd: the value head dimension (0: hd; DeepSeek's latent attention has one of its own).
struct Dims {
  int64_t B, T, H, KV, hd;
  bool causal;
  int64_t vd = 0;
  int64_t v() const { return vd > 0 ? vd : hd; }
  int64_t R() const { return (H + KV) * hd + KV * v(); }
  int64_t O() const { return H * v(); }  // the output's row
};

struct Result {
  std::vector<float> out, lse, dqkv;
};

float round_bf16(float x) { return static_cast<float>(bf16(x)); }

// Attention in double over the fused (B, T, (H + KV) hd + KV vd) buffer, forward and backward. Backward's
// D = rowsum(dO * O) reads O from `given_out` when there is one (a bf16 caller's output, as the
// kernel rounded it), else its own.
Result reference(const Dims& d, const std::vector<float>& qkv, const std::vector<float>& dout,
                 const std::vector<float>* given_out = nullptr) {
  const int64_t R = d.R(), C = d.H * d.hd, O = d.O(), V = d.v(), G = d.H / d.KV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.hd));
  Result r;
  r.out.assign(static_cast<size_t>(d.B * d.T * O), 0.f);
  r.lse.assign(static_cast<size_t>(d.B * d.H * d.T), 0.f);
  std::vector<double> dq(static_cast<size_t>(d.B * d.T * R), 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t col) { return static_cast<double>(qkv[static_cast<size_t>((b * d.T + t) * R + col)]); };
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t kc = C + (h / G) * d.hd, vc = C + d.KV * d.hd + (h / G) * V;
      for (int64_t t = 0; t < d.T; ++t) {
        const int64_t n = d.causal ? t + 1 : d.T;
        std::vector<double> p(static_cast<size_t>(n));
        double mx = -INFINITY;
        for (int64_t s = 0; s < n; ++s) {
          double acc = 0;
          for (int64_t c = 0; c < d.hd; ++c) acc += at(b, t, h * d.hd + c) * at(b, s, kc + c);
          p[static_cast<size_t>(s)] = acc * scale;
          mx = std::max(mx, p[static_cast<size_t>(s)]);
        }
        double sum = 0;
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (double& x : p) x /= sum;
        r.lse[static_cast<size_t>((b * d.H + h) * d.T + t)] = static_cast<float>(mx + std::log(sum));
        const float* go = dout.data() + (b * d.T + t) * O + h * V;
        std::vector<double> o(static_cast<size_t>(V), 0.0), dp(static_cast<size_t>(n), 0.0);
        for (int64_t s = 0; s < n; ++s)
          for (int64_t c = 0; c < V; ++c) {
            o[static_cast<size_t>(c)] += p[static_cast<size_t>(s)] * at(b, s, vc + c);
            dp[static_cast<size_t>(s)] += go[c] * at(b, s, vc + c);
          }
        double D = 0;
        for (int64_t c = 0; c < V; ++c) {
          r.out[static_cast<size_t>((b * d.T + t) * O + h * V + c)] = static_cast<float>(o[static_cast<size_t>(c)]);
          D += go[c] * (given_out ? (*given_out)[static_cast<size_t>((b * d.T + t) * O + h * V + c)]
                                  : o[static_cast<size_t>(c)]);
        }
        for (int64_t s = 0; s < n; ++s) {
          const double ps = p[static_cast<size_t>(s)], ds = ps * (dp[static_cast<size_t>(s)] - D);
          for (int64_t c = 0; c < d.hd; ++c) {
            dq[static_cast<size_t>((b * d.T + t) * R + h * d.hd + c)] += scale * ds * at(b, s, kc + c);
            dq[static_cast<size_t>((b * d.T + s) * R + kc + c)] += scale * ds * at(b, t, h * d.hd + c);
          }
          for (int64_t c = 0; c < V; ++c) dq[static_cast<size_t>((b * d.T + s) * R + vc + c)] += ps * go[c];
        }
      }
    }
  r.dqkv.assign(dq.begin(), dq.end());
  return r;
}

// The flash kernels on the CPU backend (or the naive ones: lse left empty); with round_out,
// backward is given forward's output rounded to bf16.
Result run(const Dims& d, const std::vector<float>& qkv, const std::vector<float>& dout, bool naive = false,
           bool round_out = false) {
  auto be = make_cpu_backend(BackendConfig{});
  const int64_t R = d.R();
  std::vector<float> in = qkv, go = dout;
  Result r;
  r.out.assign(static_cast<size_t>(d.B * d.T * d.O()), 0.f);
  r.dqkv.assign(in.size(), 0.f);
  const std::vector<int64_t> qkv_shape{d.B, d.T, R};
  Tensor tq = Tensor::of(std::span<float>(in)).reshape(qkv_shape), to = Tensor::of(std::span<float>(r.out));
  Tensor tgo = Tensor::of(std::span<float>(go)), tdq = Tensor::of(std::span<float>(r.dqkv));
  if (naive) {
    std::vector<float> att(static_cast<size_t>(d.B * d.H * d.T * d.T)), scratch(static_cast<size_t>(attention_scratch_elems(d.T, d.H)));
    const std::vector<int64_t> att_shape{d.B, d.H, d.T, d.T};
    Tensor ta = Tensor::of(std::span<float>(att)).reshape(att_shape);
    ops::attention_forward(*be, to, ta, tq, d.H, d.KV, d.vd);
    ops::attention_backward(*be, tdq, tgo, tq, ta, d.H, d.KV, Tensor::of(std::span<float>(scratch)), d.vd);
    return r;
  }
  r.lse.assign(static_cast<size_t>(d.B * d.H * d.T), 0.f);
  std::vector<float> ws(static_cast<size_t>(
      std::max(flash_attention_workspace_elems(d.B, d.T, d.H, d.KV, d.hd, false, false, d.vd),
               flash_attention_workspace_elems(d.B, d.T, d.H, d.KV, d.hd, true, false, d.vd))));
  Tensor tl = Tensor::of(std::span<float>(r.lse)), tw = Tensor::of(std::span<float>(ws));
  ops::flash_attention_forward(*be, to, tl, tq, d.H, d.KV, d.causal, tw, d.vd);
  if (round_out)
    for (float& x : r.out) x = round_bf16(x);
  ops::flash_attention_backward(*be, tdq, tgo, tq, to, tl, d.H, d.KV, d.causal, tw, d.vd);
  return r;
}

// The flash kernels over bf16 inputs (the values of qkv and dout, which must be bf16's): out
// widened back to f32 for comparison; lse and dqkv are f32.
Result run_bf16(const Dims& d, const std::vector<float>& qkv, const std::vector<float>& dout) {
  auto be = make_cpu_backend(BackendConfig{});
  std::vector<bf16> in(qkv.size()), go(dout.size()), out(static_cast<size_t>(d.B * d.T * d.O()));
  for (size_t i = 0; i < qkv.size(); ++i) in[i] = bf16(qkv[i]);
  for (size_t i = 0; i < dout.size(); ++i) go[i] = bf16(dout[i]);
  Result r;
  r.lse.assign(static_cast<size_t>(d.B * d.H * d.T), 0.f);
  r.dqkv.assign(qkv.size(), 0.f);
  std::vector<float> ws(static_cast<size_t>(
      std::max(flash_attention_workspace_elems(d.B, d.T, d.H, d.KV, d.hd, false, true, d.vd),
               flash_attention_workspace_elems(d.B, d.T, d.H, d.KV, d.hd, true, true, d.vd))));
  Tensor tq = Tensor::of(std::span<bf16>(in)).reshape(std::vector<int64_t>{d.B, d.T, d.R()});
  Tensor to = Tensor::of(std::span<bf16>(out)), tl = Tensor::of(std::span<float>(r.lse));
  Tensor tw = Tensor::of(std::span<float>(ws));
  ops::flash_attention_forward(*be, to, tl, tq, d.H, d.KV, d.causal, tw, d.vd);
  ops::flash_attention_backward(*be, Tensor::of(std::span<float>(r.dqkv)), Tensor::of(std::span<bf16>(go)), tq, to, tl,
                                d.H, d.KV, d.causal, tw, d.vd);
  for (const bf16& x : out) r.out.push_back(static_cast<float>(x));
  return r;
}

// max |got - want| / max(max |want|, 1e-6)
double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double err = 0, scale = 1e-6;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(double(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  return err / scale;
}

}  // namespace

TEST_CASE("flash attention matches attention in double precision", "[flash][ops]") {
  // T = 1, a partial tile, exact tiles, several tiles with a tail; multi-head, grouped, multi-query.
  const std::vector<Dims> cases = {
      {2, 1, 4, 2, 8, true},     {1, 5, 2, 2, 8, true},     {2, 64, 4, 4, 16, true},  {1, 129, 4, 2, 64, true},
      {1, 300, 4, 1, 32, true},  {2, 200, 2, 2, 128, true}, {1, 1, 2, 1, 8, false},   {2, 130, 4, 2, 16, false},
      {1, 257, 2, 2, 64, false}, {2, 520, 8, 2, 64, true},  {4, 260, 4, 2, 16, false},
      // Values of a head dimension of their own (DeepSeek's 192 / 128 in small): narrower, wider, tails.
      {2, 33, 4, 4, 12, true, 6}, {1, 300, 2, 2, 48, true, 32}, {1, 129, 4, 2, 16, false, 40}, {2, 1, 2, 2, 24, true, 8},
  };
  for (const Dims& d : cases) {
    INFO("B " << d.B << " T " << d.T << " H " << d.H << " KV " << d.KV << " hd " << d.hd << " vd " << d.v()
              << (d.causal ? " causal" : " not causal"));
    const auto qkv = test::random_vector("flash qkv", static_cast<size_t>(d.B * d.T * d.R()), -2.f, 2.f);
    const auto dout = test::random_vector("flash dout", static_cast<size_t>(d.B * d.T * d.O()));
    const Result want = reference(d, qkv, dout), got = run(d, qkv, dout);
    CHECK(rel_err(got.out, want.out) <= 1e-5);
    CHECK(rel_err(got.lse, want.lse) <= 1e-5);
    CHECK(rel_err(got.dqkv, want.dqkv) <= 1e-4);
  }
}

TEST_CASE("flash attention reads bf16 inputs with f32 sums", "[flash][ops][bf16]") {
  const std::vector<Dims> cases = {
      {2, 1, 4, 2, 8, true}, {1, 129, 4, 2, 64, true}, {1, 300, 4, 1, 32, true}, {2, 200, 2, 2, 128, true},
      {2, 130, 4, 2, 16, false}, {1, 257, 2, 2, 64, false}, {1, 150, 4, 4, 24, true, 16},
  };
  for (const Dims& d : cases) {
    INFO("B " << d.B << " T " << d.T << " H " << d.H << " KV " << d.KV << " hd " << d.hd << " vd " << d.v()
              << (d.causal ? " causal" : " not causal"));
    auto qkv = test::random_vector("flash qkv", static_cast<size_t>(d.B * d.T * d.R()), -2.f, 2.f);
    auto dout = test::random_vector("flash dout", static_cast<size_t>(d.B * d.T * d.O()));
    for (float& x : qkv) x = round_bf16(x);
    for (float& x : dout) x = round_bf16(x);
    const Result got = run_bf16(d, qkv, dout), want = reference(d, qkv, dout, &got.out);
    // The output: within 1e-5 of the largest value before its one rounding to bf16 (half a unit in
    // the last place of the value it rounds to).
    double scale = 1e-6;
    for (float w : want.out) scale = std::max(scale, std::fabs(double(w)));
    size_t over = 0;
    for (size_t i = 0; i < want.out.size(); ++i) {
      const double half_ulp = want.out[i] == 0.f ? 0.0 : std::ldexp(1.0, std::ilogb(want.out[i]) - 8);
      over += std::fabs(double(got.out[i]) - want.out[i]) > half_ulp + 1e-5 * scale;
    }
    CHECK(over == 0);
    CHECK(rel_err(got.lse, want.lse) <= 1e-5);
    CHECK(rel_err(got.dqkv, want.dqkv) <= 1e-4);
    // The f32 kernels over the same values (backward given the output as bf16 rounded it) compute
    // the same sums in the same order: bit for bit.
    const Result f32 = run(d, qkv, dout, false, /*round_out=*/true);
    CHECK(got.out == f32.out);
    CHECK(got.lse == f32.lse);
    CHECK(got.dqkv == f32.dqkv);
  }
}

TEST_CASE("flash attention gives a head the same bits whichever heads share its forward task", "[flash][ops]") {
  // Forward runs the query heads of a K/V head in one task (up to 4) while that leaves 16 tasks:
  // 4 at B = 2 below, 2 at B = 1, 1 for a single query tile.
  const Dims two{2, 520, 8, 2, 64, true}, one{1, 520, 8, 2, 64, true};
  CHECK(flash_heads_per_task(flash_shape_of_qkv(2, 520, 8, 2, 64, true)) == 4);
  CHECK(flash_heads_per_task(flash_shape_of_qkv(1, 520, 8, 2, 64, true)) == 2);
  CHECK(flash_heads_per_task(flash_shape_of_qkv(1, 100, 8, 2, 64, true)) == 1);
  CHECK(flash_heads_per_task(flash_shape_of_qkv(1, 8192, 6, 2, 64, true)) == 3);
  const auto qkv = test::random_vector("flash qkv", static_cast<size_t>(two.B * two.T * two.R()), -2.f, 2.f);
  const auto dout = test::random_vector("flash dout", static_cast<size_t>(two.B * two.T * two.H * two.hd));
  const Result both = run(two, qkv, dout);
  const size_t in_rows = static_cast<size_t>(one.T * one.R()), out_rows = static_cast<size_t>(one.T * one.H * one.hd);
  const size_t lse_rows = static_cast<size_t>(one.H * one.T);
  for (size_t b = 0; b < 2; ++b) {
    INFO("batch element " << b);
    const std::vector<float> q(qkv.begin() + b * in_rows, qkv.begin() + (b + 1) * in_rows);
    const std::vector<float> g(dout.begin() + b * out_rows, dout.begin() + (b + 1) * out_rows);
    const Result alone = run(one, q, g);
    CHECK(std::memcmp(alone.out.data(), both.out.data() + b * out_rows, out_rows * sizeof(float)) == 0);
    CHECK(std::memcmp(alone.lse.data(), both.lse.data() + b * lse_rows, lse_rows * sizeof(float)) == 0);
    CHECK(std::memcmp(alone.dqkv.data(), both.dqkv.data() + b * in_rows, in_rows * sizeof(float)) == 0);
  }
}

TEST_CASE("flash attention matches the naive kernels", "[flash][ops]") {
  for (const Dims& d : std::vector<Dims>{{2, 150, 4, 2, 16, true},
                                         {1, 33, 3, 3, 8, true},
                                         {1, 1, 2, 2, 4, true},
                                         {2, 40, 4, 4, 12, true, 6},
                                         {1, 70, 4, 2, 8, true, 20}}) {
    INFO("B " << d.B << " T " << d.T << " H " << d.H << " KV " << d.KV << " hd " << d.hd << " vd " << d.v());
    const auto qkv = test::random_vector("flash qkv", static_cast<size_t>(d.B * d.T * d.R()), -2.f, 2.f);
    const auto dout = test::random_vector("flash dout", static_cast<size_t>(d.B * d.T * d.O()));
    const Result want = run(d, qkv, dout, true), got = run(d, qkv, dout);
    CHECK(rel_err(got.out, want.out) <= 1e-5);
    CHECK(rel_err(got.dqkv, want.dqkv) <= 1e-4);
  }
}

TEST_CASE("flash attention matches PyTorch's scaled_dot_product_attention", "[flash][ops][reference]") {
  SafetensorsReader f(std::string(SHARDLAB_SOURCE_DIR) + "/tests/reference/sdpa_reference.safetensors");
  auto read = [&](const std::string& name) {
    std::vector<float> v(static_cast<size_t>(f.entry(name).numel()));
    f.read_f32(name, v);
    return v;
  };
  const std::vector<int64_t> qs = f.entry("q").shape, ks = f.entry("k").shape;
  const int64_t B = qs[0], H = qs[1], T = qs[2], hd = qs[3], KV = ks[1];
  // PyTorch's (B, heads, T, hd) tensors into the fused (B, T, (H + 2 KV) hd) rows and back.
  auto to_rows = [&](std::vector<float>& rows, int64_t R, int64_t col0, const std::vector<float>& t, int64_t heads) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t s = 0; s < T; ++s)
          for (int64_t c = 0; c < hd; ++c)
            rows[static_cast<size_t>((b * T + s) * R + col0 + h * hd + c)] = t[static_cast<size_t>(((b * heads + h) * T + s) * hd + c)];
  };
  const int64_t R = (H + 2 * KV) * hd;
  std::vector<float> qkv(static_cast<size_t>(B * T * R)), dout(static_cast<size_t>(B * T * H * hd));
  to_rows(qkv, R, 0, read("q"), H);
  to_rows(qkv, R, H * hd, read("k"), KV);
  to_rows(qkv, R, (H + KV) * hd, read("v"), KV);
  to_rows(dout, H * hd, 0, read("dout"), H);
  for (const std::string c : {"causal", "full"}) {
    INFO("case " << c);
    const Dims d{B, T, H, KV, hd, c == "causal"};
    const Result got = run(d, qkv, dout);
    std::vector<float> out(got.out.size()), dqkv(got.dqkv.size());
    to_rows(out, H * hd, 0, read(c + ".out"), H);
    to_rows(dqkv, R, 0, read(c + ".dq"), H);
    to_rows(dqkv, R, H * hd, read(c + ".dk"), KV);
    to_rows(dqkv, R, (H + KV) * hd, read(c + ".dv"), KV);
    CHECK(rel_err(got.out, out) <= 1e-5);
    CHECK(rel_err(got.lse, read(c + ".lse")) <= 1e-5);
    CHECK(rel_err(got.dqkv, dqkv) <= 1e-4);
  }
}

TEST_CASE("decoding through the flash kernel matches the naive cached attention", "[flash][ops][decode]") {
  auto be = make_cpu_backend(BackendConfig{});
  const int64_t B = 2, S = 300, H = 4, KV = 2, hd = 16, R = (H + 2 * KV) * hd;
  std::vector<float> k(static_cast<size_t>(B * S * KV * hd)), v(k.size());
  Tensor tk = Tensor::of(std::span<float>(k)).reshape(std::vector<int64_t>{B, S, KV * hd});
  Tensor tv = Tensor::of(std::span<float>(v)).reshape(std::vector<int64_t>{B, S, KV * hd});
  int64_t pos = 0;
  for (int64_t T : {int64_t{137}, int64_t{1}, int64_t{5}, int64_t{150}}) {  // a prompt, then steps, then a block
    INFO("positions " << pos << " + " << T);
    auto qkv = test::random_vector("flash cached qkv " + std::to_string(pos), static_cast<size_t>(B * T * R), -2.f, 2.f);
    Tensor tq = Tensor::of(std::span<float>(qkv)).reshape(std::vector<int64_t>{B, T, R});
    ops::kv_cache_write(*be, tk, tv, tq, H, KV, pos);
    std::vector<float> want(static_cast<size_t>(B * T * H * hd)), got(want.size());
    ops::attention_cached(*be, Tensor::of(std::span<float>(want)), tq, tk, tv, H, KV, pos);
    std::vector<float> ws(static_cast<size_t>(flash_cached_workspace_elems(B, T, S, H, KV, hd, pos)));
    ops::flash_attention_cached(*be, Tensor::of(std::span<float>(got)), tq, tk, tv, H, KV, pos,
                                Tensor::of(std::span<float>(ws)));
    CHECK(rel_err(got, want) <= 1e-5);
    pos += T;
  }
}
