// all_to_all_v.cpp — Communicator::all_to_all_v, the variable-count all-to-all (communicator.hpp):
// what one rank can check alone, then (--check-collectives) every rank's counts both ways.
#include <algorithm>
#include <cstring>

#include "src/comm/communicator.hpp"
#include "src/comm/watchdog.hpp"

namespace shardlab {

Work Communicator::all_to_all_v(Tensor send, std::span<const int64_t> send_counts, Tensor recv,
                                std::span<const int64_t> recv_counts, Site site) {
  const int N = world_size(), me = rank();
  // The fingerprint holds what every rank shares: the dtype and the world (the counts are each rank's).
  const uint64_t seq = enter(CommOp::all_to_all_v, Tensor(send.data(), send.dtype(), {N}), -1, ReduceOp::sum, site);
  SHARD_CHECK(send.dtype() == recv.dtype() && send_counts.size() == static_cast<size_t>(N) &&
                  recv_counts.size() == static_cast<size_t>(N),
              "all_to_all_v: send {} and recv {}, {} send counts and {} recv counts for {} ranks",
              dtype_name(send.dtype()), dtype_name(recv.dtype()), send_counts.size(), recv_counts.size(), N);
  int64_t sent = 0, received = 0;
  for (int j = 0; j < N; ++j) {
    SHARD_CHECK(send_counts[j] >= 0 && recv_counts[j] >= 0, "all_to_all_v: counts {} and {} for rank {}",
                send_counts[j], recv_counts[j], j);
    sent += send_counts[j], received += recv_counts[j];
  }
  SHARD_CHECK(sent == send.numel() && received == recv.numel(),
              "all_to_all_v: send counts sum to {} for a send buffer of {}, recv counts to {} for {}", sent,
              send.numel(), received, recv.numel());
  SHARD_CHECK(send_counts[me] == recv_counts[me], "all_to_all_v: rank {} keeps {} elements but expects {} from itself",
              me, send_counts[me], recv_counts[me]);
  SHARD_CHECK(send.data() != recv.data() || send.numel() == 0, "all_to_all_v: send and recv are the same buffer");
  if (check_) {  // every rank's counts, both ways: each rank finds the same first disagreement and throws
    std::vector<int64_t> both(send_counts.begin(), send_counts.end());
    both.insert(both.end(), recv_counts.begin(), recv_counts.end());
    WatchdogWait waiting(seq);  // the exchange blocks too
    const std::vector<std::string> all =
        exchange(std::string(reinterpret_cast<const char*>(both.data()), both.size() * sizeof(int64_t)));
    const auto at = [&](int r, int k) {  // rank r's counts: sends to k (k < N), receives from k - N
      int64_t v = 0;
      std::memcpy(&v, all[static_cast<size_t>(r)].data() + static_cast<size_t>(k) * sizeof(int64_t), sizeof v);
      return v;
    };
    const bool peers = all.size() == static_cast<size_t>(N) && std::all_of(all.begin(), all.end(), [&](const auto& b) {
                         return b.size() == 2 * static_cast<size_t>(N) * sizeof(int64_t);
                       });
    for (int j = 0; peers && j < N; ++j)
      for (int p = 0; p < N; ++p)
        if (at(j, p) != at(p, N + j))
          throw InternalError(fmt::format("all_to_all_v #{} (--check-collectives): rank {} sends rank {} {} elements, "
                                          "which expects {}", seq, j, p, at(j, p), at(p, N + j)));
  }
  const double elem = static_cast<double>(dtype_size(send.dtype()));
  return issue(seq, CommOp::all_to_all_v, send.dtype(), static_cast<double>(sent - send_counts[me]) * elem,
               [&] { return do_all_to_all_v(send, send_counts, recv, recv_counts); });
}

Work Communicator::do_all_to_all_v(Tensor, std::span<const int64_t>, Tensor, std::span<const int64_t>) {
  throw InternalError(fmt::format("all_to_all_v: the {} communicator does not implement it", name()));
}

}  // namespace shardlab
