#include "src/core/check.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace shardlab {
namespace {
std::mutex g_identity_mutex;
int g_rank = -1;
int g_world = 0;
std::string g_device = "cpu";
}  // namespace

void set_process_identity(int rank, int world, std::string device) {
  std::lock_guard lock(g_identity_mutex);
  g_rank = rank;
  g_world = world;
  g_device = std::move(device);
}

int process_rank() {
  std::lock_guard lock(g_identity_mutex);
  return g_rank;
}

std::string process_identity() {
  std::lock_guard lock(g_identity_mutex);
  if (g_rank < 0) return fmt::format("rank ? {}", g_device);
  return fmt::format("rank {}/{} {}", g_rank, g_world, g_device);
}

void check_failed(const char* statement, const char* file, int line, const std::string& detail) {
  std::string msg = fmt::format("internal error at {}:{} [{}]: check `{}` failed{}{}", file, line,
                                process_identity(), statement, detail.empty() ? "" : ": ", detail);
  throw InternalError(msg);
}

}  // namespace shardlab
