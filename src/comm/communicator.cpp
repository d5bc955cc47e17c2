#include "src/comm/communicator.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "src/comm/watchdog.hpp"

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
    case CommOp::send: return "send";
    case CommOp::recv: return "recv";
    case CommOp::all_to_all: return "all_to_all";
    case CommOp::all_to_all_v: return "all_to_all_v";
  }
  return "?";
}

const char* comm_axis_name(CommAxis a) { return comm_axis_row(a).name; }

CommKind parse_comm(const std::string& s) {
  if (s == "auto") return CommKind::automatic;
  if (s == "mpi") return CommKind::mpi;
  if (s == "nccl") return CommKind::nccl;
  if (s == "staged") return CommKind::staged;
  throw InputError(fmt::format("--comm '{}': expected auto, mpi, nccl or staged", s));
}

const char* comm_kind_name(CommKind k) {
  switch (k) {
    case CommKind::automatic: return "auto";
    case CommKind::mpi: return "mpi";
    case CommKind::nccl: return "nccl";
    case CommKind::staged: return "staged";
  }
  return "?";
}

CommKind resolve_comm(CommKind k, Device device, int local_ranks, int devices) {
  if (device != Device::cuda) {
    SHARD_REQUIRE(k == CommKind::automatic || k == CommKind::mpi || k == CommKind::staged,
                  "--comm {} carries GPU buffers; with --device {} use --comm mpi (or auto)", comm_kind_name(k),
                  device_name(device));
    return k == CommKind::automatic ? CommKind::mpi : k;
  }
  SHARD_REQUIRE(k != CommKind::mpi, "--comm mpi carries host buffers only; with --device cuda use nccl, staged or auto");
  if (k != CommKind::automatic) return k;
  return local_ranks <= devices ? CommKind::nccl : CommKind::staged;
}

double mpi_wire_factor(CommOp op, DType dtype) {
  const bool reduction = op == CommOp::all_reduce || op == CommOp::reduce_scatter || op == CommOp::reduce;
  return reduction && dtype != DType::f32 ? 4.0 / dtype_size(dtype) : 1.0;
}

double bus_factor(CommOp op, int world) {
  double n = world;
  switch (op) {
    case CommOp::all_reduce: return 2.0 * (n - 1) / n;
    case CommOp::reduce_scatter:
    case CommOp::all_gather:
    case CommOp::all_to_all:
    case CommOp::gather:
    case CommOp::scatter: return (n - 1) / n;
    case CommOp::broadcast:
    case CommOp::reduce:
    case CommOp::send:
    case CommOp::recv:
    case CommOp::all_to_all_v: return 1.0;  // counted as the bytes that leave the rank
    case CommOp::barrier: return 0.0;
  }
  return 0.0;
}

double bus_bytes(CommOp op, double full_bytes, int world) {
  if (world <= 1) return 0.0;
  return bus_factor(op, world) * full_bytes;
}

void CommStats::record(CommOp op, double bytes, double wire_bytes, CommAxis axis) {
  if (record_events) events.push_back({op, bytes, std::chrono::steady_clock::now()});
  axis_step[static_cast<int>(axis)] += bytes;
  for (auto* counters : {&total, &step}) {
    OpCounter& c = (*counters)[static_cast<int>(op)];
    c.calls += 1;
    c.bytes += bytes;
    c.wire_bytes += wire_bytes;
  }
}

