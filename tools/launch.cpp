#include "tools/launch.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "src/comm/mpi_runtime.hpp"
#include "src/core/check.hpp"
#include "src/core/exit_code.hpp"
#include "src/core/host_name.hpp"

namespace shardlab {

bool under_mpi_launcher() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

int take_nproc(std::vector<std::string>& args) {
  int nproc = 0;
  for (size_t i = 0; i < args.size();) {
    std::string value;
    size_t drop = 0;
    if (args[i] == "--nproc") {
      SHARD_REQUIRE(i + 1 < args.size(), "--nproc needs a value (the number of ranks to start)");
      value = args[i + 1];
      drop = 2;
    } else if (args[i].rfind("--nproc=", 0) == 0) {
      value = args[i].substr(8);
      drop = 1;
    } else {
      ++i;
      continue;
    }
    int n = 0;
    auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    SHARD_REQUIRE(ec == std::errc() && p == value.data() + value.size() && n >= 1,
                  "--nproc '{}': expected a positive number of ranks", value);
    nproc = n;
    args.erase(args.begin() + static_cast<std::ptrdiff_t>(i), args.begin() + static_cast<std::ptrdiff_t>(i + drop));
  }
  return nproc;
}

std::vector<std::string> mpirun_command(int nproc, const std::string& exe, const std::vector<std::string>& args) {
  const char* env = std::getenv("SHARDLAB_MPIRUN");
  // Not --quiet: it would also hide Open MPI's report of a rank killed by a signal.
  // --stdin none: mpirun runs in a process group of its own (run_mpirun), where reading a terminal
  // would stop it; no command reads standard input.
  std::vector<std::string> cmd = {env && *env ? env : "mpirun", "-np", std::to_string(nproc), "--oversubscribe",
                                  "--bind-to", "none", "--stdin", "none"};
  if (geteuid() == 0) cmd.emplace_back("--allow-run-as-root");
  cmd.push_back(exe);
  cmd.insert(cmd.end(), args.begin(), args.end());
  return cmd;
}

namespace {

// ---- The launcher: mpirun as a child ------------------------------------------------------------
// The launcher runs mpirun as its child instead of becoming it, and exits with the job's status:
// - A rank that ends normally with a non-zero status (an input error every rank raised, exit 1)
//   leaves it in a file the launcher names ($SHARDLAB_LAUNCHER_STATUS, status_for_launcher) and
//   exits 0, so Open MPI prints no note about a process that "returned a non-zero exit code" (its
//   --quiet would hide that note, and with it the report of a rank killed by a signal, which stays).
//   A job mpirun ends (MPI_Abort, a rank killed) keeps mpirun's status and report.
// - Ctrl-C: Open MPI's mpirun answers SIGINT by ending the ranks (SIGTERM, SIGKILL a second later:
//   too soon for a checkpoint) and refuses to forward it (ess_base_forward_signals). So mpirun runs
//   in a process group of its own, a terminal's Ctrl-C reaches the launcher only, and the launcher
//   passes SIGINT on as SIGUSR2, which mpirun forwards to every rank and a rank takes as its Ctrl-C
//   (run.cpp: the first saves when there is a --save-dir, a second stops at once).
// - SIGTERM (timeout, systemd, Kubernetes): mpirun answers it as it answers SIGINT, and the job
//   exited 1 even when the ranks saved in time. The launcher passes it on as SIGUSR1, which mpirun
//   forwards and a rank takes as its SIGTERM (save after the step in progress, exit 0). SIGHUP,
//   SIGUSR1 and SIGUSR2 go to mpirun as they are, as when the launcher was mpirun.
volatile std::sig_atomic_t g_mpirun = 0;
// A SIGTERM or SIGINT that came before the ranks here could take its forwarded form (their early
// handlers in place: a rank without one dies of SIGUSR1, 138), held until they can.
volatile std::sig_atomic_t g_ranks_ready = 0, g_held = 0;
constexpr int kExitTimeoutStatus = exit_status(ExitCode::collective_timeout);

int forwarded(int sig) { return sig == SIGINT ? SIGUSR2 : sig == SIGTERM ? SIGUSR1 : sig; }

extern "C" void pass_on(int sig) {
  if ((sig == SIGTERM || sig == SIGINT) && !g_ranks_ready) {
    g_held = sig;  // wait_mpirun forwards it once every rank here is ready
    return;
  }
  if (g_mpirun > 0) ::kill(static_cast<pid_t>(g_mpirun), forwarded(sig));
}

constexpr int kPassedOn[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};

// The child: its own process group, ended with the launcher (SIGTERM makes mpirun end the ranks),
// default signal handling, then mpirun. An exec that fails reports errno through `report`.
[[noreturn]] void exec_mpirun(std::vector<std::string>& cmd, pid_t launcher, int report) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != launcher) ::_exit(127);  // the launcher is already gone
  for (int sig : kPassedOn) std::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  std::vector<char*> argv;
  for (auto& a : cmd) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  const int e = errno;
  if (::write(report, &e, sizeof e) < 0) {}
  ::_exit(127);
}

