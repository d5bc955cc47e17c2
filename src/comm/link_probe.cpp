#include "src/comm/link_probe.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "src/comm/watchdog.hpp"
#include "src/core/units.hpp"

namespace shardlab {
namespace {

constexpr int kSmall = 64 << 10, kLarge = 4 << 20;
constexpr double kSmallEnoughS = 0.05;  // a small round trip under this: the large one is cheap
constexpr double kRepeatBelowS = 0.1;   // a large round trip under this is repeated (up to 3 in all)
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
  // Watched as a collective: a host whose link is down ends the job named, not hung.
  WatchdogWait watched(Watchdog::enter("link probe (link_probe.cpp)"));
  MPI_Comm comm;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  std::vector<char> buf(kLarge);
  const int me = mpi.rank();
  for (size_t i = 1; i < leaders.size(); ++i) {
    if (me == leaders[i]) {  // echoes each size rank 0 announces, until it announces 0
      for (int n = 0;;) {
        MPI_CHECK(MPI_Recv(&n, 1, MPI_INT, 0, kTag, comm, MPI_STATUS_IGNORE));
        if (n == 0) break;
        echo(comm, buf, n);
      }
    } else if (me == 0) {
      const int peer = leaders[i];
      auto exchange = [&](int n) {
        MPI_CHECK(MPI_Send(&n, 1, MPI_INT, peer, kTag, comm));
        return round_trip(comm, peer, buf, n);
      };
      exchange(1);
      const double t_small = exchange(kSmall);
      LinkRate l{mpi.host_of(peer), 2.0 * kSmall / t_small};
      if (t_small < kSmallEnoughS) {  // the best of up to three large round trips: one may be descheduled
        double best = exchange(kLarge);
        for (int k = 1; k < 3 && best < kRepeatBelowS; ++k) best = std::min(best, exchange(kLarge));
        l.bytes_per_s = 2.0 * kLarge / best;
      }
      const int done = 0;
      MPI_CHECK(MPI_Send(&done, 1, MPI_INT, peer, kTag, comm));
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
