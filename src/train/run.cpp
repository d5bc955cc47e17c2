// run.cpp — Trainer::run: the loop around the steps and what it prints and writes (progress lines,
// the JSONL log, validation, samples, the final summary), and the stop signals that end it with a
// checkpoint. The step itself, evaluation and sampling are in trainer.cpp, checkpoints in saves.cpp.
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <thread>

#include "src/core/device_peaks.hpp"
#include "src/core/outputs.hpp"
#include "src/core/units.hpp"
#include "src/model/hf_dir.hpp"
#include "src/checkpoint/checkpoint.hpp"
#include "src/train/trainer.hpp"
#include "src/train/term_grace.hpp"

namespace shardlab {

namespace {

// What the run prints at its end: the loss from its first step to its last, and the throughput
// of every step but the first (which warms caches and allocators) when there are others.
struct RunSummary {
  StepStats first, last;
  double total_ms = 0, total_tokens = 0, total_flops = 0;
  int64_t timed_steps = 0;
  uint64_t peak = 0;
  float min_loss = INFINITY;
  std::optional<float> last_val;
  void add(const StepStats& s, bool first_step, bool timed, double tokens) {
    if (first_step) first = s;
    last = s;
    if (timed) total_ms += s.ms, total_tokens += tokens, total_flops += s.flops_per_s * s.ms / 1e3, ++timed_steps;
    peak = std::max(peak, s.peak_bytes);
    min_loss = std::min(min_loss, s.loss);
  }
};

// The progress line's running figures: the time since the run's first step began and the losses
// since the previous line (their mean sits beside the last step's, which is noisy at small batches).
struct Progress {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  int64_t steps_done = 0;  // in this process (a resumed run's ETA counts only what it timed)
  double loss_sum = 0;
  int64_t losses = 0;
  void add(float loss) { loss_sum += loss, ++losses, ++steps_done; }
  double elapsed_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

constexpr double kAnnouncedStepS = 5.0;  // a step predicted longer is announced before step 1

// "1:02:03", "2:03" or "45s".
std::string format_duration(double s) {
  const auto t = static_cast<long long>(s + 0.5);
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
  if (t >= 60) return fmt::format("{}:{:02}", t / 60, t % 60);
  return fmt::format("{}s", t);
}

// Model FLOP/s (6N + 6LCT per token) as a share of what the device can do: on a GPU as MFU against
// the H100's dense bf16 peak per GPU (device_peaks.hpp); on the CPU beside GFLOP/s of the whole
// job, as the share of the job's sgemm ceiling on this step's products (TrainConfig::sgemm_ceiling;
// 0 = unknown: GFLOP/s only).
struct FlopsShare {
  Device device;
  int world;
  double sgemm_ceiling;  // FLOP/s, the job's
  // The percentage, or nothing (the CPU without a ceiling). On CUDA: of the H100's dense bf16 peak,
  // which the H200 shares (989 TFLOP/s); other GPUs' MFU would need their own (device_peaks.hpp).
  std::optional<double> percent(double flops_per_s) const {
    if (device == Device::cuda) return 100.0 * flops_per_s / world / (kH100.dense_bf16_tflops * 1e12);
    if (sgemm_ceiling > 0) return 100.0 * flops_per_s / sgemm_ceiling;
    return std::nullopt;
  }
  const char* log_key() const { return device == Device::cuda ? "mfu_pct" : "sgemm_ceiling_pct"; }
  // Aligned for the progress lines; without padding in the summary.
  std::string format(double flops_per_s, bool aligned = true) const {
    const int w = aligned ? 6 : 0;
    if (device == Device::cuda) return fmt::format("MFU {:{}.1f}%", *percent(flops_per_s), aligned ? 4 : 0);
    if (sgemm_ceiling > 0)
      return fmt::format("{:{}.1f} GFLOP/s ({:.1f}% of sgemm)", flops_per_s / 1e9, w, *percent(flops_per_s));
    return fmt::format("{:{}.1f} GFLOP/s", flops_per_s / 1e9, w);
  }
};

// Prints the line and starts the next interval's loss mean.
void print_step(std::FILE* out, const StepStats& s, int64_t steps, int64_t start_step, Progress& p,
                const FlopsShare& share) {
  // The host tier's peak appears once anything lives there (--offload).
  const std::string host =
      s.host_peak_bytes ? " (host " + format_bytes(static_cast<double>(s.host_peak_bytes)) + ")" : std::string();
  std::string waits;
  for (const StepStats::AxisWait& w : s.axis_waits) waits += fmt::format(" ({} wait {:.1f} ms)", comm_axis_name(w.axis), w.ms);
  std::string moe;  // a mixture of experts: the auxiliary loss, the load (max / mean), drops past capacity
  if (s.aux_loss) {
    moe = fmt::format(" | aux {:.4f} | load {:.2f}", *s.aux_loss, s.expert_imbalance.value_or(1.0));
    if (s.worst_layer_imbalance) moe += fmt::format(" (worst layer {:.2f})", *s.worst_layer_imbalance);
    if (s.dropped_slots.value_or(0) > 0) moe += fmt::format(" dropped {:.0f}", *s.dropped_slots);
  }
  if (s.optimizer_ms) waits += fmt::format(" | muon {:.1f} ms", *s.optimizer_ms);
  const double elapsed = p.elapsed_s();
  const double eta = elapsed / static_cast<double>(p.steps_done) * static_cast<double>(steps - start_step - p.steps_done);
  std::fprintf(out,
               "step %5lld/%lld | loss %.4f (avg %.4f)%s | lr %.2e | norm %.3f | %7.1f ms | %8.0f tok/s | %s | peak %s%s "
               "| comm %s%s | %s, ETA %s\n",
               static_cast<long long>(s.step), static_cast<long long>(steps), s.loss, p.loss_sum / double(p.losses),
               moe.c_str(), s.lr,
               s.grad_norm, s.ms, s.tokens_per_s, share.format(s.flops_per_s).c_str(),
               format_bytes(static_cast<double>(s.peak_bytes)).c_str(), host.c_str(), format_bytes(s.comm_bytes).c_str(),
               waits.c_str(), format_duration(elapsed).c_str(), format_duration(eta).c_str());
  std::fflush(out);
  p.loss_sum = 0, p.losses = 0;
}

void print_val(std::FILE* out, const StepStats& s, int64_t steps, double ms, bool best) {
  std::fprintf(out, "step %5lld/%lld | val loss %.4f | %7.1f ms%s\n", static_cast<long long>(s.step),
               static_cast<long long>(steps), *s.val_loss, ms, best ? " | best" : "");
  std::fflush(out);
}

void log_step(std::ofstream& log, const StepStats& s, const FlopsShare& share) {
  nlohmann::json j = {{"step", s.step},         {"loss", s.loss}, {"lr", s.lr},
                      {"grad_norm", s.grad_norm}, {"ms", s.ms},     {"tokens_per_s", s.tokens_per_s},
                      {"peak_bytes", s.peak_bytes}, {"host_peak_bytes", s.host_peak_bytes},
                      {"comm_bytes", s.comm_bytes}, {"rss_bytes", s.rss_bytes},
                      {"flops_per_s", s.flops_per_s}, {"elapsed_s", s.elapsed_s}};
  if (s.val_loss) j["val_loss"] = *s.val_loss;
  for (const StepStats::AxisWait& w : s.axis_waits) j[fmt::format("{}_wait_ms", comm_axis_name(w.axis))] = w.ms;
  if (s.aux_loss)
    j["aux_loss"] = *s.aux_loss, j["expert_imbalance"] = s.expert_imbalance.value_or(1.0),
    j["dropped_slots"] = s.dropped_slots.value_or(0.0);
  if (s.worst_layer_imbalance) j["worst_layer_imbalance"] = *s.worst_layer_imbalance;
  if (s.optimizer_ms) j["optimizer_ms"] = *s.optimizer_ms;
  if (s.inter_node_bytes) j["intra_node_bytes"] = *s.intra_node_bytes, j["inter_node_bytes"] = *s.inter_node_bytes;
  if (const auto pct = share.percent(s.flops_per_s)) j[share.log_key()] = *pct;
  log << j.dump() << '\n';
  log.flush();  // a killed run keeps every finished step
}

}  // namespace

// After step `done`: if any rank was signalled, every rank saves (all agree on the step) and the
// run ends. Returns true when the run must stop.
bool Trainer::stop_requested(int64_t done, bool saved, std::FILE* out) {
  const int64_t sig = comm_.all_max(static_cast<int64_t>(stop_signal()));
  if (sig == 0) return false;
  term_grace_honoured();  // at the boundary: the save that honours it takes what it takes
  const char* name = sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : sig == SIGINT ? "SIGINT" : "a signal";
  if (sig == SIGINT) interrupted_ = true;
  SHARD_REQUIRE(!cfg_.save_dir.empty(),
                "received {} after step {}, but there is no --save-dir to save to: stopping without a checkpoint "
                "(pass --save-dir to make a preempted run resumable)", name, done);
  finish_pending_save(out);  // a save in flight completes first (the step's own, when it started one)
  if (!saved) save_checkpoint(cfg_.save_dir, checkpoint_state(), {done, done, checkpoint_val_loss_, {}, {}}, cfg_.save_keep);
  if (comm_.rank() == 0) {
    std::fprintf(out, "saved step %lld on %s\n", static_cast<long long>(done), name);
    if (!cfg_.save_path.empty())
      std::fprintf(out, "--save %s not written: the run stopped after step %lld of %lld (resume from the checkpoint "
                   "to finish it and write it)\n", cfg_.save_path.c_str(), static_cast<long long>(done),
                   static_cast<long long>(cfg_.steps));
    std::fflush(out);
  }
  return true;
}

// After step t: validate when due (filling s.val_loss); returns whether it is a new best.
bool Trainer::maybe_validate(int64_t t, StepStats& s, std::FILE* out) {
  checkpoint_val_loss_.reset();
  if (!val_loader_ || !cfg_.validates_after(t)) return false;
  auto v0 = std::chrono::steady_clock::now();
  s.val_loss = evaluate();
  checkpoint_val_loss_ = s.val_loss;
  const bool new_best = cfg_.save_best && *s.val_loss < best_val_loss_;
  if (new_best) best_val_loss_ = *s.val_loss;
  if (comm_.rank() == 0)
    print_val(out, s, cfg_.steps, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - v0).count(),
              new_best);
  return new_best;
}

// After step t: a sample from rank 0 when --sample-every says so (collective: every rank runs it).
void Trainer::maybe_sample(int64_t t, std::FILE* out) {
  if (cfg_.sample_every <= 0 || !((t + 1) % cfg_.sample_every == 0 || t + 1 == cfg_.steps)) return;
  SampleConfig c = cfg_.sample;
  c.seed = cfg_.seed;
  c.stream = static_cast<uint64_t>(t + 1);
  const auto prompt = encode_prompt(cfg_.sample_prompt, cfg_.spec.vocab, cfg_.tokenizer.get());
  const auto tokens = generate(prompt, c);
  if (comm_.rank() != 0) return;
  std::fprintf(out, "step %5lld/%lld | sample: %s\n", static_cast<long long>(t + 1), static_cast<long long>(cfg_.steps),
               decode_tokens(tokens, cfg_.spec.vocab, cfg_.tokenizer.get()).c_str());
  std::fflush(out);
}

// The group the strategy works over where it is not the whole world (pipeline stages, tensor or
// expert parallelism take the rest): " (sharded over 2)", " (data-parallel over 1)", or "".
std::string Trainer::strategy_group() const {
  const int world = comm_.world_size();
  if (zero_stage(cfg_.strategy.kind) == 0) {
    const int n = mesh_.size(CommAxis::dp_cp);
    return n == world ? "" : fmt::format(" (data-parallel over {})", n);
  }
  const int s = mesh_.size(CommAxis::dp_shard_cp), r = mesh_.size(CommAxis::dp_replicate);
  return s * r == world ? "" : fmt::format(" (sharded over {}{})", s, r > 1 ? fmt::format(", {} replicas", r) : "");
}

void Trainer::print_header(std::FILE* out) const {
  std::fprintf(out, "shardlab train: %s, %s on %d rank%s%s, %s, %s communicator\n", cfg_.spec.describe().c_str(),
               cfg_.label().c_str(), comm_.world_size(), comm_.world_size() == 1 ? "" : "s", strategy_group().c_str(),
               be_.describe().c_str(), comm_.name().c_str());
  std::fprintf(out, "  mesh: %s\n", mesh_.dims().describe().c_str());
  if (const MoeSpec& m = cfg_.spec.moe; m.sigmoid)
    fmt::print(out, "  moe: DeepSeek-V3's router balances with its correction bias, {}; no auxiliary loss (aux is the "
               "batch's balance statistic, k when uniform){}\n", m.bias_rate > 0 ? fmt::format("moved by {:g} x "
               "sign(mean load - load) after each step, the loads over the global batch (auxiliary-loss-free "
               "balancing, --moe-bias-update-rate)", m.bias_rate) : "here as loaded (--moe-bias-update-rate 0, as "
               "transformers trains)", cfg_.spec.mla.nextn > 0 ? fmt::format("; its {} multi-token prediction "
               "layer(s) (num_nextn_predict_layers) not built or trained, as transformers", cfg_.spec.mla.nextn) : "");
  else if (cfg_.spec.moe.enabled() && !cfg_.spec.moe.aux_loss)
    std::fprintf(out, "  moe: the load-balancing loss is logged, not in the objective (output_router_logits false, "
                 "as transformers trains this config; --moe-aux-loss on adds %g x it)\n", cfg_.spec.moe.aux_coef);
  if (!cfg_.options_origin.empty()) std::fprintf(out, "  options: %s\n", cfg_.options_origin.c_str());
  if (!cfg_.model_origin.empty()) std::fprintf(out, "  model: %s\n", cfg_.model_origin.c_str());
  if (!cfg_.sgemm_ceiling_note.empty()) std::fprintf(out, "  sgemm ceiling: %s\n", cfg_.sgemm_ceiling_note.c_str());
  if (!cfg_.links_note.empty()) std::fprintf(out, "  links: %s\n", cfg_.links_note.c_str());
  // A step long enough to look like a hang is announced: the model's FLOPs at the ceiling, a floor.
  // Without one (the step's products too costly to time), a small probe's rate.
  const double step_flops = flops_per_token_ * static_cast<double>(cfg_.batch * cfg_.spec.seq);
  const double rate = cfg_.sgemm_ceiling > 0 ? cfg_.sgemm_ceiling : cfg_.sgemm_probe;
  if (rate > 0 && step_flops / rate > kAnnouncedStepS)
    std::fprintf(out, "  step time: %s %s per step (%.3g TFLOP of model products at %s); the first progress line "
                 "comes after step 1\n", cfg_.sgemm_ceiling > 0 ? "at least" : "about",
                 format_duration(step_flops / rate).c_str(), step_flops / 1e12,
                 cfg_.sgemm_ceiling > 0 ? "the sgemm ceiling"
                                        : fmt::format("{:.1f} GFLOP/s, a small sgemm probe's rate: this step's own "
                                                      "products run faster or slower", rate / 1e9).c_str());
  if (const Backend::DeviceMemory m = be_.device_memory(); m.total)
    std::fprintf(out, "  device memory: %s total, %s free, %s outside the pool (CUDA context, cuBLAS, NCCL), budget %s\n",
                 format_bytes(double(m.total)).c_str(), format_bytes(double(m.free)).c_str(),
                 format_bytes(double(m.outside_pool())).c_str(), format_bytes(double(pool_.budget())).c_str());
  const int mapped = data_.train->mapped_parts();
  fmt::print(out, "  data {} ({} tokens{}, {} sequences of {}{}), global batch {}, {} steps, {} lr {:.2e}\n",
             data_.train->source, data_.train->size(),
             mapped == 0 ? "" : fmt::format(" mapped from {} file{}", mapped, mapped == 1 ? "" : "s"),
             loader_.num_sequences(), cfg_.spec.seq, cfg_.shuffle ? ", shuffled per epoch" : "", cfg_.batch,
             cfg_.steps, optimizer_name(cfg_.optim.kind), cfg_.schedule.lr);
  model_.print_pipeline(out);
  if (val_loader_)
    fmt::print(out, "  validation {}: {} batches of {} sequences ({} requested), every {}\n", data_.val->source,
               val_batches_, cfg_.batch, cfg_.val_batches,
               cfg_.val_every > 0 ? fmt::format("{} steps and at the end", cfg_.val_every) : "run's end");
  if (cfg_.checkpointing != Checkpointing::none || cfg_.strategy.offload != Offload::none) {
    const uint64_t dev = pool_.budget(), host = pool_.host().budget();
    std::fprintf(out, "  memory levers: activation checkpointing %s, offload %s; budgets: device %s, host %s\n",
                 checkpointing_name(cfg_.checkpointing), offload_name(cfg_.strategy.offload),
                 dev ? format_bytes(static_cast<double>(dev)).c_str() : "none",
                 host ? format_bytes(static_cast<double>(host)).c_str() : "none");
  }
  if (cfg_.strategy.kind == StrategyKind::zero3) {
    const ZeroPP& z = cfg_.strategy.zeropp;
    std::fprintf(out, "  zero3: prefetch %d unit%s%s\n", cfg_.strategy.prefetch, cfg_.strategy.prefetch == 1 ? "" : "s",
                 z.any() ? fmt::format("; ZeRO++ {} (block {}, {} ranks per node)", z.label(), z.block,
                                       cfg_.layout.ranks_per_node).c_str()
                         : "");
  }
  if (!run_id_.empty() || !resumed_from_.empty())  // no id: a prediction
    fmt::print(out, "  run {}{}\n", run_id_, resumed_from_.empty() ? " (new)" : fmt::format(": resumed from {} at step {}",
                                                                                           resumed_from_, start_step_));
  std::fflush(out);
}

namespace {

// --save-dir DIR: it exists (made here) and a file can be created in it.
void probe_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  SHARD_REQUIRE(!ec, "--save-dir '{}': cannot create it: {} (checked before the first step)", dir, ec.message());
  const std::string probe = (std::filesystem::path(dir) / fmt::format(".probe.{}", ::getpid())).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  SHARD_REQUIRE(fd >= 0, "--save-dir '{}': cannot write in it: {} (checked before the first step)", dir,
                std::strerror(errno));
  ::close(fd);
  std::filesystem::remove(probe, ec);
}

}  // namespace