// The job's status: a rank's from the status file when mpirun ended normally, else mpirun's.
int job_status(int wait_status, const std::string& status_file) {
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  const int mpirun = WEXITSTATUS(wait_status);
  if (mpirun != 0) return mpirun;
  std::ifstream in(status_file);
  int rank_status = 0;
  return in >> rank_status ? rank_status : 0;
}

// A rank's last status in the launcher's file (0: none yet).
int reported_status(const std::string& status_file) {
  std::ifstream in(status_file);
  int s = 0, last = 0;
  while (in >> s) last = s;
  return last;
}

// mpirun's children (the ranks on this host, each in a process group of its own), by their parent
// in /proc.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string text;
    std::getline(stat, text);
    const size_t close = text.rfind(')');  // "pid (comm) state ppid ...": comm may hold anything
    long ppid = 0;
    char state = 0;
    if (close == std::string::npos || std::sscanf(text.c_str() + close + 1, " %c %ld", &state, &ppid) != 2) continue;
    if (ppid == parent) out.push_back(static_cast<pid_t>(std::atol(name.c_str())));
  }
  return out;
}

// Waits for mpirun. A rank ended by --collective-timeout (status 5 in the file) has ended the job,
// but mpirun waits for the daemons of every host, and one whose link is down never answers (Open
// MPI waits out TCP's retransmissions, a quarter of an hour): kKillAfterS after the report the
// launcher ends mpirun and the ranks it started here itself. The ranks on a host it cannot reach
// end on their own watchdog.
struct MpirunEnd {
  int wait_status = 0;
  bool ended_by_launcher = false;
};

// Whether every rank mpirun started on this host (its children running this binary: not yet a
// forked mpirun before its exec, nor an agent starting another host's daemon) has written its pid
// to the readiness file (its early stop handlers in place); none started yet is not ready.
bool ranks_here_ready(pid_t mpirun, const std::string& ready_file) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::vector<pid_t> ranks;
  for (pid_t c : children_of(mpirun))
    if (std::filesystem::read_symlink(fmt::format("/proc/{}/exe", c), ec) == self && !ec) ranks.push_back(c);
  if (ranks.empty()) return false;
  std::ifstream in(ready_file);
  std::vector<pid_t> ready;
  for (long pid = 0; in >> pid;) ready.push_back(static_cast<pid_t>(pid));
  return std::all_of(ranks.begin(), ranks.end(),
                     [&ready](pid_t r) { return std::find(ready.begin(), ready.end(), r) != ready.end(); });
}