void CommStats::end_step() {
  last_step_bytes = step_bytes();
  last_step_axis = axis_step;
  ++steps;
  step = {};
  axis_step = {};
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

bool Work::progress() {
  if (impl_ && impl_->progress()) impl_.reset();
  return !impl_;
}

namespace {
// "shard/zero.cpp:108": the last two path components keep call sites short and readable.
std::string short_site(const Site& s) {
  std::string f = s.file_name();
  size_t cut = f.rfind('/');
  if (cut != std::string::npos && cut > 0) cut = f.rfind('/', cut - 1);
  return (cut == std::string::npos ? f : f.substr(cut + 1)) + ":" + std::to_string(s.line());
}
std::string describe(const Communicator::Fingerprint& f) {
  const CommOp op = static_cast<CommOp>(f.op);
  if (op == CommOp::barrier) return fmt::format("barrier at {}", f.site);
  if (op == CommOp::send || op == CommOp::recv)
    return fmt::format("{} of {} {} {} rank {} at {}", comm_op_name(op), f.count, dtype_name(static_cast<DType>(f.dtype)),
                       op == CommOp::send ? "to" : "from", f.root, f.site);
  return fmt::format("{} of {} {}{} at {}", comm_op_name(static_cast<CommOp>(f.op)), f.count,
                     dtype_name(static_cast<DType>(f.dtype)), f.root >= 0 ? fmt::format(" (root {})", f.root) : "",
                     f.site);
}
// What a call is, for the watchdog's records and --check-collectives (seq is the caller's to set).
// root: the root of a rooted collective, the peer of a send or receive, -1 otherwise.
Communicator::Fingerprint fingerprint_of(CommOp op, const Tensor& t, int root, ReduceOp rop, const Site& site) {
  Communicator::Fingerprint f{};
  f.count = t.data() ? t.numel() : 0;
  f.root = root;
  f.op = static_cast<uint8_t>(op);
  f.dtype = static_cast<uint8_t>(t.dtype());
  f.reduce_op = static_cast<uint8_t>(rop);
  std::snprintf(f.site, sizeof(f.site), "%s", short_site(site).c_str());
  return f;
}
}  // namespace

namespace {
// Blocks on a collective in the watchdog's records while it is waited on.
class WatchedWork final : public WorkImpl {
 public:
  WatchedWork(Work inner, uint64_t seq) : inner_(std::move(inner)), seq_(seq) {}
  bool test() override { return inner_.done(); }
  bool progress() override { return inner_.progress(); }
  void wait() override {
    WatchdogWait w(seq_);
    inner_.wait();
  }

 private:
  Work inner_;
  uint64_t seq_;
};
}  // namespace

namespace {
// A call on the emulated link: done when the call is and its time on the link has passed.
class PacedWork final : public WorkImpl {
 public:
  PacedWork(Work inner, std::chrono::steady_clock::time_point until) : inner_(std::move(inner)), until_(until) {}
  bool test() override { return inner_.done() && std::chrono::steady_clock::now() >= until_; }
  bool progress() override { return inner_.progress() && std::chrono::steady_clock::now() >= until_; }
  void wait() override {
    inner_.wait();
    std::this_thread::sleep_until(until_);
  }

 private:
  Work inner_;
  std::chrono::steady_clock::time_point until_;
};
std::chrono::steady_clock::time_point g_link_free;  // when this process's emulated link is next idle
}  // namespace

Work Communicator::watched(uint64_t seq, Work w) {
  if (pace_ > 0 && last_bytes_ > 0) {
    const auto now = std::chrono::steady_clock::now();
    g_link_free = std::max(now, g_link_free) +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(last_bytes_ / pace_));
    w = Work(std::make_unique<PacedWork>(std::move(w), g_link_free));
  }
  if (seq == 0) return w;
  return Work(std::make_unique<WatchedWork>(std::move(w), seq));
}

