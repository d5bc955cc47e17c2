#include "src/train/trainer.hpp"

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "src/core/units.hpp"

namespace shardlab {

void TrainConfig::validate() const {
  spec.validate();
  SHARD_REQUIRE(steps >= 1, "--steps {}: expected at least one step", steps);
  SHARD_REQUIRE(batch >= 1, "--batch {}: expected at least one sequence", batch);
  SHARD_REQUIRE(accum >= 1 && batch % accum == 0, "--batch {} is not divisible by --accum {}", batch, accum);
  SHARD_REQUIRE(grad_clip >= 0.f, "--grad-clip {}: expected 0 (off) or a positive norm", grad_clip);
  SHARD_REQUIRE(print_every >= 1, "--print-every {}: expected a positive count", print_every);
  optim.validate();
  schedule.validate();
}

namespace {
TrainConfig checked(TrainConfig cfg) {
  cfg.validate();
  cfg.schedule.total_steps = cfg.steps;
  return cfg;
}
}  // namespace

Trainer::Trainer(Backend& be, Pool& pool, TrainConfig cfg)
    : be_(be),
      pool_(pool),
      cfg_(checked(std::move(cfg))),
      stream_(load_tokens(cfg_.data, cfg_.spec.vocab)),
      loader_(stream_, cfg_.spec.seq, cfg_.batch),
      model_(cfg_.spec, be, pool),
      optim_(pool, cfg_.optim) {
  if (cfg_.init.empty()) model_.init(cfg_.seed);
  else model_.load(cfg_.init);
  for (size_t u = 0; u < model_.num_units(); ++u) {
    const UnitLayout& l = model_.unit(u).layout();
    optim_.add(model_.unit_params(u), model_.unit_grads(u), unit_segments(l, 0, l.numel), l.name);
  }
  int64_t micro = cfg_.batch / cfg_.accum;
  inputs_.resize(static_cast<size_t>(micro * cfg_.spec.seq));
  targets_.resize(inputs_.size());
}

StepStats Trainer::step(int64_t t) {
  auto t0 = std::chrono::steady_clock::now();
  const int64_t T = cfg_.spec.seq, micro = cfg_.batch / cfg_.accum;
  pool_.ledger().reset_peaks();
  model_.zero_grads();
  float loss = 0.f;
  for (int64_t k = 0; k < cfg_.accum; ++k) {
    loader_.fill(t, k * micro, micro, inputs_.data(), targets_.data());
    Batch b{inputs_.data(), targets_.data(), micro, T};
    loss += model_.forward_backward(b, 1.f / static_cast<float>(cfg_.accum)) / static_cast<float>(cfg_.accum);
  }
  // Global gradient norm over every unit, accumulated on the device, read once.
  Block norm_block = pool_.alloc(DType::f32, 1, Category::workspace, "grad norm");
  Tensor norm_t = norm_block.flat(DType::f32);
  for (size_t u = 0; u < model_.num_units(); ++u) be_.sum_squares(model_.unit_grads(u), norm_t, u > 0);
  float sumsq = 0.f;
  be_.copy(Tensor::flat(&sumsq, DType::f32, 1), norm_t);
  float norm = std::sqrt(sumsq);
  float lr = cfg_.schedule.at(t);
  pool_.ledger().set_phase("optimizer step");
  optim_.step(t + 1, lr, clip_factor(norm, cfg_.grad_clip));
  pool_.ledger().set_phase("");
  be_.synchronize();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  StepStats s;
  s.step = t + 1;
  s.loss = loss;
  s.lr = lr;
  s.grad_norm = norm;
  s.ms = ms;
  s.tokens_per_s = static_cast<double>(cfg_.batch * T) / (ms / 1e3);
  s.peak_bytes = pool_.ledger().peak_total();
  return s;
}

StepStats Trainer::run(std::FILE* out) {
  std::ofstream log;
  if (!cfg_.log_path.empty()) {
    log.open(cfg_.log_path, std::ios::trunc);
    SHARD_REQUIRE(log.good(), "cannot write --log file '{}'", cfg_.log_path);
  }
  std::fprintf(out, "shardlab train: %s on %s\n", cfg_.spec.describe().c_str(), be_.describe().c_str());
  std::fprintf(out, "  data %s (%zu tokens, %lld sequences of %lld), batch %lld x %lld tokens, %lld steps, %s lr %.2e\n",
               stream_.source.c_str(), stream_.tokens.size(), static_cast<long long>(loader_.num_sequences()),
               static_cast<long long>(cfg_.spec.seq), static_cast<long long>(cfg_.batch),
               static_cast<long long>(cfg_.spec.seq), static_cast<long long>(cfg_.steps), cfg_.optim.kind.c_str(),
               cfg_.schedule.lr);
  std::fflush(out);
  StepStats s, first;
  double total_ms = 0, total_tokens = 0;
  int64_t timed = 0;
  uint64_t peak = 0;
  float min_loss = INFINITY;
  for (int64_t t = 0; t < cfg_.steps; ++t) {
    s = step(t);
    if (t == 0) first = s;
    // The first step warms caches and allocators; throughput excludes it when there are others.
    if (t > 0 || cfg_.steps == 1) {
      total_ms += s.ms;
      total_tokens += static_cast<double>(cfg_.batch * cfg_.spec.seq);
      ++timed;
    }
    peak = std::max(peak, s.peak_bytes);
    min_loss = std::min(min_loss, s.loss);
    if (s.step % cfg_.print_every == 0 || s.step == cfg_.steps || s.step == 1) {
      std::fprintf(out, "step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %8.0f tok/s | peak %s\n",
                   static_cast<long long>(s.step), static_cast<long long>(cfg_.steps), s.loss, s.lr, s.grad_norm,
                   s.ms, s.tokens_per_s, format_bytes(static_cast<double>(s.peak_bytes)).c_str());
      std::fflush(out);
    }
    if (log.is_open()) {
      nlohmann::json j = {{"step", s.step},       {"loss", s.loss},         {"lr", s.lr},
                          {"grad_norm", s.grad_norm}, {"ms", s.ms},         {"tokens_per_s", s.tokens_per_s},
                          {"peak_bytes", s.peak_bytes}};
      log << j.dump() << '\n';
      log.flush();  // a killed run keeps every finished step
    }
  }
  std::fprintf(out, "done: %lld steps, loss %.4f -> %.4f (min %.4f), %.1f ms/step, %.0f tok/s, peak %s per rank\n",
               static_cast<long long>(cfg_.steps), first.loss, s.loss, min_loss, total_ms / static_cast<double>(timed),
               total_tokens / (total_ms / 1e3), format_bytes(static_cast<double>(peak)).c_str());
  if (!cfg_.save_path.empty()) {
    model_.save(cfg_.save_path);
    std::fprintf(out, "saved %s\n", cfg_.save_path.c_str());
  }
  return s;
}

}  // namespace shardlab
