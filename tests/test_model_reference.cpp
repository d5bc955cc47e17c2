// The GPT-2 forward and backward against PyTorch (tests/reference/make_reference.py, float64), and
// a finite-difference check of every unit's parameter gradients.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "src/model/model.hpp"

using namespace shardlab;

namespace {

const std::string kReference = std::string(SHARDLAB_SOURCE_DIR) + "/tests/reference/gpt2_tiny_reference.safetensors";

std::vector<float> read_all(SafetensorsReader& r, const std::string& name) {
  std::vector<float> v(static_cast<size_t>(r.entry(name).numel()));
  r.read_f32(name, v);
  return v;
}

std::vector<int32_t> ints(const std::string& json) { return nlohmann::json::parse(json).get<std::vector<int32_t>>(); }

std::unique_ptr<Backend> cpu_with(const std::string& gemm) {
  BackendConfig c{1};
  c.cpu_gemm = gemm;
  return make_cpu_backend(c);
}

struct Fixture {
  explicit Fixture(const std::string& gemm = "auto") : be(cpu_with(gemm)) {}
  std::unique_ptr<Backend> be;
  Pool pool{*be};
};

}  // namespace

TEST_CASE("GPT-2 forward and backward match PyTorch", "[model][reference]") {
  // Under each sgemm library: the tiny model's products are small enough that the rule gives them
  // all to oneDNN, so OpenBLAS is also asked for every product.
  const std::string gemm = GENERATE(as<std::string>{}, "auto", "onednn", "openblas");
  INFO("--cpu-gemm " << gemm);
  Fixture f(gemm);
  SafetensorsReader ref(kReference);
  auto cfg = nlohmann::json::parse(ref.metadata().at("config"));
  ModelSpec spec = model_preset("tiny");
  REQUIRE(cfg["layers"] == spec.layers);
  REQUIRE(cfg["dim"] == spec.dim);
  REQUIRE(cfg["vocab"] == spec.vocab);
  Model model(spec, *f.be, f.pool);
  model.load(kReference);  // "transformer." names and attn.bias buffers, as in an HF file
  auto tokens = ints(ref.metadata().at("tokens")), targets = ints(ref.metadata().at("targets"));
  const int64_t B = cfg["batch"], T = cfg["seq"];
  REQUIRE(static_cast<int64_t>(tokens.size()) == B * T);

  std::vector<float> logits;
  float loss = model.forward_backward(Batch{tokens.data(), targets.data(), B, T}, 1.f, &logits);

  // Tolerances (f32 arithmetic against a float64 reference): logits 2e-5 absolute, loss 1e-5
  // relative, each gradient tensor 1e-5 + 1e-4 x its largest |value|.
  auto ref_logits = read_all(ref, "ref.logits");
  double max_logit_err = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    max_logit_err = std::max(max_logit_err, std::fabs(double(logits[i]) - ref_logits[i]));
  float ref_loss = read_all(ref, "ref.loss")[0];
  std::printf("reference (--cpu-gemm %s): loss %.7f vs PyTorch %.7f; logits max abs error %.3g\n", gemm.c_str(), loss,
              ref_loss, max_logit_err);
  CHECK(max_logit_err <= 2e-5);
  CHECK(loss == Approx(ref_loss).epsilon(1e-5));

  double worst = 0;
  std::string worst_name;
  int failures = 0;
  for (size_t u = 0; u < model.num_units(); ++u)
    for (const TensorDecl& t : model.unit(u).layout().tensors) {
      auto want = read_all(ref, "ref.grad." + t.name);
      auto got = model.grad(t.name).span<float>();
      double max_err = 0, max_ref = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        max_err = std::max(max_err, std::fabs(double(got[i]) - want[i]));
        max_ref = std::max(max_ref, std::fabs(double(want[i])));
      }
      double tol = 1e-5 + 1e-4 * max_ref;
      if (max_err / tol > worst) worst = max_err / tol, worst_name = t.name;
      if (max_err > tol) {
        ++failures;
        std::printf("  MISMATCH %-26s max abs error %.3g (largest |grad| %.3g, tolerance %.3g)\n", t.name.c_str(),
                    max_err, max_ref, tol);
      }
    }
  std::printf("reference: gradients of %zu units, worst error/tolerance %.3f (%s)\n", model.num_units(), worst,
              worst_name.c_str());
  CHECK(failures == 0);
}

TEST_CASE("finite differences agree with every unit's gradients", "[model][gradcheck]") {
  Fixture f;
  ModelSpec spec = model_preset("tiny");
  spec.seq = 8;  // short sequences keep the check quick
  Model model(spec, *f.be, f.pool);
  model.init(7);
  const int64_t B = 2, T = 8;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens[i] = static_cast<int32_t>((i * 37 + 11) % spec.vocab);
    targets[i] = static_cast<int32_t>((i * 53 + 5) % spec.vocab);
  }
  Batch batch{tokens.data(), targets.data(), B, T};
  model.zero_grads();
  model.forward_backward(batch, 1.f);
  // Keep the analytic gradients: later forward_backward calls accumulate into the buffers.
  std::vector<std::vector<float>> grads;
  for (size_t u = 0; u < model.num_units(); ++u) {
    auto g = model.unit_grads(u).span<float>();
    grads.emplace_back(g.begin(), g.end());
  }
  auto loss_at = [&]() {
    model.zero_grads();
    return static_cast<double>(model.forward_backward(batch, 1.f));
  };
  // For each tensor, the two entries with the largest analytic gradient; central differences with
  // h = 1e-2. Tolerance: |fd - g| <= 2e-4 + 3e-2 |g| (f32 loss rounding over 2h, O(h^2) truncation).
  int checked = 0, bad = 0;
  for (size_t u = 0; u < model.num_units(); ++u)
    for (const TensorDecl& t : model.unit(u).layout().tensors) {
      std::vector<int64_t> idx(static_cast<size_t>(t.numel));
      for (int64_t i = 0; i < t.numel; ++i) idx[i] = i;
      const auto& g = grads[u];
      std::partial_sort(idx.begin(), idx.begin() + 2, idx.end(), [&](int64_t a, int64_t b) {
        return std::fabs(g[t.offset + a]) > std::fabs(g[t.offset + b]);
      });
      for (int k = 0; k < 2; ++k) {
        float* p = model.unit_params(u).ptr<float>() + t.offset + idx[k];
        const float orig = *p, h = 1e-2f;
        *p = orig + h;
        double up = loss_at();
        *p = orig - h;
        double down = loss_at();
        *p = orig;
        double fd = (up - down) / (2.0 * h), an = g[t.offset + idx[k]];
        ++checked;
        if (std::fabs(fd - an) > 2e-4 + 3e-2 * std::fabs(an)) {
          ++bad;
          std::printf("  gradcheck %s[%lld]: finite difference %.6g, backward %.6g\n", t.name.c_str(),
                      static_cast<long long>(idx[k]), fd, an);
        }
      }
    }
  std::printf("gradcheck: %d entries over %zu units, %d outside tolerance\n", checked, model.num_units(), bad);
  CHECK(checked == 2 * static_cast<int>(2 + 12 * spec.layers + 2));
  CHECK(bad == 0);
}
