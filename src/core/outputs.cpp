#include "src/core/outputs.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "src/core/check.hpp"

namespace shardlab {

void probe_output_file(const std::string& path, const char* flag, const char* when) {
  SHARD_REQUIRE(!path.empty(), "{} '': expected a file name", flag);
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  SHARD_REQUIRE(!std::filesystem::is_directory(path, ec), "{} '{}': it is a directory; give a file name (checked {})",
                flag, path, when);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT, 0644);
  SHARD_REQUIRE(fd >= 0, "{} '{}': cannot write it: {} (checked {})", flag, path, std::strerror(errno), when);
  ::close(fd);
  if (!existed) std::filesystem::remove(path, ec);
}

}  // namespace shardlab
