#include "benchmarks/collectives.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

namespace shardlab {
namespace {

// Rank r's input element i: a small integer, so sums over a few ranks are exact in bf16 and f16.
float input_value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 3 + (i % 7) - 3); }

// Buffers live in the pool's memory (a GPU's with --device cuda): values travel through host copies.
void fill_inputs(Backend& be, const Tensor& t, int rank, int64_t first_index = 0) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = input_value(rank, first_index + static_cast<int64_t>(i));
  std::vector<uint8_t> host(t.bytes());
  convert(v.data(), DType::f32, host.data(), t.dtype(), v.size());
  be.copy(t, Tensor::flat(host.data(), t.dtype(), t.numel()));
}

std::vector<float> to_f32(Backend& be, const Tensor& t) {
  std::vector<uint8_t> host(t.bytes());
  be.copy(Tensor::flat(host.data(), t.dtype(), t.numel()), t);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  convert(host.data(), t.dtype(), v.data(), DType::f32, v.size());
  return v;
}

float sum_over_ranks(int world, int64_t i) {
  float s = 0;
  for (int r = 0; r < world; ++r) s += input_value(r, i);
  return s;
}

struct Buffers {
  Block send, recv;
  Tensor send_t, recv_t;
};

// Element counts per rank for a given nccl-tests size.
Buffers make_buffers(Pool& pool, CommOp op, DType dtype, int64_t count, int world) {
  int64_t send_n = count, recv_n = count;
  if (op == CommOp::all_gather || op == CommOp::gather) send_n = count / world;
  if (op == CommOp::reduce_scatter || op == CommOp::scatter) recv_n = count / world;
  Buffers b;
  b.send = pool.alloc(dtype, send_n, Category::comm_buffer, "bench send");
  b.recv = pool.alloc(dtype, recv_n, Category::comm_buffer, "bench recv");
  b.send_t = b.send.flat(dtype).slice(0, send_n);
  b.recv_t = b.recv.flat(dtype).slice(0, recv_n);
  return b;
}

Work issue(Communicator& comm, CommOp op, Buffers& b) {
  switch (op) {
    case CommOp::all_reduce: return comm.all_reduce(b.send_t);
    case CommOp::reduce_scatter: return comm.reduce_scatter(b.send_t, b.recv_t);
    case CommOp::all_gather: return comm.all_gather(b.send_t, b.recv_t);
    case CommOp::broadcast: return comm.broadcast(b.send_t, 0);
    case CommOp::reduce: return comm.reduce(b.send_t, b.recv_t, 0);
    case CommOp::gather: return comm.gather(b.send_t, b.recv_t, 0);
    case CommOp::scatter: return comm.scatter(b.send_t, b.recv_t, 0);
    case CommOp::all_to_all: return comm.all_to_all(b.send_t, b.recv_t);
    case CommOp::all_to_all_v: {  // equal chunks through the variable-count call: all_to_all's traffic
      const std::vector<int64_t> counts(static_cast<size_t>(comm.world_size()), b.send_t.numel() / comm.world_size());
      return comm.all_to_all_v(b.send_t, counts, b.recv_t, counts);
    }
    case CommOp::barrier: return comm.barrier();
    case CommOp::send:
    case CommOp::recv: {  // a ring: every rank sends to the next and receives from the previous
      const int n = comm.world_size(), r = comm.rank();
      if (n == 1) return Work();
      Work in = comm.recv(b.recv_t, (r + n - 1) % n);
      Work out = comm.send(b.send_t, (r + 1) % n);
      in.wait();
      return out;
    }
  }
  return Work();
}

// One fresh call, checked against what it must produce. Returns this rank's wrong elements.
uint64_t checked_call(Backend& be, Communicator& comm, CommOp op, Buffers& b) {
  int r = comm.rank(), n = comm.world_size();
  int64_t recv_n = b.recv_t.numel();
  fill_inputs(be, b.send_t, r);
  issue(comm, op, b).wait();
  auto to_f32 = [&be](const Tensor& t) { return shardlab::to_f32(be, t); };
  uint64_t wrong = 0;
  auto expect_eq = [&](const std::vector<float>& got, auto expected) {
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != expected(static_cast<int64_t>(i))) ++wrong;
  };
  switch (op) {
    case CommOp::all_reduce:
      expect_eq(to_f32(b.send_t), [&](int64_t i) { return sum_over_ranks(n, i); });
      break;
    case CommOp::reduce_scatter:
      expect_eq(to_f32(b.recv_t), [&](int64_t i) { return sum_over_ranks(n, r * recv_n + i); });
      break;
    case CommOp::all_gather: {
      int64_t chunk = b.send_t.numel();
      expect_eq(to_f32(b.recv_t), [&](int64_t i) { return input_value(static_cast<int>(i / chunk), i % chunk); });
      break;
    }
    case CommOp::broadcast:
      expect_eq(to_f32(b.send_t), [&](int64_t i) { return input_value(0, i); });
      break;
    case CommOp::reduce:
      if (r == 0) expect_eq(to_f32(b.recv_t), [&](int64_t i) { return sum_over_ranks(n, i); });
      break;
    case CommOp::gather: {
      int64_t chunk = b.send_t.numel();
      if (r == 0)
        expect_eq(to_f32(b.recv_t), [&](int64_t i) { return input_value(static_cast<int>(i / chunk), i % chunk); });
      break;
    }
    case CommOp::scatter:
      expect_eq(to_f32(b.recv_t), [&](int64_t i) { return input_value(0, r * recv_n + i); });
      break;
    case CommOp::send:
    case CommOp::recv:
      if (n > 1) expect_eq(to_f32(b.recv_t), [&](int64_t i) { return input_value((r + n - 1) % n, i); });
      break;
    case CommOp::all_to_all:
    case CommOp::all_to_all_v: {  // chunk j comes from rank j: its chunk r
      const int64_t chunk = recv_n / n;
      expect_eq(to_f32(b.recv_t),
                [&](int64_t i) { return input_value(static_cast<int>(i / chunk), r * chunk + i % chunk); });
      break;
    }
    case CommOp::barrier: break;
  }
  return wrong;
}

}  // namespace

