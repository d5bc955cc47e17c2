#include "src/core/exit_code.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "src/core/host_name.hpp"

namespace shardlab {

namespace {
// Appends the status to the launcher's file; false where there is none (no launcher, another node).
bool write_status(int status) {
  const char* path = std::getenv(kLauncherStatusVar);
  if (status == 0 || path == nullptr || *path == '\0') return false;
  const int fd = ::open(path, O_WRONLY | O_APPEND);
  if (fd < 0) return false;
  const std::string line = std::to_string(status) + "\n";
  const bool told = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  return told;
}
}  // namespace

int status_for_launcher(int status) { return write_status(status) ? 0 : status; }  // else: mpirun's note it is

void tell_launcher(int status) {
  const char* host = std::getenv(kLauncherHostVar);
  if (host && *host && host_name() != host) return;
  write_status(status);
}

}  // namespace shardlab