MpirunEnd wait_mpirun(pid_t child, const std::string& status_file, const std::string& ready_file) {
  // A stop is held at most kHoldAtMostS: no rank of the job on this host (all on others, whose
  // readiness the launcher cannot see) forwards it then.
  constexpr double kKillAfterS = 2, kHoldAtMostS = 10;
  int wait_status = 0;
  auto reported = std::chrono::steady_clock::time_point::max();
  const auto started = std::chrono::steady_clock::now();
  for (;;) {
    const pid_t got = ::waitpid(child, &wait_status, WNOHANG);
    if (got == child || (got < 0 && errno != EINTR)) return {wait_status, false};
    const auto now = std::chrono::steady_clock::now();
    if (!g_ranks_ready && (ranks_here_ready(child, ready_file) || now - started > std::chrono::duration<double>(kHoldAtMostS)))
      g_ranks_ready = 1;
    if (g_ranks_ready && g_held) {
      const int sig = g_held;
      g_held = 0;
      ::kill(child, forwarded(sig));
    }
    if (reported == std::chrono::steady_clock::time_point::max()) {
      if (reported_status(status_file) == kExitTimeoutStatus) reported = now;
    } else if (now - reported > std::chrono::duration<double>(kKillAfterS)) {
      std::fprintf(stderr, "shardlab: mpirun did not end %.0f s after a rank's --collective-timeout report (a host "
                   "unreachable?); ending it. Ranks on hosts it cannot reach end on their own timeout.\n", kKillAfterS);
      const std::vector<pid_t> ranks = children_of(child);  // before mpirun goes and they are reparented
      ::kill(-child, SIGKILL);
      for (pid_t r : ranks) ::kill(r, SIGKILL);
      while (::waitpid(child, &wait_status, 0) < 0 && errno == EINTR) {}
      return {wait_status, true};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

[[noreturn]] void run_mpirun(std::vector<std::string> cmd, int nproc) {
  char status_file[] = "/tmp/shardlab-status-XXXXXX";
  const int fd = ::mkstemp(status_file);
  SHARD_REQUIRE(fd >= 0, "--nproc {}: cannot create the launcher's status file in /tmp: {}", nproc, std::strerror(errno));
  ::close(fd);
  ::setenv(kLauncherStatusVar, status_file, 1);
  ::setenv(kLauncherHostVar, host_name().c_str(), 1);
  char ready_file[] = "/tmp/shardlab-ready-XXXXXX";
  const int ready_fd = ::mkstemp(ready_file);
  SHARD_REQUIRE(ready_fd >= 0, "--nproc {}: cannot create the launcher's readiness file in /tmp: {}", nproc,
                std::strerror(errno));
  ::close(ready_fd);
  ::setenv(kLauncherReadyVar, ready_file, 1);
  int report[2];
  SHARD_REQUIRE(::pipe2(report, O_CLOEXEC) == 0, "--nproc {}: pipe: {}", nproc, std::strerror(errno));
  // The signals wait (blocked) until the child's pid is known to the handler.
  sigset_t passed, old;
  sigemptyset(&passed);
  for (int sig : kPassedOn) sigaddset(&passed, sig);
  ::sigprocmask(SIG_BLOCK, &passed, &old);
  const pid_t launcher = ::getpid();
  const pid_t child = ::fork();
  SHARD_REQUIRE(child >= 0, "--nproc {}: fork: {}", nproc, std::strerror(errno));
  if (child == 0) {
    ::close(report[0]);
    exec_mpirun(cmd, launcher, report[1]);
  }
  ::setpgid(child, child);  // as the child does: whichever runs first
  ::close(report[1]);
  g_mpirun = child;
  struct sigaction sa {};
  sa.sa_handler = pass_on;
  sigemptyset(&sa.sa_mask);
  for (int sig : kPassedOn) {
    struct sigaction was {};
    // A launcher started with a signal ignored (SIGINT in a script's background job) ignores it still.
    if (::sigaction(sig, nullptr, &was) == 0 && was.sa_handler == SIG_IGN) continue;
    ::sigaction(sig, &sa, nullptr);
  }
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  int exec_errno = 0;
  ssize_t got;
  do got = ::read(report[0], &exec_errno, sizeof exec_errno);
  while (got < 0 && errno == EINTR);
  ::close(report[0]);
  const MpirunEnd end = wait_mpirun(child, status_file, ready_file);
  const int status = got > 0                 ? -1
                     : end.ended_by_launcher ? kExitTimeoutStatus
                                             : job_status(end.wait_status, status_file);
  std::filesystem::remove(status_file);
  std::filesystem::remove(ready_file);
  if (status < 0)
    throw InputError(fmt::format("--nproc {}: could not start '{}': {} (is Open MPI installed? "
                                 "scripts/install-deps.sh installs it)", nproc, cmd[0], std::strerror(exec_errno)));
  std::exit(status);
}

}  // namespace

std::vector<std::string> launch_or_continue(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  int nproc = take_nproc(args);
  if (nproc == 0) return args;
  if (under_mpi_launcher()) {
    const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
    if (!size) size = std::getenv("PMI_SIZE");
    SHARD_REQUIRE(!size || std::atoi(size) == nproc, "--nproc {} given, but the launcher started {} ranks", nproc,
                  size ? size : "?");
    return args;
  }
  const std::string problem = file_size_limit_problem();
  SHARD_REQUIRE(problem.empty(), "{}", problem);
  std::error_code ec;
  std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) exe = argv[0];
  run_mpirun(mpirun_command(nproc, exe, args), nproc);
}

}  // namespace shardlab