uint64_t Communicator::enter(CommOp op, const Tensor& t, int root, ReduceOp rop, const Site& site) {
  Fingerprint f = fingerprint_of(op, t, root, rop, site);
  const uint64_t seq = blocks() && Watchdog::active() ? Watchdog::enter(describe(f)) : 0;
  if (!check_) return seq;
  WatchdogWait waiting(seq);  // the fingerprint exchange blocks too
  f.seq = seq_++;
  std::vector<std::string> bytes = exchange(std::string(reinterpret_cast<const char*>(&f), sizeof f));
  std::vector<Fingerprint> all(bytes.size());
  for (size_t r = 0; r < bytes.size(); ++r) {
    SHARD_CHECK(bytes[r].size() == sizeof(Fingerprint), "fingerprint of rank {}: {} bytes", r, bytes[r].size());
    std::memcpy(&all[r], bytes[r].data(), sizeof(Fingerprint));
  }
  for (size_t r = 1; r < all.size(); ++r) {
    const Fingerprint& a = all[0];
    const Fingerprint& b = all[r];
    bool same = a.seq == b.seq && a.op == b.op && a.dtype == b.dtype && a.root == b.root &&
                a.reduce_op == b.reduce_op && a.count == b.count;
    if (!same)
      throw InternalError(fmt::format("collective #{} differs across ranks (--check-collectives): rank 0 issues {}, "
                                      "rank {} issues {}",
                                      a.seq, describe(a), r, describe(b)));
  }
  return seq;
}

std::vector<std::string> Communicator::all_gather_strings(const std::string& mine) {
  const uint64_t seq = blocks() && Watchdog::active() ? Watchdog::enter("control exchange") : 0;
  WatchdogWait waiting(seq);
  std::vector<std::string> all = exchange(mine);
  SHARD_CHECK(all.size() == static_cast<size_t>(world_size()), "control exchange returned {} entries for {} ranks",
              all.size(), world_size());
  return all;
}

std::vector<std::string> Communicator::gather_strings(const std::string& mine, int root) {
  check_root(root, "gather_strings");
  std::vector<std::string> all = all_gather_strings(mine);
  if (rank() != root) all.clear();
  return all;
}

std::vector<uint64_t> Communicator::gather_u64(std::span<const uint64_t> mine, int root) {
  std::string bytes(reinterpret_cast<const char*>(mine.data()), mine.size_bytes());
  std::vector<uint64_t> out;
  for (const std::string& b : gather_strings(bytes, root)) {
    SHARD_CHECK(b.size() == mine.size_bytes(), "gather_u64: a rank sent {} bytes, this one {}", b.size(),
                mine.size_bytes());
    size_t at = out.size();
    out.resize(at + mine.size());
    std::memcpy(out.data() + at, b.data(), b.size());
  }
  return out;
}

int64_t Communicator::all_max(int64_t v) {
  int64_t best = v;
  for (const std::string& b : all_gather_strings(std::string(reinterpret_cast<const char*>(&v), sizeof v))) {
    int64_t x = 0;
    SHARD_CHECK(b.size() == sizeof x, "all_max: a rank sent {} bytes", b.size());
    std::memcpy(&x, b.data(), sizeof x);
    best = std::max(best, x);
  }
  return best;
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, int size, int rank, CommAxis axis) {
  SHARD_CHECK(size >= 1 && size <= world_size() && rank >= 0 && rank < size,
              "split of a world of {}: rank {} of {}", world_size(), rank, size);
  std::unique_ptr<Communicator> c = do_split(color, key, size, rank);
  SHARD_CHECK(c->world_size() == size && c->rank() == rank,
              "split (color {}, key {}): rank {} of {}, the caller expected rank {} of {}", color, key, c->rank(),
              c->world_size(), rank, size);
  c->parent_ = this;
  c->axis_ = axis;
  c->check_ = check_;
  c->stats_.cost = stats_.cost;
  return c;
}

void Communicator::check_root(int root, const char* op) const {
  SHARD_CHECK(root >= 0 && root < world_size(), "{}: root {} outside world of {}", op, root, world_size());
}

Work Communicator::all_reduce(Tensor buf, ReduceOp op, Site site) {
  const uint64_t seq = enter(CommOp::all_reduce, buf, -1, op, site);
  return issue(seq, CommOp::all_reduce, buf.dtype(), static_cast<double>(buf.bytes()),
               [&] { return do_all_reduce(buf, op); });
}

