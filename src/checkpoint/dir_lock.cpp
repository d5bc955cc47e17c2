#include "src/checkpoint/dir_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <ctime>
#include <random>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "src/checkpoint/checkpoint_format.hpp"
#include "src/core/check.hpp"
#include "src/core/host_name.hpp"

namespace shardlab {
namespace {

// This process's command line, arguments separated by spaces (/proc/self/cmdline).
std::string command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (char& c : all)
    if (c == '\0') c = ' ';
  while (!all.empty() && all.back() == ' ') all.pop_back();
  return all;
}

// The time now in UTC, as strftime's `format` writes it.
std::string now_utc(const char* format = "%Y-%m-%d %H:%M:%S UTC") {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), format, &tm);
  return buf;
}

}  // namespace

std::string new_run_id() { return fmt::format("{}-{:06x}", now_utc("%Y%m%d-%H%M%S"), std::random_device{}() & 0xffffff); }

void validate_run_id(const std::string& id) {
  const bool ok = !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
  SHARD_REQUIRE(ok, "--run-id '{}': expected 1 to 64 letters, digits, '.', '_' or '-'", id);
}

void require_own_save_dir(const std::string& dir, const std::string& run_id, const std::string& resumed_from) {
  const std::string newest = latest_checkpoint(dir);
  if (newest.empty()) return;
  std::error_code ec;
  if (!resumed_from.empty() && std::filesystem::equivalent(newest, resumed_from, ec)) return;
  const std::string owner = read_manifest(newest).run_id;
  if (!resumed_from.empty() && owner == run_id) return;
  const std::string whose = owner.empty() ? "a run that recorded no id" : fmt::format("run '{}'", owner);
  SHARD_REQUIRE(!resumed_from.empty(), "--save-dir '{}' holds checkpoints of {} (the newest: '{}'), and this is a fresh "
                "run ('{}'): its checkpoints would sit beside those, and --resume auto would take the newest of either "
                "run. Continue that run with --resume auto, or give this one another --save-dir (checked before the "
                "first step)", dir, whose, newest, run_id);
  throw InputError(fmt::format("--save-dir '{}' holds checkpoints of {} (the newest: '{}'); this run is '{}', resumed "
                               "from '{}': give it another --save-dir, or resume the newest there (--resume auto) "
                               "(checked before the first step)", dir, whose, newest, run_id, resumed_from));
}

RunLock::RunLock(const std::string& path, const char* flag, const std::string& dir, const char* why) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  SHARD_REQUIRE(fd_ >= 0, "{} '{}': cannot open its lock file '{}': {} (checked before the first step)", flag, dir,
                path, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder;
    char buf[4096];
    const ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
    if (n > 0) holder.assign(buf, static_cast<size_t>(n));
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    SHARD_REQUIRE(err != EWOULDBLOCK, "{} '{}' is in use by another run ({}): {}; give this run another {}, or wait "
                  "for that one to end (checked before the first step)", flag, dir,
                  holder.empty() ? "its lock file names no holder" : holder, why, flag);
    throw InputError(fmt::format("{} '{}': cannot lock '{}': {} (checked before the first step)", flag, dir, path,
                                 std::strerror(err)));
  }
  std::ostringstream who;
  who << "pid " << ::getpid() << " on host " << host_name() << " since " << now_utc() << ": " << command_line();
  const std::string text = who.str() + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    const int err = errno;
    ::close(fd_);  // the lock goes with it
    fd_ = -1;
    throw InputError(fmt::format("{} '{}': cannot write its lock file '{}': {} (checked before the first step)", flag,
                                 dir, path, std::strerror(err)));
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock; the file stays (the next run reuses it)
}

SaveDirLock::SaveDirLock(const std::string& dir, const char* flag)
    : RunLock((std::filesystem::path(dir) / ".lock").string(), flag, dir,
              "two runs writing one directory delete each other's checkpoints") {}

namespace {
std::string output_lock_file(const std::string& path) {
  const std::filesystem::path p(path);
  return (p.parent_path() / fmt::format(".{}.lock", p.filename().string())).string();
}
}  // namespace

OutputLock::OutputLock(const std::string& path, const char* flag)
    : RunLock(output_lock_file(path), flag, path, "two runs writing one file corrupt it") {}

}  // namespace shardlab
