// communicator.hpp — Communicator: the collectives shardlab's strategies use, and their byte counts.
//
// Counts are in elements; buffers are typed Tensors (f32, bf16, f16) or std::span<T> on the host.
// Every call returns a Work handle and may still be running when it returns, so communication
// overlaps computation; wait() before touching the buffers. A Work that is destroyed un-waited
// waits in its destructor, so its buffers can never be freed under a running collective.
//
// Implementations: mpi (CPU buffers over MPI), sim (one process plays rank r of a world of N);
// nccl and staged (GPU) come with the CUDA backend.
//
// Byte counters use nccl-tests' "bus bytes": what one rank sends (or receives) under an optimal
// ring algorithm, so figures compare across world sizes and with nccl-tests' busbw. With S the
// full buffer size in bytes (the gathered or pre-scatter buffer for all-gather and reduce-scatter)
// and N ranks:
//   all_reduce       2 (N-1)/N * S
//   reduce_scatter     (N-1)/N * S     (S = N * recv count * element size)
//   all_gather         (N-1)/N * S     (S = N * send count * element size)
//   gather, scatter    (N-1)/N * S     (S = N * chunk; the root receives or sends N-1 chunks)
//   all_to_all         (N-1)/N * S     (S = N * chunk: this rank's send buffer; it keeps one chunk;
//                                      all_to_all_v: what it sends the others, its buffer less its own)
//   broadcast, reduce            S     (0 when N = 1)
//   send, recv                   S     (point to point: what this rank sends or receives)
//   barrier                      0
// `bytes` counts the logical dtype; `wire_bytes` what the transport really moved (MPI widens
// bf16/f16 reductions to f32 so the sum is accumulated in f32: twice the bytes).
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include "src/comm/axes.hpp"  // CommAxis
#include "src/comm/comm_stats.hpp"  // CommOp, CommStats
#include "src/core/tensor.hpp"

namespace shardlab {

enum class ReduceOp : uint8_t { sum, max };
using Site = std::source_location;

// Bus bytes per rank for one call (see the table above); full_bytes is S.
double bus_bytes(CommOp op, double full_bytes, int world);
// Bytes MPI moves per logical byte: bf16/f16 reductions are widened to f32 (mpi, staged, sim).
double mpi_wire_factor(CommOp op, DType dtype);
// nccl-tests' factor busbw / algbw, for benchmarks: 2(N-1)/N, (N-1)/N or 1.
double bus_factor(CommOp op, int world);

// Handle to a collective in flight.
class WorkImpl {
 public:
  virtual ~WorkImpl() = default;
  virtual bool test() = 0;  // true once complete (finishes the work if so)
  virtual void wait() = 0;
  // test() without starting anything the communicator holds back (NCCL's grouped sends and
  // receives go out only together): lets issued work progress, e.g. MPI requests between kernels.
  virtual bool progress() { return test(); }
};

class Work {
 public:
  Work() = default;  // already complete
  explicit Work(std::unique_ptr<WorkImpl> impl) : impl_(std::move(impl)) {}
  Work(Work&&) noexcept = default;
  Work& operator=(Work&& o) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work();

  void wait();
  bool done();
  bool progress();  // done() that issues nothing held back (WorkImpl::progress)

 private:
  std::unique_ptr<WorkImpl> impl_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;

