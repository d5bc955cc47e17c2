#include "tools/runtime.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "memory/pool.hpp"
#include "src/comm/link_probe.hpp"
#include "src/comm/watchdog.hpp"
#include "src/core/units.hpp"
#include "src/train/predict.hpp"

namespace shardlab {

namespace {

// Cores other processes keep busy now: /proc/stat's busy share over 30 ms, times the cores. Threads
// beyond the idle cores only queue behind other work (each step then waits for its slowest
// thread), so the automatic count leaves the busy ones alone. Sampled, not the load average, which
// trails by a minute (the run before this one would still count). 0 where /proc/stat is unreadable.
double busy_cores() {
  auto sample = [](uint64_t& idle, uint64_t& total) {
    std::ifstream f("/proc/stat");
    std::string cpu;
    f >> cpu;
    uint64_t v = 0;
    idle = total = 0;
    for (int i = 0; i < 8 && f >> v; ++i) {
      total += v;
      if (i == 3 || i == 4) idle += v;  // idle, iowait
    }
    return cpu == "cpu" && total > 0;
  };
  uint64_t i0, t0, i1, t1;
  if (!sample(i0, t0)) return 0;
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  if (!sample(i1, t1) || t1 <= t0) return 0;
  const double busy = 1.0 - double(i1 - i0) / double(t1 - t0);
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return std::max(0.0, busy) * double(std::max(1L, cores));
}

// --threads 0: this node's cores shared among its ranks, less those busy with other work.
int automatic_threads(int local_ranks) {
  const int share = default_cpu_threads(local_ranks);
  if (share <= 1) return share;
  const int usable = share * std::max(1, local_ranks);
  const int idle = usable - static_cast<int>(std::lround(busy_cores()));
  return std::clamp(idle / std::max(1, local_ranks), 1, share);
}

}  // namespace

std::unique_ptr<Backend> make_cpu(const cli::RunOptions& run, const Context& ctx) {
  SHARD_REQUIRE(run.threads >= 0, "--threads {}: expected 0 (automatic) or a positive count", run.threads);
  BackendConfig bc;
  bc.threads = run.threads > 0 ? run.threads : automatic_threads(ctx.mpi.local_size());
  bc.cpu_gemm = run.cpu_gemm;
  bc.local_ranks = ctx.mpi.local_size();
  bc.local_rank = ctx.mpi.local_rank();
  return make_cpu_backend(bc);
}

std::unique_ptr<Backend> make_device_backend(Device device, const cli::RunOptions& run, const Context& ctx) {
  if (device != Device::cuda) return make_cpu(run, ctx);
  BackendConfig bc;
  bc.threads = run.threads;  // of its host backend
  bc.cpu_gemm = run.cpu_gemm;
  bc.local_rank = ctx.mpi.local_rank();
  bc.local_ranks = ctx.mpi.local_size();
  return make_cuda_backend(bc);
}

void require_step_fits_host(const TrainConfig& cfg, const cli::TrainOptions& opts, const Context& ctx) {
  if (parse_device(opts.run.device) != Device::cpu || !opts.memory.device_memory.empty()) return;
  const int dp = cfg.layout.dims.is_resolved() ? cfg.layout.dims.dp() : ctx.mpi.world();
  // Indivisible batches are the trainer's error to report, with its own message.
  if (dp < 1 || cfg.accum < 1 || cfg.batch < 1 || cfg.batch % (int64_t(dp) * cfg.accum) != 0) return;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;
  const double host = double(pages) * double(page) / std::max(1, ctx.mpi.local_size());
  const Estimate e = predict_step(cfg, ctx.mpi.world(), ctx.mpi.rank(), cfg.batch / dp / cfg.accum, false);
  const double need = double(e.peak) + double(e.host.peak);
  SHARD_REQUIRE(need <= host,
                "a {} step of {} with --seq {}, --batch {} (micro-batch {}) needs {} per rank, more than this host's "
                "memory ({} per rank, {} rank(s) here): lower --seq or --batch, or raise --accum",
                strategy_name(cfg.strategy.kind), cfg.spec.describe(), cfg.spec.seq, cfg.batch, cfg.batch / dp / cfg.accum,
                format_bytes(need),
                format_bytes(host), ctx.mpi.local_size());
}

CommKind comm_for(const std::string& comm, Device device, const Context& ctx) {
  return resolve_comm(parse_comm(comm), device, ctx.mpi.local_size(),
                      device == Device::cuda ? cuda_device_count() : 0);
}

namespace {

// Job directories whose owner (rank 0 of a job that was killed) is gone, left in a node-local base.
void remove_dead_watchdog_dirs(const std::string& base) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(base, ec)) {
    if (e.path().filename().string().rfind("shardlab-watchdog-", 0) != 0) continue;
    long pid = 0;
    std::ifstream(e.path() / "owner") >> pid;
    // No owner: a job starting right now (rank 0 writes it just after creating the directory), or,
    // a minute on, one that never will.
    auto age = std::filesystem::file_time_type::clock::now() - std::filesystem::last_write_time(e.path(), ec);
    bool dead = pid > 0 ? ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH : !ec && age > std::chrono::minutes(1);
    if (dead) std::filesystem::remove_all(e.path(), ec);
  }
}

}  // namespace

