#include "src/comm/communicator.hpp"

#include <cstdio>

namespace shardlab {

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::all_reduce: return "all_reduce";
    case CommOp::reduce_scatter: return "reduce_scatter";
    case CommOp::all_gather: return "all_gather";
    case CommOp::broadcast: return "broadcast";
    case CommOp::reduce: return "reduce";
    case CommOp::gather: return "gather";
    case CommOp::scatter: return "scatter";
    case CommOp::barrier: return "barrier";
  }
  return "?";
}

double bus_factor(CommOp op, int world) {
  double n = world;
  switch (op) {
    case CommOp::all_reduce: return 2.0 * (n - 1) / n;
    case CommOp::reduce_scatter:
    case CommOp::all_gather:
    case CommOp::gather:
    case CommOp::scatter: return (n - 1) / n;
    case CommOp::broadcast:
    case CommOp::reduce: return 1.0;
    case CommOp::barrier: return 0.0;
  }
  return 0.0;
}

double bus_bytes(CommOp op, double full_bytes, int world) {
  if (world <= 1) return 0.0;
  return bus_factor(op, world) * full_bytes;
}

void CommStats::record(CommOp op, double bytes, double wire_bytes) {
  if (record_events) events.push_back({op, bytes, std::chrono::steady_clock::now()});
  for (auto* counters : {&total, &step}) {
    OpCounter& c = (*counters)[static_cast<int>(op)];
    c.calls += 1;
    c.bytes += bytes;
    c.wire_bytes += wire_bytes;
  }
}

void CommStats::end_step() {
  bytes_per_step.push_back(step_bytes());
  step = {};
}

double CommStats::total_bytes() const {
  double s = 0;
  for (const auto& c : total) s += c.bytes;
  return s;
}

double CommStats::step_bytes() const {
  double s = 0;
  for (const auto& c : step) s += c.bytes;
  return s;
}

Work& Work::operator=(Work&& o) noexcept {
  if (this != &o) {
    if (impl_) {
      try {
        impl_->wait();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "shardlab [%s]: collective failed while being replaced: %s\n",
                     process_identity().c_str(), e.what());
      }
    }
    impl_ = std::move(o.impl_);
  }
  return *this;
}

Work::~Work() {
  if (!impl_) return;
  try {
    impl_->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardlab [%s]: collective failed in Work's destructor: %s\n", process_identity().c_str(),
                 e.what());
  }
}

void Work::wait() {
  if (impl_) {
    impl_->wait();
    impl_.reset();
  }
}

bool Work::done() {
  if (impl_ && impl_->test()) impl_.reset();
  return !impl_;
}

void Communicator::count(CommOp op, DType dtype, double full_bytes) {
  double b = bus_bytes(op, full_bytes, world_size());
  stats_.record(op, b, b * wire_factor(op, dtype));
}

void Communicator::check_root(int root, const char* op) const {
  SHARD_CHECK(root >= 0 && root < world_size(), "{}: root {} outside world of {}", op, root, world_size());
}

Work Communicator::all_reduce(Tensor buf, ReduceOp op) {
  count(CommOp::all_reduce, buf.dtype(), static_cast<double>(buf.bytes()));
  return do_all_reduce(buf, op);
}

Work Communicator::reduce_scatter(Tensor send, Tensor recv, ReduceOp op) {
  SHARD_CHECK(send.dtype() == recv.dtype(), "reduce_scatter: send {} vs recv {}", dtype_name(send.dtype()),
              dtype_name(recv.dtype()));
  SHARD_CHECK(send.numel() == recv.numel() * world_size(),
              "reduce_scatter: send has {} elements, expected world {} x recv {} = {}", send.numel(), world_size(),
              recv.numel(), recv.numel() * world_size());
  count(CommOp::reduce_scatter, send.dtype(), static_cast<double>(send.bytes()));
  return do_reduce_scatter(send, recv, op);
}

Work Communicator::all_gather(Tensor send, Tensor recv) {
  SHARD_CHECK(send.dtype() == recv.dtype(), "all_gather: send {} vs recv {}", dtype_name(send.dtype()),
              dtype_name(recv.dtype()));
  SHARD_CHECK(recv.numel() == send.numel() * world_size(),
              "all_gather: recv has {} elements, expected world {} x send {} = {}", recv.numel(), world_size(),
              send.numel(), send.numel() * world_size());
  count(CommOp::all_gather, send.dtype(), static_cast<double>(recv.bytes()));
  return do_all_gather(send, recv);
}

Work Communicator::broadcast(Tensor buf, int root) {
  check_root(root, "broadcast");
  count(CommOp::broadcast, buf.dtype(), static_cast<double>(buf.bytes()));
  return do_broadcast(buf, root);
}

Work Communicator::reduce(Tensor send, Tensor recv, int root, ReduceOp op) {
  check_root(root, "reduce");
  if (rank() == root) {
    SHARD_CHECK(send.dtype() == recv.dtype() && send.numel() == recv.numel(),
                "reduce: root's recv {} {} does not match send {} {}", dtype_name(recv.dtype()), recv.numel(),
                dtype_name(send.dtype()), send.numel());
  }
  count(CommOp::reduce, send.dtype(), static_cast<double>(send.bytes()));
  return do_reduce(send, recv, root, op);
}

Work Communicator::gather(Tensor send, Tensor recv, int root) {
  check_root(root, "gather");
  if (rank() == root)
    SHARD_CHECK(send.dtype() == recv.dtype() && recv.numel() == send.numel() * world_size(),
                "gather: root's recv has {} {} elements, expected world {} x send {} {}", recv.numel(),
                dtype_name(recv.dtype()), world_size(), send.numel(), dtype_name(send.dtype()));
  count(CommOp::gather, send.dtype(), static_cast<double>(send.bytes()) * world_size());
  return do_gather(send, recv, root);
}

Work Communicator::scatter(Tensor send, Tensor recv, int root) {
  check_root(root, "scatter");
  if (rank() == root)
    SHARD_CHECK(send.dtype() == recv.dtype() && send.numel() == recv.numel() * world_size(),
                "scatter: root's send has {} {} elements, expected world {} x recv {} {}", send.numel(),
                dtype_name(send.dtype()), world_size(), recv.numel(), dtype_name(recv.dtype()));
  count(CommOp::scatter, recv.dtype(), static_cast<double>(recv.bytes()) * world_size());
  return do_scatter(send, recv, root);
}

Work Communicator::barrier() {
  count(CommOp::barrier, DType::f32, 0.0);
  return do_barrier();
}

}  // namespace shardlab