  // In place: every rank ends with the reduction of all ranks' buf.
  Work all_reduce(Tensor buf, ReduceOp op = ReduceOp::sum, Site site = Site::current());
  // send holds N * recv.numel() elements; rank r receives the reduction of chunk r. In place when
  // recv is chunk `rank` of send (the other chunks of send are clobbered then).
  Work reduce_scatter(Tensor send, Tensor recv, ReduceOp op = ReduceOp::sum, Site site = Site::current());
  // recv holds N * send.numel() elements; chunk r comes from rank r. In place when send is chunk
  // `rank` of recv.
  Work all_gather(Tensor send, Tensor recv, Site site = Site::current());
  // send and recv hold N chunks of the same size: chunk j of send goes to rank j, chunk j of recv
  // comes from rank j (its chunk `rank`). Not in place.
  Work all_to_all(Tensor send, Tensor recv, Site site = Site::current());
  // Variable counts: send_counts[j] to rank j, recv_counts[j] from it, in rank order. Not in place.
  Work all_to_all_v(Tensor send, std::span<const int64_t> send_counts, Tensor recv,
                    std::span<const int64_t> recv_counts, Site site = Site::current());
  // root's recv (N * send.numel()) gets chunk r from rank r; recv is ignored elsewhere.
  Work gather(Tensor send, Tensor recv, int root, Site site = Site::current());
  // rank r's recv gets chunk r of root's send (N * recv.numel()); send is ignored elsewhere.
  Work scatter(Tensor send, Tensor recv, int root, Site site = Site::current());
  // In place: every rank ends with root's buf.
  Work broadcast(Tensor buf, int root, Site site = Site::current());
  // root's recv gets the reduction of all ranks' send; recv is ignored (may be empty) elsewhere.
  // In place at the root when send and recv are the same buffer.
  Work reduce(Tensor send, Tensor recv, int root, ReduceOp op = ReduceOp::sum, Site site = Site::current());
  Work barrier(Site site = Site::current());
  // Point to point: buf goes to rank `peer`, which receives it with recv(buf of the same count and
  // dtype, this rank). Sends to one peer arrive in the order they were issued. Both sides count S
  // bus bytes; the watchdog watches them like any collective. --check-collectives: the sender posts
  // its fingerprint without waiting (a ring of sends then receives must not deadlock), and the
  // receiver compares it with its own (the k-th send to a peer with the peer's k-th receive from
  // this rank) and throws naming both on a mismatch.
  Work send(Tensor buf, int peer, Site site = Site::current());
  Work recv(Tensor buf, int peer, Site site = Site::current());

  template <class T>
  Work all_reduce(std::span<T> buf, ReduceOp op = ReduceOp::sum, Site site = Site::current()) {
    return all_reduce(Tensor::of(buf), op, site);
  }
  template <class T>
  Work reduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op = ReduceOp::sum,
                      Site site = Site::current()) {
    return reduce_scatter(Tensor::of(send), Tensor::of(recv), op, site);
  }
  template <class T>
  Work all_gather(std::span<const T> send, std::span<T> recv, Site site = Site::current()) {
    return all_gather(Tensor::of(send), Tensor::of(recv), site);
  }
  template <class T>
  Work broadcast(std::span<T> buf, int root, Site site = Site::current()) {
    return broadcast(Tensor::of(buf), root, site);
  }
  template <class T>
  Work reduce(std::span<const T> send, std::span<T> recv, int root, ReduceOp op = ReduceOp::sum,
              Site site = Site::current()) {
    return reduce(Tensor::of(send), Tensor::of(recv), root, op, site);
  }

  // ---- control: small blocking exchanges of host values, for commands and checks ----
  // They travel on a channel of their own (never between a rank's data collectives), are not
  // counted as traffic, and are what commands use instead of reaching for the transport.
  // Every rank's string in rank order, on every rank.
  std::vector<std::string> all_gather_strings(const std::string& mine);
  // Every rank's string in rank order on `root`; empty elsewhere.
  std::vector<std::string> gather_strings(const std::string& mine, int root = 0);
  // Every rank's values, concatenated in rank order, on `root` (each rank gives the same count).
  std::vector<uint64_t> gather_u64(std::span<const uint64_t> mine, int root = 0);
  int64_t all_max(int64_t v);  // the largest v of any rank, on every rank
  // Bytes to rank `peer` without waiting, and the next bytes `peer` posted to this rank (blocking),
  // in order between one pair; not counted as traffic.
  void post_control(int peer, const std::string& bytes);
  std::string take_control(int peer);

  // --check-collectives: before each collective, every rank's fingerprint (sequence number, op,
  // count, dtype, root, call site; all_to_all_v's counts both ways) is compared across ranks on a
  // separate channel; a mismatch throws InternalError naming the ranks and call sites, not hanging.
  void set_check(bool on) { check_ = on; }
  // An emulated link (--inter-node-gbs): each call completes no sooner than its bus bytes / bytes_per_s
  // after this process's one emulated link is free (calls in flight together queue on it). 0 = off.
  void pace(double bytes_per_s) { pace_ = bytes_per_s; }

  // Collective over this communicator: a communicator over the ranks that pass the same `color`,
  // ordered by `key`, in which this rank is `rank` of `size` (the caller knows the layout; the
  // transport checks it where it can). It inherits --check-collectives and counts its traffic in
  // this communicator's stats too, under `axis`. Only the Mesh calls it (src/comm/mesh.hpp).
  std::unique_ptr<Communicator> split(int color, int key, int size, int rank, CommAxis axis);

