// term_grace.cpp — the grace's thread (term_grace.hpp): it polls a few times a second whether a stop
// has waited past the grace, and ends the process then.
#include "src/train/term_grace.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <thread>

#include "src/core/exit_code.hpp"

namespace shardlab {
namespace {

std::atomic<int64_t> g_signalled_ns{0};  // steady-clock time of the first stop, 0 = none
std::atomic<int> g_signal{0};
std::atomic<bool> g_honoured{false};
std::atomic<long long> g_step{0}, g_steps{0};
std::atomic<double> g_grace_s{0};
std::mutex g_dir_mutex;
std::string g_save_dir;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void give_up(double waited) {
  const int sig = g_signal.load();
  const char* name = sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : sig == SIGINT ? "SIGINT" : "a signal";
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(g_dir_mutex);
    dir = g_save_dir;
  }
  const std::string kept = dir.empty() ? "no --save-dir: nothing was saved"
                                       : fmt::format("the newest complete checkpoint under {} is intact (resume with "
                                                     "--resume auto)", dir);
  std::fprintf(stderr,
               "shardlab: %s %.0f s ago, and step %lld of %lld has not ended within --term-grace %g s: exiting now "
               "(exit 143) without saving this step; %s\n",
               name, waited, g_step.load(), g_steps.load(), g_grace_s.load(), kept.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  tell_launcher(exit_status(ExitCode::terminated));
  _exit(exit_status(ExitCode::terminated));
}

}  // namespace

void arm_term_grace(double seconds, const std::string& save_dir, long long steps) {
  g_grace_s = seconds;
  g_steps = steps;
  g_honoured = false;
  g_signalled_ns = 0;  // a run in the same process as an earlier one (tests) starts unsignalled
  g_signal = 0;
  {
    std::lock_guard<std::mutex> lock(g_dir_mutex);
    g_save_dir = save_dir;
  }
  static std::once_flag started;
  std::call_once(started, [] {
    std::thread([] {
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const int64_t at = g_signalled_ns.load();
        const double grace = g_grace_s.load();
        if (at == 0 || grace <= 0 || g_honoured.load()) continue;
        const double waited = static_cast<double>(now_ns() - at) * 1e-9;
        if (waited > grace) give_up(waited);
      }
    }).detach();
  });
}

void term_grace_signalled(int sig) {
  int64_t none = 0;
  if (g_signalled_ns.compare_exchange_strong(none, now_ns())) g_signal = sig;
}

void term_grace_honoured() { g_honoured = true; }

void term_grace_step(long long step) { g_step = step; }

}  // namespace shardlab