Work Communicator::reduce_scatter(Tensor send, Tensor recv, ReduceOp op, Site site) {
  const uint64_t seq = enter(CommOp::reduce_scatter, send, -1, op, site);
  SHARD_CHECK(send.dtype() == recv.dtype(), "reduce_scatter: send {} vs recv {}", dtype_name(send.dtype()),
              dtype_name(recv.dtype()));
  SHARD_CHECK(send.numel() == recv.numel() * world_size(),
              "reduce_scatter: send has {} elements, expected world {} x recv {} = {}", send.numel(), world_size(),
              recv.numel(), recv.numel() * world_size());
  return issue(seq, CommOp::reduce_scatter, send.dtype(), static_cast<double>(send.bytes()),
               [&] { return do_reduce_scatter(send, recv, op); });
}

Work Communicator::all_gather(Tensor send, Tensor recv, Site site) {
  const uint64_t seq = enter(CommOp::all_gather, send, -1, ReduceOp::sum, site);
  SHARD_CHECK(send.dtype() == recv.dtype(), "all_gather: send {} vs recv {}", dtype_name(send.dtype()),
              dtype_name(recv.dtype()));
  SHARD_CHECK(recv.numel() == send.numel() * world_size(),
              "all_gather: recv has {} elements, expected world {} x send {} = {}", recv.numel(), world_size(),
              send.numel(), send.numel() * world_size());
  return issue(seq, CommOp::all_gather, send.dtype(), static_cast<double>(recv.bytes()),
               [&] { return do_all_gather(send, recv); });
}

Work Communicator::all_to_all(Tensor send, Tensor recv, Site site) {
  const uint64_t seq = enter(CommOp::all_to_all, send, -1, ReduceOp::sum, site);
  SHARD_CHECK(send.dtype() == recv.dtype() && send.numel() == recv.numel() && send.numel() % world_size() == 0,
              "all_to_all: send {} {} and recv {} {} must match and split into {} chunks", send.numel(),
              dtype_name(send.dtype()), recv.numel(), dtype_name(recv.dtype()), world_size());
  SHARD_CHECK(send.data() != recv.data() || send.numel() == 0, "all_to_all: send and recv are the same buffer");
  return issue(seq, CommOp::all_to_all, send.dtype(), static_cast<double>(send.bytes()),
               [&] { return do_all_to_all(send, recv); });
}

Work Communicator::broadcast(Tensor buf, int root, Site site) {
  const uint64_t seq = enter(CommOp::broadcast, buf, root, ReduceOp::sum, site);
  check_root(root, "broadcast");
  return issue(seq, CommOp::broadcast, buf.dtype(), static_cast<double>(buf.bytes()),
               [&] { return do_broadcast(buf, root); });
}

Work Communicator::reduce(Tensor send, Tensor recv, int root, ReduceOp op, Site site) {
  const uint64_t seq = enter(CommOp::reduce, send, root, op, site);
  check_root(root, "reduce");
  if (rank() == root) {
    SHARD_CHECK(send.dtype() == recv.dtype() && send.numel() == recv.numel(),
                "reduce: root's recv {} {} does not match send {} {}", dtype_name(recv.dtype()), recv.numel(),
                dtype_name(send.dtype()), send.numel());
  }
  return issue(seq, CommOp::reduce, send.dtype(), static_cast<double>(send.bytes()),
               [&] { return do_reduce(send, recv, root, op); });
}

Work Communicator::gather(Tensor send, Tensor recv, int root, Site site) {
  const uint64_t seq = enter(CommOp::gather, send, root, ReduceOp::sum, site);
  check_root(root, "gather");
  if (rank() == root)
    SHARD_CHECK(send.dtype() == recv.dtype() && recv.numel() == send.numel() * world_size(),
                "gather: root's recv has {} {} elements, expected world {} x send {} {}", recv.numel(),
                dtype_name(recv.dtype()), world_size(), send.numel(), dtype_name(send.dtype()));
  return issue(seq, CommOp::gather, send.dtype(), static_cast<double>(send.bytes()) * world_size(),
               [&] { return do_gather(send, recv, root); });
}

