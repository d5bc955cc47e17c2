// Optimizers against the textbook formulas (PyTorch's AdamW and SGD), computed in double here, and
// Muon's iteration against torch's.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "optim/optimizer.hpp"
#include "src/backend/ops/optimizer.hpp"
#include "shard/flat_param.hpp"
#include "src/model/gpt2/gpt2.hpp"
#include "tests/test_util.hpp"

using namespace shardlab;

TEST_CASE("AdamW matches the reference update, with decay only where it belongs", "[optim]") {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  const int64_t n = 50000;  // large enough for the threaded path
  auto p = test::random_vector("p", n), g0 = test::random_vector("g", n);
  std::vector<double> rp(p.begin(), p.end()), rm(n, 0), rv(n, 0);
  std::vector<ParamSegment> segs = {{0, 30000, true}, {30000, 20000, false}};
  OptimConfig cfg;
  cfg.beta1 = 0.8f, cfg.beta2 = 0.9f, cfg.eps = 1e-6f, cfg.weight_decay = 0.1f;
  std::vector<float> g = g0;
  Optimizer opt(pool, cfg);
  opt.add(Tensor::of(std::span<float>(p)), Tensor::of(std::span<float>(g)), segs, "test");
  const float lr = 0.01f, scale = 0.5f;
  for (int step = 1; step <= 5; ++step) {
    for (int64_t i = 0; i < n; ++i) g[i] = g0[i] * static_cast<float>(step);  // changing gradients
    opt.step(step, lr, scale);
    for (int64_t i = 0; i < n; ++i) {
      double gi = double(g[i]) * scale, wd = i < 30000 ? 0.1 : 0.0;
      rm[i] = 0.8 * rm[i] + 0.2 * gi;
      rv[i] = 0.9 * rv[i] + 0.1 * gi * gi;
      double mh = rm[i] / (1 - std::pow(0.8, step)), vh = rv[i] / (1 - std::pow(0.9, step));
      rp[i] -= lr * (mh / (std::sqrt(vh) + 1e-6) + wd * rp[i]);
    }
  }
  // Tolerance: f32 state over 5 steps: 1e-5 absolute on parameters of order 1.
  double max_err = 0;
  for (int64_t i = 0; i < n; ++i) max_err = std::max(max_err, std::fabs(p[i] - rp[i]));
  CHECK(max_err < 1e-5);
  CHECK(pool.ledger().current(Category::optim_state) == 2 * n * 4);
}