  CommStats& stats() { return stats_; }

  struct Fingerprint {  // what --check-collectives compares; plain bytes: it travels as such
    uint64_t seq;
    int64_t count;
    int32_t root;
    uint8_t op, dtype, reduce_op, pad;
    char site[48];
  };
  const CommStats& stats() const { return stats_; }

 protected:
  // Transports implement these; the public calls above validate sizes and count bytes first.
  virtual Work do_all_reduce(Tensor buf, ReduceOp op) = 0;
  virtual Work do_reduce_scatter(Tensor send, Tensor recv, ReduceOp op) = 0;
  virtual Work do_all_gather(Tensor send, Tensor recv) = 0;
  virtual Work do_broadcast(Tensor buf, int root) = 0;
  virtual Work do_reduce(Tensor send, Tensor recv, int root, ReduceOp op) = 0;
  virtual Work do_gather(Tensor send, Tensor recv, int root) = 0;
  virtual Work do_all_to_all(Tensor send, Tensor recv) = 0;
  virtual Work do_all_to_all_v(Tensor send, std::span<const int64_t> sc, Tensor recv, std::span<const int64_t> rc);
  virtual Work do_scatter(Tensor send, Tensor recv, int root) = 0;
  virtual Work do_barrier() = 0;
  virtual Work do_send(Tensor buf, int peer) = 0;
  virtual Work do_recv(Tensor buf, int peer) = 0;
  virtual bool blocks() const { return false; }  // a call can block this process (--collective-timeout)
  // Bytes the transport moves per logical byte (2 where it widens a reduction to f32).
  virtual double wire_factor(CommOp op, DType dtype) const { return 1.0; }
  // The control channel: every rank's bytes in rank order, on every rank (blocking; separate from
  // the data collectives). One rank alone needs no transport.
  virtual std::vector<std::string> exchange(const std::string& mine) { return {mine}; }
  // The control channel between two ranks (post_control, take_control). A transport without real
  // peers (sim) posts nothing and takes "": nothing to compare.
  virtual void do_post_control(int peer, const std::string& bytes) = 0;
  virtual std::string do_take_control(int peer) = 0;
  virtual std::unique_ptr<Communicator> do_split(int color, int key, int size, int rank) = 0;

 private:
  Work issue(uint64_t seq, CommOp op, DType dtype, double full_bytes, const std::function<Work()>& run);
  void check_root(int root, const char* op) const;
  // Numbers the collective for the watchdog, then (--check-collectives) compares fingerprints.
  uint64_t enter(CommOp op, const Tensor& t, int root, ReduceOp rop, const Site& site);
  // The same for a send or a receive: the watchdog's record, then the pair's fingerprints.
  uint64_t enter_p2p(CommOp op, const Tensor& t, int peer, const Site& site);
  void check_peer(int peer, const char* op) const;
  Work watched(uint64_t seq, Work w);

  CommStats stats_;
  Communicator* parent_ = nullptr;  // a sub-communicator's (split): its traffic counts there too
  CommAxis axis_ = CommAxis::world;
  bool check_ = false;
  double pace_ = 0, last_bytes_ = 0;  // the emulated link's rate; the last call's bus bytes
  uint64_t seq_ = 0;
  std::vector<uint64_t> sent_, received_;  // point-to-point sequence numbers per peer (--check-collectives)
};

// --comm: the transport a rank's collectives use. automatic: mpi on the host; on CUDA, nccl when
// every rank on a node has a GPU of its own, staged when ranks share one (NCCL refuses that).
enum class CommKind : uint8_t { automatic, mpi, nccl, staged };
CommKind parse_comm(const std::string& s);  // "auto", "mpi", "nccl", "staged"; InputError otherwise
const char* comm_kind_name(CommKind k);
// The concrete transport for a backend on `device`, with `local_ranks` processes sharing a node
// that has `devices` GPUs. Throws InputError for a transport the device cannot use.
CommKind resolve_comm(CommKind k, Device device, int local_ranks, int devices);

class Pool;

// The processes a command runs on, without naming the transport: this process's rank, how many
// there are, and a way to open a communicator over them whose staging buffers come from `pool`.
// Commands (compare, profile, info, ...) take this and never see MPI.
struct ProcessGroup {
  int rank = 0;
  int size = 1;
  std::function<std::unique_ptr<Communicator>(Pool& pool)> connect;
};

}  // namespace shardlab
