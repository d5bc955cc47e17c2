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
//   broadcast, reduce            S     (0 when N = 1)
//   barrier                      0
// `bytes` counts the logical dtype; `wire_bytes` what the transport really moved (MPI widens
// bf16/f16 reductions to f32 so the sum is accumulated in f32: twice the bytes).
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "src/core/tensor.hpp"

namespace shardlab {

enum class ReduceOp : uint8_t { sum, max };
enum class CommOp : uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, reduce, gather, scatter, barrier };
inline constexpr int kNumCommOps = 8;
const char* comm_op_name(CommOp op);

// Bus bytes per rank for one call (see the table above); full_bytes is S.
double bus_bytes(CommOp op, double full_bytes, int world);
// nccl-tests' factor busbw / algbw, for benchmarks: 2(N-1)/N, (N-1)/N or 1.
double bus_factor(CommOp op, int world);

struct OpCounter {
  uint64_t calls = 0;
  double bytes = 0;       // bus bytes in the logical dtype
  double wire_bytes = 0;  // bus bytes as carried by the transport
};

// A collective as issued, for traces: what, how many bus bytes, when.
struct CommEvent {
  CommOp op;
  double bytes;
  std::chrono::steady_clock::time_point issued;
};

struct CommStats {
  bool record_events = false;     // keep a CommEvent per call (off by default: it grows)
  std::vector<CommEvent> events;
  std::array<OpCounter, kNumCommOps> total{};
  std::array<OpCounter, kNumCommOps> step{};  // since the last end_step()
  std::vector<double> bytes_per_step;         // bus bytes of each finished step

  void record(CommOp op, double bytes, double wire_bytes);
  void end_step();
  double total_bytes() const;
  double step_bytes() const;
};

// Handle to a collective in flight.
class WorkImpl {
 public:
  virtual ~WorkImpl() = default;
  virtual bool test() = 0;  // true once complete (finishes the work if so)
  virtual void wait() = 0;
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
  Work all_reduce(Tensor buf, ReduceOp op = ReduceOp::sum);
  // send holds N * recv.numel() elements; rank r receives the reduction of chunk r. In place when
  // recv is chunk `rank` of send (the other chunks of send are clobbered then).
  Work reduce_scatter(Tensor send, Tensor recv, ReduceOp op = ReduceOp::sum);
  // recv holds N * send.numel() elements; chunk r comes from rank r. In place when send is chunk
  // `rank` of recv.
  Work all_gather(Tensor send, Tensor recv);
  // root's recv (N * send.numel()) gets chunk r from rank r; recv is ignored elsewhere.
  Work gather(Tensor send, Tensor recv, int root);
  // rank r's recv gets chunk r of root's send (N * recv.numel()); send is ignored elsewhere.
  Work scatter(Tensor send, Tensor recv, int root);
  // In place: every rank ends with root's buf.
  Work broadcast(Tensor buf, int root);
  // root's recv gets the reduction of all ranks' send; recv is ignored (may be empty) elsewhere.
  // In place at the root when send and recv are the same buffer.
  Work reduce(Tensor send, Tensor recv, int root, ReduceOp op = ReduceOp::sum);
  Work barrier();

  template <class T>
  Work all_reduce(std::span<T> buf, ReduceOp op = ReduceOp::sum) {
    return all_reduce(Tensor::of(buf), op);
  }
  template <class T>
  Work reduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op = ReduceOp::sum) {
    return reduce_scatter(Tensor::of(send), Tensor::of(recv), op);
  }
  template <class T>
  Work all_gather(std::span<const T> send, std::span<T> recv) {
    return all_gather(Tensor::of(send), Tensor::of(recv));
  }
  template <class T>
  Work broadcast(std::span<T> buf, int root) {
    return broadcast(Tensor::of(buf), root);
  }
  template <class T>
  Work reduce(std::span<const T> send, std::span<T> recv, int root, ReduceOp op = ReduceOp::sum) {
    return reduce(Tensor::of(send), Tensor::of(recv), root, op);
  }

  CommStats& stats() { return stats_; }
  const CommStats& stats() const { return stats_; }

 protected:
  // Transports implement these; the public calls above validate sizes and count bytes first.
  virtual Work do_all_reduce(Tensor buf, ReduceOp op) = 0;
  virtual Work do_reduce_scatter(Tensor send, Tensor recv, ReduceOp op) = 0;
  virtual Work do_all_gather(Tensor send, Tensor recv) = 0;
  virtual Work do_broadcast(Tensor buf, int root) = 0;
  virtual Work do_reduce(Tensor send, Tensor recv, int root, ReduceOp op) = 0;
  virtual Work do_gather(Tensor send, Tensor recv, int root) = 0;
  virtual Work do_scatter(Tensor send, Tensor recv, int root) = 0;
  virtual Work do_barrier() = 0;
  // Bytes the transport moves per logical byte (2 where it widens a reduction to f32).
  virtual double wire_factor(CommOp op, DType dtype) const { return 1.0; }

 private:
  void count(CommOp op, DType dtype, double full_bytes);
  void check_root(int root, const char* op) const;

  CommStats stats_;
};

}  // namespace shardlab
