#include "src/comm/mpi_runtime.hpp"

#include "src/comm/watchdog.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>

#include "src/core/exit_code.hpp"
#include "src/core/hash.hpp"

namespace shardlab {

namespace {
// A duplicate of the world kept for end_job_on_input_error, so its exchange can never match a
// collective that a rank left half-done on the world's communicator.
MPI_Comm g_error_comm = MPI_COMM_NULL;
}  // namespace

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return fmt::format("MPI error {}: {}", code, std::string(buf, len));
}

std::string file_size_limit_problem() {
  rlimit rl{};
  constexpr rlim_t kNeed = rlim_t{8} << 20;
  if (getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= kNeed) return "";
  return fmt::format("error: the file-size limit (ulimit -f) is {} KiB; starting MPI writes shared-memory files of "
                     "several MiB, even for one process: raise it to at least {} KiB (ulimit -f {}) or to unlimited",
                     rl.rlim_cur >> 10, kNeed >> 10, kNeed >> 10);
}

void MpiRuntime::find_placement(int leader) {
  std::vector<int> leaders(static_cast<size_t>(world_));
  MPI_CHECK(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD));
  std::vector<int> first_rank;  // of each node, in order
  for (int r = 0; r < world_; ++r) {
    auto it = std::find(first_rank.begin(), first_rank.end(), leaders[static_cast<size_t>(r)]);
    if (it == first_rank.end()) it = first_rank.insert(first_rank.end(), leaders[static_cast<size_t>(r)]);
    node_of_.push_back(static_cast<int>(it - first_rank.begin()));
  }
  nodes_ = static_cast<int>(first_rank.size());
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_CHECK(MPI_Get_processor_name(name, &len));
  std::vector<char> all(static_cast<size_t>(world_) * MPI_MAX_PROCESSOR_NAME);
  MPI_CHECK(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                          MPI_COMM_WORLD));
  for (int r = 0; r < world_; ++r) host_of_.emplace_back(&all[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]);
}

int MpiRuntime::consecutive_ranks_per_node() const {
  if (nodes_ <= 1 || world_ % nodes_ != 0) return 0;
  const int R = world_ / nodes_;
  for (int r = 0; r < world_; ++r)
    if (node_of(r) != r / R) return 0;
  return R;
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  if (const std::string problem = file_size_limit_problem(); !problem.empty()) {
    std::fprintf(stderr, "shardlab: %s\n", problem.c_str());
    std::exit(exit_status(ExitCode::bad_input));
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  SHARD_CHECK(!initialized, "MPI initialised twice");
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_));
  MPI_Comm local;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
  MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
  MPI_CHECK(MPI_Comm_size(local, &local_size_));
  int leader = rank_;  // the node's lowest world rank names it
  MPI_CHECK(MPI_Bcast(&leader, 1, MPI_INT, 0, local));
  MPI_CHECK(MPI_Comm_free(&local));
  find_placement(leader);
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_error_comm));
  set_process_identity(rank_, world_, "cpu");
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_error_comm != MPI_COMM_NULL) MPI_Comm_free(&g_error_comm);
  MPI_Finalize();
}

void abort_job(const std::string& message, int code) {
  Watchdog::stop();
  std::fprintf(stderr, "shardlab [%s]: %s\n", process_identity().c_str(), message.c_str());
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world > 1) MPI_Abort(MPI_COMM_WORLD, code);
    MPI_Finalize();
  }
  std::exit(status_for_launcher(code));  // one rank: it ends as a whole job would
}

}  // namespace shardlab

namespace shardlab {
namespace {

// Every rank's message, at rank 0 (all ranks call it: they all reached the error exchange).
std::vector<std::string> gather_messages(const std::string& mine, int rank, int world) {
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(world), offsets(world);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, g_error_comm);
  std::string all;
  if (rank == 0) {
    for (int r = 0, at = 0; r < world; at += lens[r], ++r) offsets[r] = at;
    all.resize(static_cast<size_t>(offsets[world - 1] + lens[world - 1]));
  }
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, 0, g_error_comm);
  std::vector<std::string> out;
  if (rank == 0)
    for (int r = 0; r < world; ++r) out.push_back(all.substr(static_cast<size_t>(offsets[r]), static_cast<size_t>(lens[r])));
  return out;
}

}  // namespace

void end_job_on_input_error(const std::string& message, int code, double grace_s) {
  int initialized = 0, finalized = 0, world = 1, rank = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  if (world == 1 || g_error_comm == MPI_COMM_NULL) abort_job(message, code);
  Watchdog::stop();
  // max(h) == h and max(~h) == ~h on every rank exactly when every rank's h is the same.
  const uint64_t h = fnv1a64(message);
  uint64_t in[2] = {h, ~h}, out[2] = {0, 0};
  MPI_Request req;
  MPI_Iallreduce(in, out, 2, MPI_UINT64_T, MPI_MAX, g_error_comm, &req);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  int done = 0;
  while (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  if (!done) abort_job(message, code);  // some rank is elsewhere: it must be ended, not waited for
  if (out[0] == h && out[1] == ~h) {
    if (rank == 0) std::fprintf(stderr, "shardlab [%d ranks]: %s\n", world, message.c_str());
  } else {
    const std::vector<std::string> all = gather_messages(message, rank, world);
    std::map<std::string, std::string> ranks_of;  // message -> "0,2"
    for (int r = 0; r < static_cast<int>(all.size()); ++r) {
      std::string& ranks = ranks_of[all[r]];
      if (!ranks.empty()) ranks += ',';
      ranks += std::to_string(r);
    }
    for (const auto& [text, ranks] : ranks_of)
      std::fprintf(stderr, "shardlab [ranks %s of %d]: %s\n", ranks.c_str(), world, text.c_str());
  }
  std::fflush(stderr);
  MPI_Comm_free(&g_error_comm);
  MPI_Finalize();
  std::exit(status_for_launcher(code));
}

}  // namespace shardlab
