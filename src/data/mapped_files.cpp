// mapped_files.cpp — mapped_files.hpp. The handler uses only async-signal-safe calls (write, _exit,
// signal, raise) over a fixed table filled before the reads.
#include "src/data/mapped_files.hpp"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>

namespace shardlab {
namespace {

struct Watched {
  std::atomic<const char*> base{nullptr};
  size_t length = 0;
  char path[512] = {};
};
std::array<Watched, 1024> g_watched;
std::mutex g_mutex;  // registration only (the handler reads)
struct sigaction g_previous {};  // the handler before ours: a SIGBUS outside the token files goes to it

void put(const char* s) {
  const size_t n = std::strlen(s);
  for (size_t done = 0; done < n;) {
    const ssize_t w = write(STDERR_FILENO, s + done, n - done);
    if (w <= 0) return;
    done += static_cast<size_t>(w);
  }
}

void put_number(unsigned long long v) {
  char buf[24];
  int i = sizeof(buf) - 1;
  buf[i] = '\0';
  do {
    buf[--i] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0 && i > 0);
  put(buf + i);
}

void on_sigbus(int sig, siginfo_t* info, void*) {
  const char* at = static_cast<const char*>(info->si_addr);
  for (const Watched& w : g_watched) {
    const char* base = w.base.load(std::memory_order_acquire);
    if (base == nullptr || at < base || at >= base + w.length) continue;
    put("shardlab: error: token file '");
    put(w.path);
    put("' changed under the run: it held ");
    put_number(w.length);
    put(" bytes when mapped, and reading byte ");
    put_number(static_cast<unsigned long long>(at - base));
    put(" failed (truncated or rewritten since); leave data files unchanged while a run reads them, then resume "
        "from the last checkpoint\n");
    _exit(1);
  }
  // Not a token file's: the handler that was there before (Open MPI's backtrace, a sanitizer's), else
  // the default (a crash with its core).
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction != nullptr) return g_previous.sa_sigaction(sig, info, nullptr);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler != nullptr) {
    return g_previous.sa_handler(sig);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_once() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_previous);
    return true;
  }();
  (void)installed;
}

}  // namespace

void watch_mapping(const std::string& path, const void* base, size_t length) {
  install_once();
  std::lock_guard<std::mutex> lock(g_mutex);
  for (Watched& w : g_watched) {
    if (w.base.load(std::memory_order_relaxed) != nullptr) continue;
    w.length = length;
    std::strncpy(w.path, path.c_str(), sizeof(w.path) - 1);
    w.path[sizeof(w.path) - 1] = '\0';
    w.base.store(static_cast<const char*>(base), std::memory_order_release);
    return;
  }
  // More mapped files than the table holds: the rest are read unwatched (a change crashes as before).
}

void unwatch_mapping(const void* base) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (Watched& w : g_watched)
    if (w.base.load(std::memory_order_relaxed) == base) w.base.store(nullptr, std::memory_order_release);
}

}  // namespace shardlab
