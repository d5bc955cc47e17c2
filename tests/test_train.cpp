#include <catch2/catch.hpp>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "src/comm/sim_comm.hpp"
#include "src/train/trainer.hpp"

using namespace shardlab;

TEST_CASE("training the tiny model on the embedded data lowers the loss", "[train]") {
  auto be = make_cpu_backend(BackendConfig{});
  Pool pool(*be);
  TrainConfig cfg;
  cfg.spec = model_preset("tiny");
  cfg.steps = 60;
  cfg.batch = 16;
  cfg.schedule.lr = 1e-2f;
  cfg.schedule.warmup_steps = 5;
  cfg.log_path = (std::filesystem::temp_directory_path() / "shardlab_test_train.jsonl").string();
  auto comm = make_sim_communicator(0, 1, pool);
  Trainer trainer(*be, pool, *comm, cfg);
  std::FILE* sink = std::fopen("/dev/null", "w");
  StepStats last = trainer.run(sink);
  std::fclose(sink);
  std::ifstream log(cfg.log_path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(log, line);) lines.push_back(nlohmann::json::parse(line));
  // The start record (what ran), then one line per step.
  REQUIRE(lines.size() == 61);
  CHECK(lines[0]["event"] == "start");
  CHECK(lines[0]["steps"] == 60);
  CHECK(lines[0]["batch"] == 16);
  CHECK(lines[0]["model"].get<std::string>().rfind("tiny", 0) == 0);
  lines.erase(lines.begin());
  for (const char* key : {"step", "loss", "lr", "ms", "tokens_per_s", "grad_norm", "peak_bytes"})
    CHECK(lines[0].contains(key));
  float first = lines[0]["loss"];
  CHECK(first == Approx(std::log(256.0)).margin(0.3));  // a fresh model is near uniform
  CHECK(last.loss < first - 2.0f);  // from ~5.5 to below 3.5
  CHECK(lines[59]["step"] == 60);
  std::filesystem::remove(cfg.log_path);
}

TEST_CASE("gradient accumulation gives the same step as one large batch", "[train]") {
  auto run = [](int64_t accum) {
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    TrainConfig cfg;
    cfg.spec = model_preset("tiny");
    cfg.steps = 3;
    cfg.batch = 4;
    cfg.accum = accum;
    auto comm = make_sim_communicator(0, 1, pool);
    Trainer t(*be, pool, *comm, cfg);
    std::vector<float> losses;
    for (int64_t s = 0; s < cfg.steps; ++s) losses.push_back(t.step(s).loss);
    return losses;
  };
  auto one = run(1), four = run(4);
  for (size_t i = 0; i < one.size(); ++i) CHECK(four[i] == Approx(one[i]).epsilon(1e-5));
}

TEST_CASE("bad training options are named", "[train]") {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  TrainConfig cfg;
  cfg.spec = model_preset("tiny");
  cfg.batch = 6;
  cfg.accum = 4;
  auto comm = make_sim_communicator(0, 1, pool);
  CHECK_THROWS_WITH(Trainer(*be, pool, *comm, cfg), Catch::Contains("--batch 6 is not divisible by 1 data-parallel ranks x --accum 4"));
  auto four = make_sim_communicator(0, 4, pool);
  cfg.accum = 1;
  CHECK_THROWS_WITH(Trainer(*be, pool, *four, cfg), Catch::Contains("--batch 6 is not divisible by 4 data-parallel ranks x --accum 1"));
  cfg.steps = 0;
  CHECK_THROWS_WITH(Trainer(*be, pool, *comm, cfg), Catch::Contains("--steps 0"));
  cfg.steps = 1;
  CHECK_THROWS_WITH(parse_strategy("zero4"), Catch::Contains("unknown strategy 'zero4'"));
  cfg.spec.heads = 3;
  CHECK_THROWS_WITH(Trainer(*be, pool, *comm, cfg), Catch::Contains("--dim 32 is not divisible by --heads 3"));
}

