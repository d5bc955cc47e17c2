// link_probe.hpp — the links between a job's hosts, timed when a run starts: the host whose link
// is far slower than the others' is named as the straggler.
//
// The lowest rank of each host (its leader) exchanges a message with rank 0 (host 0's leader), one
// host at a time: a 1-byte ping first (Open MPI's TCP transport connects on first use), then 64 KiB
// each way, then, where that took under 50 ms, 4 MiB each way (the best of up to three round trips
// while each takes under 0.1 s); the rate is the bytes both ways over the round trip. With three hosts or more, a host whose rate is under a quarter of the others'
// median is a straggler: its link (or its host) is what the others would wait for, while from
// inside a collective every rank waits alike. With two hosts there is one pair: its rate is
// reported, nobody is named.
#pragma once
#include <string>
#include <vector>

#include "src/comm/mpi_runtime.hpp"

namespace shardlab {

struct LinkRate {
  std::string host;
  double bytes_per_s = 0;
};

struct LinkReport {
  std::string first_host;            // rank 0's
  std::vector<LinkRate> to_first;    // every other host's link to it, in host order
  std::vector<std::string> stragglers;
  bool empty() const { return to_first.empty(); }
  std::string describe() const;  // one line: the rates, and the stragglers where there are any
};

// Collective over every rank; rank 0 holds the report (the others' is empty, as is everyone's when
// the job is on one host).
LinkReport probe_links(const MpiRuntime& mpi);

}  // namespace shardlab
