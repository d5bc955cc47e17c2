#include "src/comm/mpirun_guard.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "src/core/exit_code.hpp"

namespace shardlab {
namespace {

constexpr int kGraceS = 5;  // mpirun ends a job whose hosts it reaches well within this
constexpr int kPollMs = 100;

// The names Open MPI's launcher runs under (/proc/PID/comm).
bool is_mpirun(const std::string& comm) {
  return comm == "mpirun" || comm == "mpiexec" || comm == "orterun" || comm == "prterun";  // prterun: Open MPI 5
}

// From /proc/PID/stat: the state (field 3) and the start time in clock ticks (field 22), which
// identifies the process across a reuse of its pid. Async-signal-safe: the guard runs it after fork.
struct ProcStat {
  char state = 0;
  unsigned long long start = 0;
};

ProcStat read_stat(const char* path) {
  char buf[1024];
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return {};
  buf[n] = '\0';
  const char* p = buf + n;
  while (p > buf && *p != ')') --p;  // "pid (comm) state ...": comm may hold anything
  if (*p != ')' || p[1] != ' ') return {};
  ProcStat s;
  s.state = p[2];
  int field = 3;  // p + 2 is field 3
  for (p += 2; *p && field < 22; ++p)
    if (*p == ' ') ++field;
  for (; *p >= '0' && *p <= '9'; ++p) s.start = s.start * 10 + static_cast<unsigned long long>(*p - '0');
  return s;
}

// The guard: a process of its own (a session of its own, out of the rank's process group, which
// mpirun ends; no descriptor of the rank's, so mpirun sees the rank's output end with it). It
// waits for mpirun to end, and ends it after kGraceS. Only async-signal-safe calls.
[[noreturn]] void guard(pid_t mpirun, const std::string& stat_path, unsigned long long start) {
  ::setsid();
  const int null = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd < 3; ++fd) ::dup2(null, fd);
  if (::close_range(3, ~0U, 0) != 0)  // before Linux 5.9: one by one
    for (int fd = 3; fd < 1024; ++fd) ::close(fd);
  const timespec poll{0, kPollMs * 1'000'000L};
  for (int waited = 0; waited < kGraceS * 1000; waited += kPollMs) {
    const ProcStat s = read_stat(stat_path.c_str());
    if (s.start != start || s.state == 'Z' || s.state == 'X') ::_exit(0);  // mpirun ended
    ::nanosleep(&poll, nullptr);
  }
  ::kill(mpirun, SIGKILL);
  ::_exit(0);
}

}  // namespace

void guard_stuck_mpirun(const std::string& who) {
  const char* launcher = std::getenv(kLauncherStatusVar);
  if (launcher && *launcher) return;  // the --nproc launcher ends a stuck mpirun itself, keeping exit 5
  const pid_t parent = ::getppid();
  std::string comm;
  std::ifstream(fmt::format("/proc/{}/comm", parent)) >> comm;
  if (!is_mpirun(comm)) return;
  const std::string stat_path = fmt::format("/proc/{}/stat", parent);
  const unsigned long long start = read_stat(stat_path.c_str()).start;
  if (start == 0) return;
  // Said now, through mpirun with the report: a line the guard wrote to mpirun's output later
  // could be overwritten there (a script's shell reporting mpirun killed writes at its own offset).
  // Said only once the guard is there to keep it (the child writes nothing: its stdio is /dev/null).
  std::fflush(stderr);
  const pid_t g = ::fork();
  if (g == 0) guard(parent, stat_path, start);
  if (g < 0) return;
  std::fprintf(stderr,
               "%s: if %s (pid %d) has not ended the job %d s from now, waiting on a host it cannot reach, "
               "it is ended (SIGKILL: the job exits %d).\n",
               who.c_str(), comm.c_str(), static_cast<int>(parent), kGraceS, exit_status(ExitCode::mpirun_ended));
  std::fflush(stderr);
}

}  // namespace shardlab