TEST_CASE("AdamW from bf16 gradients equals AdamW from their f32 copy, bit for bit", "[optim]") {
  // Mixed precision keeps gradients in bf16; the update widens them as it reads them instead of
  // through an f32 copy: the same values, the same arithmetic.
  auto be = make_cpu_backend(BackendConfig{2});
  const int64_t n = 50001;  // threaded, and a tail
  auto p0 = test::random_vector("p", n), g = test::random_vector("g", n);
  std::vector<uint16_t> g16(n);
  std::vector<float> g32(n);
  for (int64_t i = 0; i < n; ++i) g16[i] = f32_to_bf16_bits(g[i]), g32[i] = bf16_bits_to_f32(g16[i]);
  std::vector<float> pa = p0, pb = p0, ma(n, 0), mb(n, 0), va(n, 0), vb(n, 0);
  for (int step = 1; step <= 3; ++step) {
    const AdamWArgs a{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.7f};
    ops::adamw_update(*be, Tensor::of(std::span<float>(pa)), Tensor::flat(g16.data(), DType::bf16, n),
                      Tensor::of(std::span<float>(ma)), Tensor::of(std::span<float>(va)), a);
    ops::adamw_update(*be, Tensor::of(std::span<float>(pb)), Tensor::of(std::span<float>(g32)),
                      Tensor::of(std::span<float>(mb)), Tensor::of(std::span<float>(vb)), a);
  }
  CHECK(std::memcmp(pa.data(), pb.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(ma.data(), mb.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(va.data(), vb.data(), n * sizeof(float)) == 0);
}

TEST_CASE("SGD with momentum matches the reference update", "[optim]") {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  std::vector<float> p = {1.f, -2.f, 0.5f}, g = {0.1f, 0.2f, -0.3f};
  std::vector<double> rp(p.begin(), p.end()), buf(3, 0);
  OptimConfig cfg;
  cfg.kind = OptimizerKind::sgd, cfg.momentum = 0.9f, cfg.weight_decay = 0.01f;
  Optimizer opt(pool, cfg);
  opt.add(Tensor::of(std::span<float>(p)), Tensor::of(std::span<float>(g)), {{0, 2, true}, {2, 1, false}}, "sgd");
  for (int step = 1; step <= 3; ++step) {
    opt.step(step, 0.1f, 1.f);
    for (int i = 0; i < 3; ++i) {
      double d = g[i] + (i < 2 ? 0.01 * rp[i] : 0.0);
      buf[i] = 0.9 * buf[i] + d;
      rp[i] -= 0.1 * buf[i];
    }
  }
  for (int i = 0; i < 3; ++i) CHECK(p[i] == Approx(rp[i]).epsilon(1e-6));
  CHECK(pool.ledger().current(Category::optim_state) == 3 * 4);  // one momentum buffer
}

TEST_CASE("segments cover tensors and padding of any shard", "[optim]") {
  ModelSpec spec = model_preset("tiny");
  auto layout = gpt2_layout(spec);
  const UnitLayout& block = layout[1];
  auto all = unit_segments(block, 0, block.numel);
  int64_t covered = 0, decayed = 0;
  for (auto& s : all) {
    covered += s.numel;
    if (s.decay) decayed += s.numel;
  }
  CHECK(covered == block.numel);
  CHECK(decayed == 12 * spec.dim * spec.dim);  // c_attn 3C^2 + c_proj C^2 + c_fc 4C^2 + mlp c_proj 4C^2
  // A shard that starts inside ln_1.bias and runs into padding past the end.
  auto shard = unit_segments(block, spec.dim + 5, block.numel);
  CHECK(shard.front().offset == 0);
  CHECK(shard.front().numel == spec.dim - 5);
  CHECK_FALSE(shard.front().decay);
  CHECK(shard.back().offset + shard.back().numel == block.numel);
  CHECK_FALSE(shard.back().decay);
}

TEST_CASE("learning-rate schedules and clipping", "[optim]") {
  LrSchedule s;
  s.kind = ScheduleKind::cosine, s.lr = 1.f, s.warmup_steps = 4, s.total_steps = 14, s.min_lr_frac = 0.1f;
  CHECK(s.at(0) == Approx(0.25));
  CHECK(s.at(3) == Approx(1.0));
  CHECK(s.at(4) == Approx(1.0));
  CHECK(s.at(13) == Approx(0.1));
  CHECK(s.at(8) < 1.0);
  CHECK(s.at(8) > 0.1);
  s.kind = ScheduleKind::constant;
  CHECK(s.at(13) == 1.f);
  CHECK_THROWS_WITH(parse_schedule("linear"), Catch::Contains("--schedule 'linear'"));
  CHECK(parse_schedule("cosine") == ScheduleKind::cosine);
  CHECK(clip_factor(2.0, 1.f) == Approx(0.5));
  CHECK(clip_factor(0.5, 1.f) == 1.f);
  CHECK(clip_factor(100.0, 0.f) == 1.f);
  CHECK_THROWS_WITH(parse_optimizer("lion"), Catch::Contains("--optimizer 'lion'"));
  CHECK(parse_optimizer("sgd") == OptimizerKind::sgd);
}

// Muon's iteration against torch's own _zeropower_via_newtonschulz (tests/reference/
// make_muon_reference.py): the f32 form to f32 precision; the bf16 one (the default), computed here
// in f32 storage rounded to bf16 after every operation, equal to torch's bf16 values for nearly
// every element and a few bf16 roundings apart at most (the f32 sums inside a product differ in
// order, and a sum on a rounding boundary goes the other way).
TEST_CASE("Muon's Newton-Schulz iteration equals torch's, in f32 and in bf16", "[optim][muon]") {
  std::ifstream f(std::string(SHARDLAB_SOURCE_DIR) + "/tests/reference/muon_reference.json");
  const auto ref = nlohmann::json::parse(f);
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  for (const auto& c : ref["iteration"]) {
    const int64_t rows = c["rows"], cols = c["cols"];
    for (const DType ns : {DType::f32, DType::bf16}) {
      MuonConfig cfg;
      cfg.ns_dtype = ns;
      std::vector<float> x = c["input"].get<std::vector<float>>(), out(x.size());
      newton_schulz(pool, Tensor::of(std::span<float>(x)), Tensor::of(std::span<float>(out)), rows, cols, cfg);
      const auto want = c[dtype_name(ns)].get<std::vector<float>>();
      double worst = 0;
      size_t equal = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        worst = std::max(worst, std::fabs(double(out[i]) - want[i]));
        equal += out[i] == want[i];
      }
      std::printf("muon iteration %lld x %lld %s: max |error| %.3g, %zu of %zu elements equal to torch's\n",
                  static_cast<long long>(rows), static_cast<long long>(cols), dtype_name(ns), worst, equal,
                  out.size());
      INFO(rows << " x " << cols << " " << dtype_name(ns));
      if (ns == DType::f32) {
        CHECK(worst <= 1e-5);
      } else {
        CHECK(equal >= out.size() * 9 / 10);
        CHECK(worst <= 1.6e-2);  // a few roundings of values below 1 (2^-8 apart near 1)
      }
    }
  }
  CHECK(muon_lr_ratio(MuonAdjustLr::original, 3072, 768) == Approx(2.0));  // torch's sqrt(max(1, A / B))
  CHECK(muon_lr_ratio(MuonAdjustLr::original, 768, 3072) == 1.0);
  CHECK(muon_lr_ratio(MuonAdjustLr::match_rms_adamw, 768, 3072) == Approx(0.2 * std::sqrt(3072.0)));
  CHECK(newton_schulz_flops(768, 3072, 5) == Approx(5 * (4.0 * 768 * 768 * 3072 + 2.0 * 768 * 768 * 768)));
  CHECK_THROWS_WITH(parse_muon_adjust_lr("spectral"), Catch::Contains("--muon-adjust-lr 'spectral'"));
}

TEST_CASE("AdamW over segments writes each updated element rounded into the bf16 copy, the gaps untouched",
          "[optim]") {
  // Mixed precision's bf16 parameters written by the update (ops::adamw_update_segments' rounded)
  // equal the cast of the updated f32 master copy that would follow it.
  auto be = make_cpu_backend({});
  const int64_t n = 300;
  auto p = test::random_vector("rounded p", n), g = test::random_vector("rounded g", n);
  std::vector<float> m(n, 0.f), v(n, 0.f), want(n);
  std::vector<uint16_t> bits(n), cast_bits(n);
  const Tensor r = Tensor::flat(bits.data(), DType::bf16, n);
  be->fill(r, -7.f);
  const std::vector<AdamWSegment> segs{{0, 100, 0.1f}, {150, 150, 0.f}};  // 100..149 a gap
  AdamWArgs a;
  a.lr = 1e-2f, a.step = 1;
  auto flat = [](std::vector<float>& x) { return Tensor::flat(x.data(), DType::f32, static_cast<int64_t>(x.size())); };
  ops::adamw_update_segments(*be, flat(p), flat(g), flat(m), flat(v), segs, a, r);
  const Tensor c = Tensor::flat(cast_bits.data(), DType::bf16, n);
  be->cast(c, flat(p));
  std::vector<float> got(n), cast(n);
  be->cast(flat(got), r);
  be->cast(flat(cast), c);
  for (int64_t i = 0; i < n; ++i) {
    INFO("element " << i);
    REQUIRE(got[i] == (i >= 100 && i < 150 ? test::round_to(-7.f, DType::bf16) : cast[i]));
  }
}