Work Communicator::scatter(Tensor send, Tensor recv, int root, Site site) {
  const uint64_t seq = enter(CommOp::scatter, recv, root, ReduceOp::sum, site);
  check_root(root, "scatter");
  if (rank() == root)
    SHARD_CHECK(send.dtype() == recv.dtype() && send.numel() == recv.numel() * world_size(),
                "scatter: root's send has {} {} elements, expected world {} x recv {} {}", send.numel(),
                dtype_name(send.dtype()), world_size(), recv.numel(), dtype_name(recv.dtype()));
  return issue(seq, CommOp::scatter, recv.dtype(), static_cast<double>(recv.bytes()) * world_size(),
               [&] { return do_scatter(send, recv, root); });
}

void Communicator::check_peer(int peer, const char* op) const {
  SHARD_CHECK(peer >= 0 && peer < world_size() && peer != rank(), "{}: peer {} from rank {} of a world of {}", op, peer,
              rank(), world_size());
}

void Communicator::post_control(int peer, const std::string& bytes) {
  check_peer(peer, "post_control");
  do_post_control(peer, bytes);
}

std::string Communicator::take_control(int peer) {
  check_peer(peer, "take_control");
  const uint64_t seq = blocks() && Watchdog::active() ? Watchdog::enter("control exchange") : 0;
  WatchdogWait waiting(seq);
  return do_take_control(peer);
}

uint64_t Communicator::enter_p2p(CommOp op, const Tensor& t, int peer, const Site& site) {
  check_peer(peer, comm_op_name(op));
  Fingerprint f = fingerprint_of(op, t, peer, ReduceOp::sum, site);
  const uint64_t seq = blocks() && Watchdog::active() ? Watchdog::enter(describe(f)) : 0;
  if (!check_) return seq;
  std::vector<uint64_t>& counter = op == CommOp::send ? sent_ : received_;
  counter.resize(static_cast<size_t>(world_size()), 0);
  f.seq = counter[static_cast<size_t>(peer)]++;
  if (op == CommOp::send) {
    do_post_control(peer, std::string(reinterpret_cast<const char*>(&f), sizeof f));
    return seq;
  }
  WatchdogWait waiting(seq);  // waiting for the sender's fingerprint blocks too
  const std::string bytes = do_take_control(peer);
  if (bytes.empty()) return seq;  // no real peer (sim)
  SHARD_CHECK(bytes.size() == sizeof(Fingerprint), "fingerprint from rank {}: {} bytes", peer, bytes.size());
  Fingerprint theirs{};
  std::memcpy(&theirs, bytes.data(), sizeof theirs);
  const bool same = theirs.op == static_cast<uint8_t>(CommOp::send) && theirs.root == rank() && theirs.seq == f.seq &&
                    theirs.count == f.count && theirs.dtype == f.dtype;
  if (!same)
    throw InternalError(fmt::format("point-to-point #{} from rank {} to rank {} differs (--check-collectives): "
                                    "rank {} issues {}, rank {} issues {}",
                                    f.seq, peer, rank(), peer, describe(theirs), rank(), describe(f)));
  return seq;
}

Work Communicator::send(Tensor buf, int peer, Site site) {
  const uint64_t seq = enter_p2p(CommOp::send, buf, peer, site);
  return issue(seq, CommOp::send, buf.dtype(), static_cast<double>(buf.bytes()), [&] { return do_send(buf, peer); });
}

Work Communicator::recv(Tensor buf, int peer, Site site) {
  const uint64_t seq = enter_p2p(CommOp::recv, buf, peer, site);
  return issue(seq, CommOp::recv, buf.dtype(), static_cast<double>(buf.bytes()), [&] { return do_recv(buf, peer); });
}

Work Communicator::barrier(Site site) {
  const uint64_t seq = enter(CommOp::barrier, Tensor(), -1, ReduceOp::sum, site);
  return issue(seq, CommOp::barrier, DType::f32, 0.0, [&] { return do_barrier(); });
}

}  // namespace shardlab