std::vector<CommOp> parse_comm_ops(const std::string& list) {
  std::vector<CommOp> ops;
  std::stringstream ss(list);
  std::string name;
  while (std::getline(ss, name, ',')) {
    bool found = false;
    for (int i = 0; i < kNumCommOps; ++i) {
      if (name == comm_op_name(static_cast<CommOp>(i))) {
        ops.push_back(static_cast<CommOp>(i));
        found = true;
      }
    }
    SHARD_REQUIRE(found, "unknown collective '{}': expected all_reduce, reduce_scatter, all_gather, broadcast, "
                  "reduce, gather, scatter, all_to_all, all_to_all_v, send, recv or barrier", name);
  }
  SHARD_REQUIRE(!ops.empty(), "no collective given in '{}'", list);
  return ops;
}

uint64_t run_collective_benchmark(Communicator& comm, Communicator& processes, Pool& pool,
                                  const CollectiveBenchConfig& cfg, std::FILE* out) {
  SHARD_REQUIRE(cfg.min_bytes >= 1 && cfg.min_bytes <= cfg.max_bytes, "benchmark sizes: min {} > max {}",
                cfg.min_bytes, cfg.max_bytes);
  SHARD_REQUIRE(cfg.step_factor >= 2, "benchmark size step factor must be at least 2, got {}", cfg.step_factor);
  SHARD_REQUIRE(cfg.iters >= 1 && cfg.warmup >= 0, "benchmark: iters {} warmup {}", cfg.iters, cfg.warmup);
  const int world = comm.world_size();
  const bool root = comm.rank() == 0;
  Backend& be = pool.backend();
  const size_t elt = dtype_size(cfg.dtype);
  uint64_t total_wrong = 0;
  if (root)
    std::fprintf(out, "# shardlab collective benchmark: %s communicator, %d ranks, %s, warmup %d, iters %d\n",
                 comm.name().c_str(), world, dtype_name(cfg.dtype), cfg.warmup, cfg.iters);
  for (CommOp op : cfg.ops) {
    // all_to_all_v runs here with equal chunks: all_to_all's traffic, and its factor.
    const double factor = bus_factor(op == CommOp::all_to_all_v ? CommOp::all_to_all : op, world);
    if (root) {
      std::fprintf(out, "#\n# %s (busbw factor %.3f)\n", comm_op_name(op), factor);
      std::fprintf(out, "#%12s %12s %6s %6s %5s %12s %12s %12s %8s\n", "size(B)", "count", "type", "redop", "root",
                   "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    }
    for (uint64_t size = cfg.min_bytes; size <= cfg.max_bytes; size *= cfg.step_factor) {
      // Round the element count down to a multiple of the world size (all_gather/reduce_scatter chunks).
      int64_t count = static_cast<int64_t>(size / elt) / world * world;
      if (count == 0) continue;
      Buffers b = make_buffers(pool, op, cfg.dtype, count, world);
      fill_inputs(be, b.send_t, comm.rank());
      for (int i = 0; i < cfg.warmup; ++i) issue(comm, op, b).wait();
      be.synchronize();  // on a GPU, wait() orders streams; the clock needs the work done
      comm.barrier().wait();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < cfg.iters; ++i) issue(comm, op, b).wait();
      be.synchronize();
      const int64_t local_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - t0).count();
      // The slowest process's time and every process's wrong elements, over the control channel
      // (not counted as traffic; never between the timed calls).
      const double slowest = static_cast<double>(processes.all_max(local_ns)) / 1e9 / cfg.iters;
      const uint64_t wrong = checked_call(be, comm, op, b);
      uint64_t all_wrong = 0;
      for (uint64_t w : processes.gather_u64(std::span<const uint64_t>(&wrong, 1))) all_wrong += w;
      all_wrong = static_cast<uint64_t>(processes.all_max(static_cast<int64_t>(all_wrong)));  // from rank 0
      total_wrong += all_wrong;
      double bytes = static_cast<double>(count) * elt;
      double algbw = bytes / slowest / 1e9;
      if (root) {
        bool reduces = op == CommOp::all_reduce || op == CommOp::reduce_scatter || op == CommOp::reduce;
        bool rooted = op == CommOp::broadcast || op == CommOp::reduce || op == CommOp::gather || op == CommOp::scatter;
        std::fprintf(out, " %12.0f %12lld %6s %6s %5s %12.1f %12.3f %12.3f %8llu\n", bytes,
                     static_cast<long long>(count), dtype_name(cfg.dtype), reduces ? "sum" : "none",
                     rooted ? "0" : "-1", slowest * 1e6, algbw, algbw * factor,
                     static_cast<unsigned long long>(all_wrong));
        std::fflush(out);
      }
    }
  }
  if (root) std::fprintf(out, "#\n# total #wrong: %llu\n", static_cast<unsigned long long>(total_wrong));
  return total_wrong;
}

}  // namespace shardlab