// Before the first step, rank 0 (which writes them) makes sure the log, the final weights and the
// checkpoints can be written, so a mistake costs no training; every rank stops with its message.
// A resumed run's log keeps the earlier steps: it is appended to, after a line marking the resume.
void Trainer::open_outputs(std::ofstream& log) {
  if (cfg_.log_path.empty() && cfg_.save_path.empty() && cfg_.save_dir.empty() && cfg_.report_outputs.empty()) return;
  std::string error;
  if (comm_.rank() == 0) {
    try {
      if (!cfg_.save_dir.empty()) {
        probe_dir(cfg_.save_dir);
        save_lock_ = std::make_unique<SaveDirLock>(cfg_.save_dir, "--save-dir");  // one run per directory
        require_own_save_dir(cfg_.save_dir, run_id_, resumed_from_);  // and its checkpoints this run's
      }
      if (!cfg_.save_path.empty()) {
        if (is_safetensors_path(cfg_.save_path)) {
          probe_output_file(cfg_.save_path, "--save", "before the first step");
          check_safetensors_out(cfg_.save_path, cfg_.save_overwrite);
        } else {  // an HF model directory
          try {
            check_hf_export_dir(cfg_.save_path, cfg_.save_overwrite);
          } catch (const InputError& e) {
            throw InputError(fmt::format("--save '{}': {} (checked before the first step)", cfg_.save_path, e.what()));
          }
        }
      }
      // One live writer per output file, taken before anything is truncated.
      // Regular files only: /dev/null or a pipe has no writer to protect, nor a directory to lock in.
      const auto lockable = [](const std::string& path) {
        std::error_code ec;
        const auto st = std::filesystem::status(path, ec);
        return !path.empty() && (!std::filesystem::exists(st) || std::filesystem::is_regular_file(st));
      };
      for (const auto& [flag, path] : cfg_.report_outputs)
        if (lockable(path)) output_locks_.push_back(std::make_unique<OutputLock>(path, flag.c_str()));
      if (!cfg_.log_path.empty()) {
        if (lockable(cfg_.log_path)) output_locks_.push_back(std::make_unique<OutputLock>(cfg_.log_path, "--log"));
        const bool resumed = !resumed_from_.empty();
        log.open(cfg_.log_path, resumed ? std::ios::app : std::ios::trunc);
        SHARD_REQUIRE(log.good(), "--log '{}': cannot write it: {} (checked before the first step)", cfg_.log_path,
                      std::strerror(errno));
        log << log_header() << '\n';  // what ran, so a report can say it (a resume appends another)
        log.flush();
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  for (const std::string& e : comm_.all_gather_strings(error))
    if (!e.empty()) throw InputError(e);
}

StepStats Trainer::run(std::FILE* out) {
  const bool root = comm_.rank() == 0;
  std::ofstream log;
  if (start_step_ >= cfg_.steps) {
    if (root) std::fprintf(out, "nothing to do: the checkpoint is at step %lld of %lld\n",
                           static_cast<long long>(start_step_), static_cast<long long>(cfg_.steps));
    return {};
  }
  open_outputs(log);
  if (root) print_header(out);
  arm_term_grace(cfg_.term_grace_s, cfg_.save_dir, cfg_.steps);  // before the handlers: none unarmed
  install_stop_signals(!cfg_.save_dir.empty());
  if (cfg_.save_async) {
    const auto t0 = std::chrono::steady_clock::now();
    save_buffer_ = AsyncCheckpoint::make_buffer(checkpoint_state());
    if (root)
      std::fprintf(out, "  save-async: a host buffer of %s for rank 0's checkpoints, made in %.2f s\n",
                   format_bytes(static_cast<double>(save_buffer_.capacity() * sizeof(float))).c_str(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  RunSummary sum;
  Progress progress;
  const FlopsShare share{be_.device(), comm_.world_size(), cfg_.sgemm_ceiling};
  for (int64_t t = start_step_; t < cfg_.steps; ++t) {
    StepStats s = step(t);
    progress.add(s.loss);
    s.elapsed_s = progress.elapsed_s();
    sum.add(s, t == start_step_, t > start_step_ || cfg_.steps == start_step_ + 1,
            static_cast<double>(cfg_.batch * cfg_.spec.seq));
    if (root && (s.step % cfg_.print_every == 0 || s.step == cfg_.steps || s.step == 1))
      print_step(out, s, cfg_.steps, start_step_, progress, share);
    const bool new_best = maybe_validate(t, s, out);
    if (s.val_loss) sum.last_val = s.val_loss;
    if (log.is_open()) log_step(log, s, share);
    if (cfg_.record_step) history_.push_back(s);  // only for the reports: a long run's memory stays flat
    maybe_sample(t, out);
    if (cfg_.check_links && cfg_.check_links_every > 0 && (t + 1) % cfg_.check_links_every == 0) {
      const std::string links = cfg_.check_links();  // rank 0's
      if (root) std::fprintf(out, "step %5lld/%lld | links: %s\n", static_cast<long long>(t + 1),
                             static_cast<long long>(cfg_.steps), links.c_str());
      if (log.is_open()) log << nlohmann::json{{"event", "links"}, {"step", t + 1}, {"links", links}}.dump() << '\n';
    }
    const bool save_now = maybe_checkpoint(t, new_best, out);
    // A stop asked during the last step: the run is complete, so it ends as one does (its final
    // checkpoint and --save written), not as a preempted run.
    if (t + 1 == cfg_.steps) {
      term_grace_honoured();  // the run ends as one does, whatever its saves take
      if (comm_.all_max(static_cast<int64_t>(stop_signal())) != 0 && root)
        std::fprintf(out, "a stop was asked during the last step: finishing the run (its checkpoint and --save)\n");
      break;
    }
    if (stop_requested(t + 1, save_now, out)) return s;
  }
  term_grace_honoured();  // the run is ending as one does, whatever its last saves take
  finish_pending_save(out);
  // A resumed run says how many steps it ran itself and where the whole run stands.
  const std::string resumed = start_step_ > 0 ? fmt::format(" in this process ({} in total, resumed after step {})",
                                                            cfg_.steps, start_step_) : "";
  if (root)
    std::fprintf(out, "done: %lld steps%s, loss %.4f -> %.4f (min %.4f), %.1f ms/step, %.0f tok/s, %s, peak %s on rank 0\n",
                 static_cast<long long>(cfg_.steps - start_step_), resumed.c_str(), sum.first.loss, sum.last.loss, sum.min_loss,
                 sum.total_ms / static_cast<double>(sum.timed_steps), sum.total_tokens / (sum.total_ms / 1e3),
                 share.format(sum.total_flops / (sum.total_ms / 1e3), false).c_str(), format_bytes(static_cast<double>(sum.peak)).c_str());
  if (root && sum.last_val) std::fprintf(out, "validation loss at the end: %.4f\n", *sum.last_val);
  if (root && skipped_steps_ > 0)
    std::fprintf(out, "skipped %lld step(s) with a non-finite loss or gradient norm (--skip-nonfinite)\n",
                 static_cast<long long>(skipped_steps_));
  if (!cfg_.save_path.empty()) save_final(out);
  StepStats last = sum.last;
  last.val_loss = sum.last_val;  // the validation after the last step (it comes after sum.add)
  return last;
}

}  // namespace shardlab
