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
  SHARD_REQUIRE(!std::filesystem::is_directory(path, ec), "{} '{}': it is a directory; give a file name (checked {})",
                flag, path, when);
  // Nothing is created, so every rank may check the same path at once: an existing file is opened for
  // writing (not truncated), a new one needs a directory it can be created in.
  if (std::filesystem::exists(path, ec)) {
    const int fd = ::open(path.c_str(), O_WRONLY);
    SHARD_REQUIRE(fd >= 0, "{} '{}': cannot write it: {} (checked {})", flag, path, std::strerror(errno), when);
    ::close(fd);
    return;
  }
  const std::filesystem::path parent = std::filesystem::absolute(path).parent_path();
  SHARD_REQUIRE(std::filesystem::is_directory(parent, ec), "{} '{}': cannot write it: {} (checked {})", flag, path,
                std::filesystem::exists(parent, ec) ? std::strerror(ENOTDIR) : std::strerror(ENOENT), when);
  SHARD_REQUIRE(::access(parent.c_str(), W_OK | X_OK) == 0, "{} '{}': cannot write it: {} (checked {})", flag, path,
                std::strerror(errno), when);
}

void check_outputs_distinct(const NamedPaths& inputs, const NamedPaths& outputs) {
  auto resolved = [](const std::string& p) {
    std::error_code ec;
    const std::filesystem::path r = std::filesystem::weakly_canonical(p, ec);
    return ec ? std::filesystem::absolute(p).lexically_normal() : r;
  };
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [out_flag, out] = outputs[i];
    if (out.empty()) continue;
    const std::filesystem::path o = resolved(out);
    for (const auto& [in_flag, in] : inputs)
      SHARD_REQUIRE(in.empty() || resolved(in) != o, "{} '{}' is also {} '{}': the output would overwrite an input; "
                    "write it elsewhere", out_flag, out, in_flag, in);
    for (size_t j = 0; j < i; ++j)
      SHARD_REQUIRE(outputs[j].second.empty() || resolved(outputs[j].second) != o,
                    "{} '{}' and {} '{}' are the same file: one output would overwrite the other", outputs[j].first,
                    outputs[j].second, out_flag, out);
  }
}

}  // namespace shardlab
