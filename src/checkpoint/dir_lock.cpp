#include "src/checkpoint/dir_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "src/core/check.hpp"

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

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string("?");
}

std::string now_utc() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

}  // namespace

SaveDirLock::SaveDirLock(const std::string& dir, const char* flag) {
  const std::string path = (std::filesystem::path(dir) / ".lock").string();
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
    SHARD_REQUIRE(err != EWOULDBLOCK, "{} '{}' is in use by another run ({}): two runs writing one directory delete "
                  "each other's checkpoints; give this run another {}, or wait for that one to end (checked before "
                  "the first step)", flag, dir, holder.empty() ? "its lock file names no holder" : holder, flag);
    throw InputError(fmt::format("{} '{}': cannot lock '{}': {} (checked before the first step)", flag, dir, path,
                                 std::strerror(err)));
  }
  std::ostringstream who;
  who << "pid " << ::getpid() << " on host " << host_name() << " since " << now_utc() << ": " << command_line();
  const std::string text = who.str() + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
    throw InputError(fmt::format("{} '{}': cannot write its lock file '{}': {} (checked before the first step)", flag,
                                 dir, path, std::strerror(errno)));
}

SaveDirLock::~SaveDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock; the file stays (the next run reuses it)
}

}  // namespace shardlab