std::function<std::string()> link_checker(const Context& ctx) {
  if (ctx.mpi.nodes() <= 1) return {};
  return [&mpi = ctx.mpi] {
    const LinkReport r = probe_links(mpi);
    return r.empty() ? std::string() : r.describe();
  };
}

void start_watchdog(const Context& ctx, double timeout_s, double save_timeout_s) {
  SHARD_REQUIRE(timeout_s >= 0 && timeout_s <= 1e7, "--collective-timeout {}: expected 0 (off) or a number of seconds",
                timeout_s);
  SHARD_REQUIRE(save_timeout_s >= 0 && save_timeout_s <= 1e7, "--save-timeout {}: expected 0 (off) or a number of "
                "seconds", save_timeout_s);
  if (timeout_s == 0) return;
  auto meta = make_meta_backend();
  Pool pool(*meta);
  auto comm = ctx.world(CommKind::mpi).connect(pool);
  std::string dir;
  if (ctx.mpi.rank() == 0) {
    const char* env = std::getenv("SHARDLAB_WATCHDOG_DIR");
    std::string base = env && *env ? env : (std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp");
    if (!(env && *env)) remove_dead_watchdog_dirs(base);  // node-local: owners' pids are meaningful
    std::string tmpl = base + "/shardlab-watchdog-XXXXXX";
    SHARD_REQUIRE(::mkdtemp(tmpl.data()) != nullptr, "--collective-timeout: cannot create a directory under '{}': {}",
                  base, std::strerror(errno));
    dir = tmpl;
    std::ofstream(dir + "/owner") << ::getpid() << "\n";
  }
  dir = comm->all_gather_strings(dir)[0];
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // ranks on other nodes
  std::vector<std::string> hosts;
  for (int r = 0; r < ctx.mpi.world(); ++r) hosts.push_back(ctx.mpi.host_of(r));
  Watchdog::start(dir, ctx.mpi.rank(), ctx.mpi.world(), timeout_s, std::move(hosts), save_timeout_s);
}

int ranks_per_node(const Context& ctx) {
  const char* v = std::getenv("SHARDLAB_RANKS_PER_NODE");
  if (!v || !*v) return ctx.mpi.local_size();
  char* end = nullptr;
  const long k = std::strtol(v, &end, 10);
  SHARD_REQUIRE(end && *end == '\0' && k >= 1 && k <= (1 << 20), "SHARDLAB_RANKS_PER_NODE='{}': expected a positive "
                "number of ranks", v);
  return static_cast<int>(k);
}

int node_ranks_for_links(const Context& ctx, int world, int given) {
  const MpiRuntime& m = ctx.mpi;
  if (world != m.world() || m.nodes() <= 1) return given;
  const int placed = m.consecutive_ranks_per_node();
  if (given > 0) {
    if (given != placed && m.rank() == 0)
      std::fprintf(stderr, "shardlab: warning: --ranks-per-node %d, but MPI placed the %d ranks on %d nodes (%s): "
                   "the per-link byte counts and ZeRO++'s node groups follow --ranks-per-node\n", given, world,
                   m.nodes(), placed > 0 ? fmt::format("{} consecutive ranks each", placed).c_str() : "not in equal "
                   "consecutive blocks");
    return given;
  }
  if (placed == 0 && m.rank() == 0)
    std::fprintf(stderr, "shardlab: warning: MPI placed the %d ranks on %d nodes, not in equal consecutive blocks "
                 "(e.g. --map-by node): bytes are not split by link; place them by slot (--map-by slot) or give "
                 "--ranks-per-node\n", world, m.nodes());
  return placed;
}

void write_text(const std::string& path, const std::string& text, const char* option) {
  std::ofstream f(path, std::ios::trunc);
  SHARD_REQUIRE(f.good(), "cannot write {} file '{}'", option, path);
  f << text;
  f.close();
  SHARD_REQUIRE(f.good(), "writing {} file '{}' failed", option, path);
  std::printf("wrote %s\n", path.c_str());
}

}  // namespace shardlab
