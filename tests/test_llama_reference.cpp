// The Llama forward and backward against Hugging Face transformers' own LlamaForCausalLM
// (tests/reference/make_llama_reference.py, float64): untied, tied, and with Llama 3.1's RoPE
// scaling; RoPE's frequencies as HF computes them; and a few training steps lowering the loss, the
// same under every activation-checkpointing mode.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "src/comm/sim_comm.hpp"
#include "src/model/llama/llama.hpp"
#include "src/model/model.hpp"
#include "src/train/predict.hpp"
#include "src/train/trainer.hpp"
#include "tests/grad_check.hpp"

using namespace shardlab;

namespace {

std::string reference_path(const std::string& name) {
  return std::string(SHARDLAB_SOURCE_DIR) + "/tests/reference/llama_reference_" + name + ".safetensors";
}

std::vector<float> read_all(SafetensorsReader& r, const std::string& name) {
  std::vector<float> v(static_cast<size_t>(r.entry(name).numel()));
  r.read_f32(name, v);
  return v;
}

std::vector<int32_t> ints(const std::string& json) { return nlohmann::json::parse(json).get<std::vector<int32_t>>(); }

}  // namespace

TEST_CASE("Llama forward and backward match transformers' LlamaForCausalLM", "[model][reference][llama]") {
  const std::string name = GENERATE(as<std::string>{}, "untied", "tied", "scaled");
  INFO("case " << name);
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  SafetensorsReader ref(reference_path(name));
  // The spec from the config.json transformers wrote (its rope_parameters form).
  const ModelSpec spec = model_family("llama").spec_from_hf_config(nlohmann::json::parse(ref.metadata().at("hf_config")));
  CHECK(spec.tied_head == (name == "tied"));
  CHECK(spec.rope_scaling.enabled() == (name == "scaled"));
  CHECK(spec.num_kv_heads() * 2 == spec.heads);  // grouped: two query heads per K/V head

  // RoPE's inverse frequencies, computed on the host in f32, each rounding as transformers' own.
  const RopeFreqs freqs = llama_rope_freqs(spec);
  const std::vector<float> inv_freq = read_all(ref, "ref.inv_freq");
  REQUIRE(freqs.half == static_cast<int64_t>(inv_freq.size()));
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    INFO("inv_freq[" << i << "]");
    CHECK(freqs.inv_freq[i] == inv_freq[i]);  // bit for bit
  }

  Model model(spec, *be, pool);
  model.load(reference_path(name));  // HF's names, as they are; ref.* entries left alone
  const auto batch = nlohmann::json::parse(ref.metadata().at("batch"));
  const int64_t B = batch["B"], T = batch["T"];
  auto tokens = ints(ref.metadata().at("tokens")), targets = ints(ref.metadata().at("targets"));
  REQUIRE(static_cast<int64_t>(tokens.size()) == B * T);
  std::vector<float> logits;
  const float loss = model.forward_backward(Batch{tokens.data(), targets.data(), B, T}, 1.f, &logits);

  // Tolerances as GPT-2's reference test has them (f32 arithmetic against float64): logits 2e-5
  // absolute, each gradient tensor 1e-5 + 1e-4 x its largest |value|; the loss to 1e-6.
  const std::vector<float> ref_logits = read_all(ref, "ref.logits");
  REQUIRE(logits.size() == ref_logits.size());
  double max_logit_err = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    max_logit_err = std::max(max_logit_err, std::fabs(double(logits[i]) - ref_logits[i]));
  const double ref_loss = std::stod(ref.metadata().at("loss"));
  std::printf("llama reference %-6s: loss %.7f vs transformers %.7f (error %.2g); logits max abs error %.3g\n",
              name.c_str(), loss, ref_loss, std::fabs(loss - ref_loss), max_logit_err);
  CHECK(max_logit_err <= 2e-5);
  CHECK(std::fabs(loss - ref_loss) <= 1e-6);

  const test::GradCheck g = test::check_grads(model, ref, 1e-5, 1e-4);
  std::printf("llama reference %-6s: %d gradients, largest abs error %.3g, worst error/tolerance %.3f (%s)\n",
              name.c_str(), g.compared, g.worst_abs, g.worst, g.worst_name.c_str());
  // Every parameter of HF's model has its gradient here: 9 per layer, the embedding, the final norm, lm_head unless tied.
  CHECK(g.compared == 9 * spec.layers + 2 + (spec.tied_head ? 0 : 1));
  CHECK(g.failures == 0);
}

namespace {

TrainConfig llama_train_config(Checkpointing checkpointing) {
  TrainConfig cfg;
  cfg.spec = model_preset("llama-tiny");
  cfg.steps = 20;
  cfg.batch = 8;
  cfg.schedule.lr = 1e-2f;
  cfg.schedule.warmup_steps = 3;
  cfg.checkpointing = checkpointing;
  return cfg;
}

std::vector<float> train_losses(const TrainConfig& cfg) {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  auto comm = make_sim_communicator(0, 1, pool);
  Trainer t(*be, pool, *comm, cfg);
  std::vector<float> losses;
  for (int64_t s = 0; s < cfg.steps; ++s) losses.push_back(t.step(s).loss);
  return losses;
}

}  // namespace

TEST_CASE("the tiny Llama trains, the same under every activation-checkpointing mode", "[train][llama]") {
  const std::vector<float> plain = train_losses(llama_train_config(Checkpointing::none));
  std::printf("llama-tiny losses: first %.4f, last %.4f\n", plain.front(), plain.back());
  CHECK(plain.front() == Approx(std::log(256.0)).margin(0.3));  // a fresh model is near uniform
  CHECK(plain.back() < plain.front() - 1.0f);  // from ~5.55 to ~4.0
  // Recomputing the attention probabilities or whole layers gives the same numbers, bit for bit.
  CHECK(train_losses(llama_train_config(Checkpointing::attention)) == plain);
  CHECK(train_losses(llama_train_config(Checkpointing::blocks)) == plain);
}

TEST_CASE("a Llama step's memory, measured, equals the prediction (meta backend)", "[train][llama][estimator]") {
  for (Checkpointing c : {Checkpointing::none, Checkpointing::attention, Checkpointing::blocks}) {
    INFO("--activation-checkpointing " << checkpointing_name(c));
    TrainConfig cfg = llama_train_config(c);
    cfg.spec.tied_head = c == Checkpointing::attention;  // the tied head too
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    auto comm = make_sim_communicator(0, 1, pool);
    Trainer t(*be, pool, *comm, cfg);
    t.step(0);
    const Estimate m = t.measured_step();
    const Estimate e = predict_step(cfg, 1, 0, cfg.batch / cfg.accum, false);
    CHECK(m.peak == e.peak);
    CHECK(m.at_peak == e.at_peak);
    CHECK(m.peak_by_category == e.peak_by_category);
    CHECK(m.peak_phase == e.peak_phase);
    CHECK(m.peak > m.model_state_total());  // activations were live: the step ran
  }
}
