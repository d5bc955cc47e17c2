// mpi_runtime.hpp — MPI start-up and shut-down for one rank, node-local rank discovery, MPI_CHECK,
// and abort_job(): the way a failing rank takes the whole job down instead of leaving it hung.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "src/core/check.hpp"

#define MPI_CHECK(call)                                                                            \
  do {                                                                                             \
    int rc_ = (call);                                                                              \
    if (rc_ != MPI_SUCCESS) [[unlikely]]                                                           \
      ::shardlab::check_failed(#call, __FILE__, __LINE__, ::shardlab::mpi_error_string(rc_));      \
  } while (0)

namespace shardlab {

std::string mpi_error_string(int code);

// Open MPI's start-up writes shared-memory files of a few MiB even for one process (about 4 MiB for
// one, up to 8 for four local ranks): under a smaller file-size limit it died of SIGXFSZ or hung in
// PMIx errors without a word of the cause. This names the limit ("" when it is at least 8 MiB or
// unlimited); MpiRuntime (before MPI_Init) and the --nproc launcher (before mpirun) check it.
std::string file_size_limit_problem();

class MpiRuntime {
 public:
  // Initialises MPI (thread level FUNNELED: only the main thread calls MPI), makes MPI errors
  // return codes (so MPI_CHECK reports them), finds the node-local rank, and records this process's
  // identity for error messages.
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // Where the ranks run, from MPI's own placement: every rank's node (numbered in order of their
  // lowest rank) and host name.
  int nodes() const { return nodes_; }
  int node_of(int rank) const { return node_of_.at(static_cast<size_t>(rank)); }
  const std::string& host_of(int rank) const { return host_of_.at(static_cast<size_t>(rank)); }
  // R when the nodes hold consecutive blocks of R ranks each (what --ranks-per-node describes),
  // else 0 (one node, or an irregular placement such as --map-by node).
  int consecutive_ranks_per_node() const;

 private:
  void find_placement(int leader);
  int rank_ = 0, world_ = 1, local_rank_ = 0, local_size_ = 1, nodes_ = 1;
  std::vector<int> node_of_;
  std::vector<std::string> host_of_;
};


// Prints "shardlab [rank r/N]: message" to stderr and ends every rank of the job with `code`.
[[noreturn]] void abort_job(const std::string& message, int code = 1);

// For an input error (bad option, bad file): most are found alike by every rank, and N copies of
// one line plus Open MPI's MPI_ABORT banner bury it. Each failing rank offers its message's hash
// on a communicator kept for this; when every rank arrives within `grace_s`, rank 0 prints each
// distinct message once (with the ranks that raised it, where not all), every rank finalizes MPI
// and exits with `code`. A rank that fails alone cannot wait for the others (they may be blocked
// in a collective it will never join), so past the grace it ends the job as abort_job does.
[[noreturn]] void end_job_on_input_error(const std::string& message, int code, double grace_s = 5.0);

}  // namespace shardlab
