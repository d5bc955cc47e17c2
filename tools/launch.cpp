#include "tools/launch.hpp"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "src/core/check.hpp"

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
  std::vector<std::string> cmd = {env && *env ? env : "mpirun", "-np", std::to_string(nproc), "--oversubscribe",
                                  "--bind-to", "none"};
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  cmd.push_back(exe);
  cmd.insert(cmd.end(), args.begin(), args.end());
  return cmd;
}

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
  std::error_code ec;
  std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) exe = argv[0];
  std::vector<std::string> cmd = mpirun_command(nproc, exe, args);
  std::vector<char*> cargv;
  for (auto& s : cmd) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  execvp(cargv[0], cargv.data());
  throw InputError(fmt::format("--nproc {}: could not start '{}': {} (is Open MPI installed? "
                               "scripts/install-deps.sh installs it)",
                               nproc, cmd[0], std::strerror(errno)));
}

}  // namespace shardlab