TEST_CASE("stop signals never land on a thread busy in oneDNN's sgemm", "[train][signals]") {
  // oneDNN's JIT sgemm keeps data below the stack pointer, past the 128 bytes a signal frame skips:
  // a handler run on top of it corrupted the heap (an abort within a few hundred signals here).
  // A second thread signals this process every 200 us while this one runs the head's products.
  BackendConfig bc{1};
  bc.cpu_gemm = "onednn";
  auto be = make_cpu_backend(bc);
  install_stop_signals();
  std::vector<float> a(256 * 64, 0.5f), b(64 * 32, 0.25f), c(256 * 32, 0.f);
  std::atomic<bool> done{false};
  std::atomic<int> sent{0};
  std::thread signaller([&] {
    while (!done) {
      ::kill(::getpid(), SIGTERM);
      ++sent;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  int64_t products = 0;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1500)) {
    GemmDesc dx;  // (64, 32) = (64, 256) x (256, 32)
    dx.m = 64, dx.n = 32, dx.k = 256, dx.lda = 256, dx.ldb = 32, dx.ldc = 32;
    be->gemm(dx, a.data(), c.data(), b.data());
    GemmDesc dw;  // (256, 32) += (64, 256)^T x (64, 32)
    dw.trans_a = Trans::T;
    dw.m = 256, dw.n = 32, dw.k = 64, dw.lda = 256, dw.ldb = 32, dw.ldc = 32, dw.beta = 1.f;
    be->gemm(dw, a.data(), b.data(), c.data());
    products += 2;
  }
  done = true;
  signaller.join();
  INFO(sent.load() << " signals during " << products << " products");
  CHECK(sent.load() > 100);
  CHECK(stop_signal() == SIGTERM);
  install_stop_signals();  // clears the flag
  CHECK(stop_signal() == 0);
}

TEST_CASE("a checkpoint in the older format (shardlab.checkpoint/1) resumes bit for bit", "[train][ckpt]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("shardlab_test_ckpt_v1_{}", ::getpid());
  fs::remove_all(dir);
  // With a save_dir: run() (a checkpoint at the end), nothing returned. Otherwise the losses of the
  // steps from where it starts (after a resume: the checkpoint's step).
  auto losses = [&](int64_t steps, const std::string& save_dir, const std::string& resume) {
    auto be = make_cpu_backend(BackendConfig{1});
    Pool pool(*be);
    TrainConfig cfg;
    cfg.spec = model_preset("tiny");
    cfg.steps = steps;
    cfg.batch = 4;
    cfg.schedule.kind = ScheduleKind::constant;  // a 2-step run has the 4-step run's learning rates
    cfg.save_dir = save_dir;
    cfg.resume = resume;
    auto comm = make_sim_communicator(0, 1, pool);
    Trainer t(*be, pool, *comm, cfg);
    std::vector<float> out;
    if (!save_dir.empty()) {
      std::FILE* sink = std::fopen("/dev/null", "w");
      t.run(sink);
      std::fclose(sink);
      return out;
    }
    for (int64_t s = t.start_step(); s < steps; ++s) out.push_back(t.step(s).loss);
    return out;
  };
  const std::vector<float> want = losses(4, "", "");
  losses(2, dir.string(), "");
  // Today's writer's pieces are all flat ranges: with format 1's name, the manifest is one that
  // the writer before slices wrote.
  const fs::path manifest = dir / "step_00000002" / "manifest.json";
  nlohmann::json m = nlohmann::json::parse(std::ifstream(manifest));
  CHECK(m["format"] == "shardlab.checkpoint/2");
  m["format"] = "shardlab.checkpoint/1";
  std::ofstream(manifest) << m.dump(1);
  const std::vector<float> resumed = losses(4, "", (dir / "step_00000002").string());
  REQUIRE(resumed.size() == 2);
  CHECK(resumed[0] == want[2]);
  CHECK(resumed[1] == want[3]);
  fs::remove_all(dir);
}
