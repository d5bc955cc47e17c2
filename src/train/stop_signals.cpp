// stop_signals.cpp — the stop signals a run acts on between steps (trainer.hpp's
// install_stop_signals, stop_signal): SIGTERM, SIGUSR1, Ctrl-C, and the launcher's SIGUSR2.
#include <pthread.h>
#include <unistd.h>

#include <csignal>
#include <mutex>
#include <thread>

#include "src/backend/backend.hpp"
#include "src/train/term_grace.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {
namespace {

// Preemption: the handler only records the signal; the run loop acts on it between steps.
volatile std::sig_atomic_t g_stop_signal = 0;
// Ctrl-C: the first SIGINT saves and stops like SIGTERM when there is somewhere to save; without a
// --save-dir, or at the second one, the process ends at once with 130 (128 + SIGINT, the shell's
// code for an interrupted program), as an untrained user expects of Ctrl-C.
volatile std::sig_atomic_t g_sigint_saves = 0;
volatile std::sig_atomic_t g_sigints = 0;

void take_signal(int sig) {
  if (sig == SIGUSR2) sig = SIGINT;  // Ctrl-C at the --nproc launcher, passed on (tools/launch.cpp)
  if (sig == SIGINT) {
    g_sigints = g_sigints + 1;
    if (!g_sigint_saves || g_sigints > 1) {
      static const char msg[] = "shardlab: interrupted (SIGINT): stopping now, without a checkpoint\n";
      if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0) {}
      _exit(130);
    }
    static const char msg[] = "shardlab: SIGINT: saving a checkpoint after this step (Ctrl-C again stops at once)\n";
    if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0) {}
  }
  g_stop_signal = sig;
  term_grace_signalled(sig);
}
extern "C" void on_stop_signal(int sig) { take_signal(sig); }

}  // namespace

// Installs the handlers when a run starts and keeps them for the rest of the process: a second
// signal during the save, the reports or the shutdown is recorded and changes nothing. SA_RESTART:
// a system call the signal interrupts (a checkpoint write) resumes instead of failing. SIGXFSZ is
// ignored, so a write past `ulimit -f` (log, checkpoint) is an error naming the file.
//
// No thread that computes ever runs the handler: oneDNN's JIT sgemm keeps data below the stack
// pointer, past the 128 bytes a signal frame leaves alone, and a handler run on top of it corrupted
// the heap (one SIGTERM in a few dozen, in the fault tests; every time in a loop of sgemm calls
// signalled every 5 ms). So the two signals are blocked in this thread, in the threads it starts
// from now on and in the OpenMP workers, and one thread of their own waits for them. Threads that
// existed before (MPI's) may still take one; they run no GEMM, and the handler only sets a flag.
void install_stop_signals(bool sigint_saves) {
  g_stop_signal = 0;
  g_sigints = 0;
  g_sigint_saves = sigint_saves;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGUSR2, &sa, nullptr);
  // A process started with SIGINT ignored (a background job of a script, nohup-like wrappers) was
  // meant not to stop on Ctrl-C: it keeps ignoring it.
  static const bool sigint_ignored = [] {
    struct sigaction old {};
    return sigaction(SIGINT, nullptr, &old) == 0 && old.sa_handler == SIG_IGN;
  }();
  if (!sigint_ignored) sigaction(SIGINT, &sa, nullptr);
  std::signal(SIGXFSZ, SIG_IGN);
  static std::once_flag waiter;
  std::call_once(waiter, [] {
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGUSR1);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGUSR2);
    on_every_cpu_thread([&stop] { pthread_sigmask(SIG_BLOCK, &stop, nullptr); });
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // this thread, had it no part in the pool
    std::thread([stop] {
      for (;;) {
        int sig = 0;
        if (sigwait(&stop, &sig) == 0) take_signal(sig);
      }
    }).detach();
  });
}

int stop_signal() { return g_stop_signal; }

}  // namespace shardlab
