#include "src/comm/link_probe.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "src/core/units.hpp"

namespace shardlab {
namespace {

constexpr int kSmall = 64 << 10, kLarge = 4 << 20;
constexpr double kSmallEnoughS = 0.05;  // a small round trip under this: the large one is cheap
constexpr int kTag = 7301;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Rank 0's side of one round trip of n bytes each way with `peer`: its seconds.
double round_trip(MPI_Comm comm, int peer, std::vector<char>& buf, int n) {
  const double t0 = now_s();
  MPI_CHECK(MPI_Send(buf.data(), n, MPI_CHAR, peer, kTag, comm));
  MPI_CHECK(MPI_Recv(buf.data(), n, MPI_CHAR, peer, kTag, comm, MPI_STATUS_IGNORE));
  return now_s() - t0;
}

void echo(MPI_Comm comm, std::vector<char>& buf, int n) {
  MPI_CHECK(MPI_Recv(buf.data(), n, MPI_CHAR, 0, kTag, comm, MPI_STATUS_IGNORE));
  MPI_CHECK(MPI_Send(buf.data(), n, MPI_CHAR, 0, kTag, comm));
}

}  // namespace

std::string LinkReport::describe() const {
  std::string s = fmt::format("from {}", first_host);
  for (const LinkRate& l : to_first)
    s += fmt::format("{} to {} {}/s", &l == &to_first.front() ? "" : ",", l.host, format_bytes(l.bytes_per_s));
  s += fmt::format(" (bytes both ways over a round trip of up to {} each way)", format_bytes(kLarge));
  if (to_first.size() >= 2 && stragglers.empty()) s += "; no straggler among them";
  for (const std::string& h : stragglers)
    s += fmt::format("; straggler: host {} (its link under a quarter of the others' median)", h);
  return s;
}

LinkReport probe_links(const MpiRuntime& mpi) {
  LinkReport report;
  if (mpi.nodes() <= 1) return report;
  std::vector<int> leaders;
  for (int r = 0; r < mpi.world(); ++r)
    if (static_cast<int>(leaders.size()) == mpi.node_of(r)) leaders.push_back(r);
  MPI_Comm comm;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  std::vector<char> buf(kLarge);
  const int me = mpi.rank();
  for (size_t i = 1; i < leaders.size(); ++i) {
    int large = 0;  // rank 0 decides from the small exchange, then tells the peer
    if (me == leaders[i]) {
      echo(comm, buf, 1);
      echo(comm, buf, kSmall);
      MPI_CHECK(MPI_Recv(&large, 1, MPI_INT, 0, kTag, comm, MPI_STATUS_IGNORE));
      if (large) echo(comm, buf, kLarge);
    } else if (me == 0) {
      round_trip(comm, leaders[i], buf, 1);
      const double t_small = round_trip(comm, leaders[i], buf, kSmall);
      large = t_small < kSmallEnoughS;
      MPI_CHECK(MPI_Send(&large, 1, MPI_INT, leaders[i], kTag, comm));
      LinkRate l{mpi.host_of(leaders[i]), 2.0 * kSmall / t_small, kSmall};
      if (large) l = {l.host, 2.0 * kLarge / round_trip(comm, leaders[i], buf, kLarge), kLarge};
      report.to_first.push_back(l);
    }
  }
  MPI_CHECK(MPI_Barrier(comm));
  MPI_CHECK(MPI_Comm_free(&comm));
  if (me != 0) return {};
  report.first_host = mpi.host_of(0);
  if (report.to_first.size() >= 2) {
    std::vector<double> rates;
    for (const LinkRate& l : report.to_first) rates.push_back(l.bytes_per_s);
    std::sort(rates.begin(), rates.end());
    const double median = rates[rates.size() / 2];
    for (const LinkRate& l : report.to_first)
      if (l.bytes_per_s < median / 4) report.stragglers.push_back(l.host);
  }
  return report;
}

}  // namespace shardlab
