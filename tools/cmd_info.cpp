// `shardlab info`: every rank's runtime facts (rank, node-local rank, backend, threads), in order.
#include <cstdio>
#include <cstdlib>

#include "memory/pool.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"
#include "tools/runtime.hpp"

namespace shardlab {

ExitCode cmd_info(const Args& args, const Context& ctx) {
  cli::RunOptions run;
  cli::MemoryOptions memory;
  cli::Desc desc = cli::command_options("info");
  run.add(desc);
  memory.add(desc);
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"info"})) return ExitCode::ok;
  const MpiRuntime& mpi = ctx.mpi;
  auto backend = make_cpu(run, ctx);
  Pool pool(*backend);
  auto comm = ctx.world(CommKind::mpi).connect(pool);
  // Every rank's line, gathered to rank 0 so the output is ordered.
  auto lines = comm->gather_strings(fmt::format("rank {}/{} (local {}/{} on {}): {}", mpi.rank(), mpi.world(),
                                                mpi.local_rank(), mpi.local_size(), mpi.host_of(mpi.rank()),
                                                backend->describe()));
  if (mpi.rank() == 0) {
    const char* wait = std::getenv("OMP_WAIT_POLICY");  // main.cpp sets passive unless given
    std::printf("shardlab %s — CUDA backend %s, %d CUDA device(s) visible, OpenMP waits %s\n", "0.1.0",
                cuda_compiled() ? "compiled" : "not compiled", cuda_device_count(),
                wait ? wait : "as GOMP_SPINCOUNT says");
    for (const std::string& l : lines) std::printf("  %s\n", l.c_str());
  }
  return ExitCode::ok;
}

}  // namespace shardlab
