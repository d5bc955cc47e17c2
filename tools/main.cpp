// main.cpp — the shardlab command line: start the ranks, dispatch to a command, turn its outcome
// into the exit code. The commands are listed in tools/command.hpp, one file each (tools/cmd_*.cpp).
//
// Every command runs on any number of ranks: `mpirun -np N shardlab ...` or `shardlab ... --nproc N`.
// MPI appears here only (and in src/comm): the commands get a ProcessGroup and open communicators
// through it. Exit codes: src/core/exit_code.hpp (docs/long-runs-and-faults.md, "Exit codes").
#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "memory/pool.hpp"
#include "shardlab_version_info.hpp"
#include "src/backend/cpu/gemm.hpp"
#include <fmt/ranges.h>

#include "src/comm/axes.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/model/family.hpp"
#include "src/comm/mpi_runtime.hpp"
#include "src/comm/nccl_comm.hpp"
#include "src/comm/staged_comm.hpp"
#include "src/comm/watchdog.hpp"
#include "src/core/exit_code.hpp"
#include "src/core/host_name.hpp"
#include "src/core/suggest.hpp"
#include "tools/command.hpp"
#include "tools/launch.hpp"

using namespace shardlab;

namespace {

struct CommandEntry {
  const char* name;
  ExitCode (*run)(const Args&, const Context&);
  const char* summary;
};

constexpr CommandEntry kCommands[] = {
    {"train", cmd_train, "train a model under any strategy and mesh (below) on any number of ranks"},
    {"compare", cmd_compare, "train the same model under each strategy; loss agreement, memory, time, traffic"},
    {"profile", cmd_profile, "predicted (and measured) memory per rank, per category, per strategy, any world size"},
    {"plan", cmd_plan,
     "the fastest configuration that fits N ranks: every strategy and lever, predicted (and measured)"},
    {"export", cmd_export, "a checkpoint as an HF model directory or one safetensors file, one tensor in memory at a time"},
    {"tokenize", cmd_tokenize, "text files to llm.c token shards (a validation shard, then train shards), with progress"},
    {"report", cmd_report, "a finished run from its --log: a text summary; --html: loss curves, tokens/s, comm, memory"},
    {"sample", cmd_sample, "generate text from an --init file or a checkpoint (prompt, temperature, top-k, seed)"},
    {"info", cmd_info, "runtime facts of every rank: build, backend, threads, ranks per node"},
    {"bench-collectives", cmd_bench_collectives,
     "collective benchmark, nccl-tests style: size sweep, time, algbw, busbw, #wrong"},
    {"bench-gemm", cmd_bench_gemm, "sgemm GFLOP/s of each CPU library on a training step's products, and the one picked"},
    {"bench-train", cmd_bench_train,
     "training-step tokens/s and GFLOP/s beside the sgemm ceiling; a memory lever against none"},
    {"bench-attention", cmd_bench_attention, "attention forward + backward alone: the fused kernel against the naive one"},
    {"bench-adamw", cmd_bench_adamw, "the host optimizer (--offload) against STREAM's triad bandwidth, same threads"},
    {"bench-plan-validation", cmd_bench_plan_validation,
     "plan's time model against published runs (Narayanan et al. 2021, Table 1): predicted vs published TFLOP/s"},
};

// What a bug report needs to name the build: `shardlab --version` / `shardlab version`.
std::string version_text() {
  return fmt::format("shardlab {}\n  commit      {}\n  build type  {}\n  CUDA        {}\n  CPU sgemm   {}\n",
                     SHARDLAB_VERSION, SHARDLAB_GIT_COMMIT, SHARDLAB_BUILD_TYPE,
                     std::string(SHARDLAB_CUDA_BUILT) == "ON" ? "on (compiled)" : "off (not compiled)",
                     cpu::gemm_library_versions());
}

std::string usage() {
  std::string u = "usage: shardlab <command> [options] [--nproc N]\n\ncommands:\n";
  for (const CommandEntry& c : kCommands) u += fmt::format("  {:<19} {}\n", c.name, c.summary);
  u += fmt::format("  {:<19} {}\n", "version", "version, git commit, build type, CUDA on/off and BLAS libraries");
  // What a run can be made of, from the registries (a new family or axis shows up here by existing).
  std::vector<std::string> axes;
  for (const CommAxisRow& row : kCommAxes)
    if (std::popcount(row.grid) == 1) axes.push_back(row.name);
  u += fmt::format("\nmodel families   {} (--model PRESET, or --init an HF directory of one)\n",
                   fmt::join(model_family_names(), ", "));
  u += fmt::format("strategies       dp, ddp, zero1, zero2, zero3 (hsdp: zero3 sharded in a node, replicated across)\n");
  u += fmt::format("parallel axes    {} (--pp, --dp-replicate, --dp-shard, --tp, --cp, --ep)\n", fmt::join(axes, ", "));
  return u + "\nevery command accepts:\n"
             "  --nproc N           start N ranks through mpirun (same as `mpirun -np N shardlab ...`)\n"
             "  --help              the command's options\n";
}

// The world's communicator over `kind`'s transport (resolved: see comm_for); mpi carries host
// buffers, nccl and staged device buffers (staged also host ones, through the same copies).
ProcessGroup world_group(const MpiRuntime& mpi, CommKind kind) {
  return {mpi.rank(), mpi.world(), [kind](Pool& pool) -> std::unique_ptr<Communicator> {
            switch (kind) {
              case CommKind::nccl: return make_nccl_communicator(MPI_COMM_WORLD, pool.backend());
              case CommKind::staged: return make_staged_communicator(MPI_COMM_WORLD, pool.backend());
              case CommKind::automatic:
              case CommKind::mpi: break;
            }
            return make_mpi_communicator(MPI_COMM_WORLD, pool);
          }};
}

ExitCode run_command(const std::string& command, const Args& rest, const Context& ctx) {
  std::vector<std::string> names = {"version"};
  for (const CommandEntry& c : kCommands) {
    if (command == c.name) return c.run(rest, ctx);
    names.push_back(c.name);
  }
  const std::string near = closest_name(command, names);
  if (!near.empty()) throw InputError(fmt::format("unknown command '{}': did you mean {}?", command, near));
  throw InputError(fmt::format("unknown command '{}'\n{}", command, usage()));
}

// OpenMP threads that wait at a barrier by spinning (libgomp's default) hold their cores while a
// thread they wait for is descheduled: on a machine where other work runs, a step with all cores
// took 20x as long as with one thread (docs/strategies-and-mesh.md, "Threads"); passive waiting sleeps instead.
// libgomp reads OMP_WAIT_POLICY when it is loaded,
// before main, so the setting takes effect by executing this binary again with it (once: the
// variable is then set). A policy or spin count the user gives is kept.
void wait_passively_in_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: run on, spinning as before
}

