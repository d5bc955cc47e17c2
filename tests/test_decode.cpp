// Incremental decoding with a KV cache (src/model/decode.hpp) against the whole forward, whose
// logits the reference tests check against PyTorch: every position's logits, for GPT-2 (learned
// positions) and Llama (RoPE, grouped-query heads, tied and untied, Llama 3.1's scaling), from
// presets and from the reference fixtures' weights; and Trainer::generate's tokens with and
// without the cache, greedy and sampled, past the model's positions too.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "src/comm/sim_comm.hpp"
#include "src/model/decode.hpp"
#include "src/model/model.hpp"
#include "src/train/trainer.hpp"

using namespace shardlab;

namespace {

const std::string kRef = std::string(SHARDLAB_SOURCE_DIR) + "/tests/reference/";

// A Model's parameters as the Decoder's hooks take them (Model answers its own hooks privately):
// views of each unit's flat buffer, borrowed tensors from their owner's.
class ModelHooks final : public UnitHooks {
 public:
  ModelHooks(Model& m, const std::vector<std::unique_ptr<Unit>>& units) : m_(m), units_(units) {}
  ParamSet forward_params(size_t u) override {
    ParamSet p;
    add_unit_views(p, units_[u]->layout(), m_.unit_params(u));
    for (const BorrowedTensor& b : borrowed_tensors(units_, u))
      p.set(b.decl->name, m_.unit_params(b.owner).slice(b.decl->offset, b.decl->numel).reshape(b.decl->shape));
    return p;
  }
  ParamSet backward_params(size_t) override { throw std::logic_error("decoding has no backward"); }
  ParamSet grads(size_t) override { throw std::logic_error("decoding has no backward"); }

 private:
  Model& m_;
  const std::vector<std::unique_ptr<Unit>>& units_;
};

struct Case {
  std::string name;
  ModelSpec spec;
  std::string weights;  // "" = the family's initialisation
};

ModelSpec llama_reference_spec(const std::string& file) {
  SafetensorsReader r(file);
  return model_family("llama").spec_from_hf_config(nlohmann::json::parse(r.metadata().at("hf_config")));
}

std::vector<Case> cases() {
  ModelSpec mqa = model_preset("llama-tiny");
  mqa.kv_heads = 1;  // multi-query: every query head reads one K/V head
  std::vector<Case> c = {{"gpt2 tiny", model_preset("tiny"), ""},
                         {"llama-tiny", model_preset("llama-tiny"), ""},
                         {"llama-tiny, one K/V head", mqa, ""},
                         {"gpt2_tiny_reference", model_preset("tiny"), kRef + "gpt2_tiny_reference.safetensors"},
                         {"hf_gpt2_tiny", read_hf_config(kRef + "hf_gpt2_tiny"), kRef + "hf_gpt2_tiny"},
                         {"hf_llama_tiny", read_hf_config(kRef + "hf_llama_tiny"), kRef + "hf_llama_tiny"}};
  for (const char* n : {"untied", "tied", "scaled"}) {
    const std::string f = kRef + "llama_reference_" + n + ".safetensors";
    c.push_back({std::string("llama_reference_") + n, llama_reference_spec(f), f});
  }
  return c;
}

std::vector<int32_t> test_tokens(const ModelSpec& spec, int64_t T) {
  std::vector<int32_t> t(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37 + 11) % spec.vocab);
  return t;
}

// The largest |a - b| over the largest |b|: the error relative to the logits' scale.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return std::isnan(worst) ? 1.0 : worst / scale;
}

}  // namespace

TEST_CASE("decoding with a KV cache gives the whole forward's logits at every position", "[decode]") {
  for (const Case& c : cases()) {
    INFO(c.name);
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    Model model(c.spec, *be, pool);
    if (c.weights.empty())
      model.init(7);
    else
      model.load(c.weights);
    const int64_t T = std::min<int64_t>(c.spec.seq, 24), V = c.spec.vocab;
    const std::vector<int32_t> tokens = test_tokens(c.spec, T), targets(tokens.size(), 0);
    std::vector<float> whole;
    model.forward_backward(Batch{tokens.data(), targets.data(), 1, T}, 1.f, &whole);
    REQUIRE(static_cast<int64_t>(whole.size()) == T * V);

    const auto units = family_of(c.spec).make_units(c.spec);
    REQUIRE(Decoder::supported(units));
    ModelHooks hooks(model, units);
    Decoder dec(units, c.spec, *be, pool);
    // Prompts of 1 and of 5 tokens (prefill), then one position at a time; again after a reset.
    std::vector<float> first;
    for (int64_t prompt : {int64_t{1}, int64_t{5}, int64_t{1}}) {
      INFO("prefill " << prompt);
      dec.reset();
      std::vector<float> decoded, logits;
      dec.forward(std::span<const int32_t>(tokens).first(static_cast<size_t>(prompt)), hooks, logits);
      decoded = logits;
      for (int64_t t = prompt; t < T; ++t) {
        dec.forward(std::span<const int32_t>(tokens).subspan(static_cast<size_t>(t), 1), hooks, logits);
        REQUIRE(static_cast<int64_t>(logits.size()) == V);
        decoded.insert(decoded.end(), logits.begin(), logits.end());
      }
      CHECK(dec.length() == T);
      // f32 products of other shapes (one row against T) sum in another order: a few ulps of the
      // logits' scale, far below what would change a token.
      const double err = relative_error(decoded, whole);
      CAPTURE(err);
      CHECK(err < 1e-5);  // measured: 1.6e-7 to 1.8e-6 over these cases (AVX-512)
      if (first.empty())
        first = decoded;
      else if (prompt == 1)
        CHECK(decoded == first);  // after reset(), the same computation: the same bits
    }
    // Past the model's positions the decoder refuses, naming the counts.
    std::vector<float> logits;
    if (T == c.spec.seq)
      CHECK_THROWS_WITH(dec.forward(std::span<const int32_t>(tokens).first(1), hooks, logits),
                        Catch::Contains("exceeds the model's"));
  }
}

TEST_CASE("generate draws the same tokens with and without the KV cache, past seq too", "[decode][sample]") {
  for (const char* preset : {"tiny", "llama-tiny"}) {
    for (const char* strategy : {"ddp", "zero3"}) {
      INFO(preset << " under " << strategy);
      TrainConfig cfg;
      cfg.spec = model_preset(preset);
      cfg.spec.seq = 16;  // 40 tokens slide the window past it
      cfg.strategy.kind = parse_strategy(strategy);
      cfg.steps = 1;
      cfg.batch = 1;
      auto be = make_cpu_backend(BackendConfig{1});
      Pool pool(*be);
      auto comm = make_sim_communicator(0, 1, pool);
      Trainer t(*be, pool, *comm, cfg, std::make_shared<TokenStream>(zero_stream(cfg.spec.seq + 1, "(none)")));
      for (float temperature : {0.f, 1.f}) {
        INFO("temperature " << temperature);
        SampleConfig sc;
        sc.tokens = 40;
        sc.temperature = temperature;
        sc.seed = 3;
        const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
        std::vector<int32_t> streamed;
        sc.kv_cache = true;
        const auto cached = t.generate(prompt, sc, [&](int32_t tok) { streamed.push_back(tok); });
        sc.kv_cache = false;
        const auto whole = t.generate(prompt, sc);
        CHECK(cached == whole);
        REQUIRE(cached.size() == prompt.size() + 40);
        CHECK(streamed == std::vector<int32_t>(cached.begin() + 5, cached.end()));  // each token, in order
      }
    }
  }
}