// Under the --nproc launcher SIGUSR2 is a Ctrl-C passed on (tools/launch.cpp). Until a run installs
// its own handling (train: a checkpoint at the first), it ends the rank as SIGINT ends a process.
extern "C" void interrupted_before_the_run(int) {
  static const char msg[] = "shardlab: interrupted (SIGINT)\n";
  if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0) {}
  _exit(exit_status(ExitCode::interrupted));
}

// And SIGUSR1 is a SIGTERM passed on: until a run installs its own handling (train: a checkpoint
// after the step), it ends the rank with the table's code for it, not SIGUSR1's default death (138).
extern "C" void terminated_before_the_run(int) {
  static const char msg[] = "shardlab: terminated (SIGTERM at the launcher): ending now, nothing saved\n";
  if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0) {}
  _exit(exit_status(ExitCode::terminated));
}

}  // namespace

// A rank on the launcher's host, its early handlers in place, appends its pid to the launcher's
// readiness file (kLauncherReadyVar), which holds a stop until every rank there has.
static void say_ready_to_launcher() {
  const char* file = std::getenv(kLauncherReadyVar);
  const char* host = std::getenv(kLauncherHostVar);
  if (!file || !*file || !host || host_name() != host) return;
  const int fd = ::open(file, O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return;  // the launcher is gone (it made the file): nothing to tell
  const std::string line = std::to_string(::getpid()) + "\n";
  if (::write(fd, line.data(), line.size()) < 0) {}
  ::close(fd);
}

int main(int argc, char** argv) {
  wait_passively_in_openmp(argv);
  std::vector<std::string> args;
  try {
    args = launch_or_continue(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardlab: %s\n", e.what());
    return exit_status(ExitCode::bad_input);
  }
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(usage().c_str(), args.empty() ? stderr : stdout);
    return exit_status(args.empty() ? ExitCode::bad_input : ExitCode::ok);
  }
  if (args[0] == "--version" || args[0] == "version") {
    std::fputs(version_text().c_str(), stdout);
    return exit_status(ExitCode::ok);
  }
  if (const char* launcher = std::getenv(kLauncherStatusVar); launcher && *launcher) {
    // Test hook (fault injection): SHARDLAB_FAULT_SLOW_EXEC=S: a rank takes S seconds between its
    // exec and its early handlers (a slow start of the binary: the launcher holds a stop till then).
    if (const char* slow = std::getenv("SHARDLAB_FAULT_SLOW_EXEC"); slow && std::atoi(slow) > 0) {
      std::fprintf(stderr, "shardlab: fault injection: %d s before the early handlers\n", std::atoi(slow));
      std::fflush(stderr);
      sleep(static_cast<unsigned>(std::atoi(slow)));
    }
    std::signal(SIGUSR2, interrupted_before_the_run);
    std::signal(SIGUSR1, terminated_before_the_run);
    say_ready_to_launcher();
  }
  // Test hook (fault injection): SHARDLAB_FAULT_SLOW_START=S: every rank starts S seconds late, its
  // handlers above in place (a stop that lands before the run).
  if (const char* late = std::getenv("SHARDLAB_FAULT_SLOW_START"); late && std::atoi(late) > 0) {
    std::fprintf(stderr, "shardlab: fault injection: starting %d s late\n", std::atoi(late));
    std::fflush(stderr);
    sleep(static_cast<unsigned>(std::atoi(late)));
  }
  MpiRuntime mpi(&argc, &argv);
  const Context ctx{mpi, [&mpi](CommKind kind) { return world_group(mpi, kind); }};
  try {
    const ExitCode code = run_command(args[0], Args(args.begin() + 1, args.end()), ctx);
    Watchdog::stop();
    return status_for_launcher(exit_status(code));
  } catch (const InputError& e) {
    end_job_on_input_error(fmt::format("error: {}", e.what()), exit_status(ExitCode::bad_input));
  } catch (const OutOfMemory& e) {
    abort_job(e.what(), exit_status(ExitCode::out_of_memory));
  } catch (const std::exception& e) {
    abort_job(e.what(), exit_status(ExitCode::internal));
  }
}
