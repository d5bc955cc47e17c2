#include "src/comm/sim_comm.hpp"

#include <functional>
#include <utility>

namespace shardlab {
namespace {

// A reduction whose f32 staging lives until it is waited on, when the result is written back.
class SimWork final : public WorkImpl {
 public:
  SimWork(std::vector<Block> staging, std::function<void()> finish)
      : staging_(std::move(staging)), finish_(std::move(finish)) {}
  bool test() override {
    wait();
    return true;
  }
  void wait() override {
    if (finish_) std::exchange(finish_, nullptr)();
    staging_.clear();
  }

 private:
  std::vector<Block> staging_;
  std::function<void()> finish_;
};

class SimCommunicator final : public Communicator {
 public:
  SimCommunicator(int rank, int world, Pool& pool, SimTransport transport)
      : rank_(rank), world_(world), pool_(pool), transport_(transport) {
    // The GPU transports stage nothing in the rank's pool (NCCL reduces bf16 natively; staged
    // keeps its host copies to itself): the sim widens in a pool of its own then.
    if (transport == SimTransport::gpu) private_ = std::make_unique<Pool>(pool.backend());
    SHARD_REQUIRE(world >= 1, "sim communicator: world size must be at least 1, got {}", world);
    SHARD_REQUIRE(rank >= 0 && rank < world, "sim communicator: rank {} outside world of {}", rank, world);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "sim"; }

 protected:
  double wire_factor(CommOp op, DType dtype) const override { return mpi_wire_factor(op, dtype); }
  std::vector<std::string> exchange(const std::string& mine) override {
    return std::vector<std::string>(static_cast<size_t>(world_), mine);
  }

  Work do_all_reduce(Tensor buf, ReduceOp op) override {
    return reduction(buf, buf, buf, op, Receives::in_place, "all_reduce");
  }
  Work do_reduce_scatter(Tensor send, Tensor recv, ReduceOp op) override {
    return reduction(send, send.slice(rank_ * recv.numel(), recv.numel()), recv, op, Receives::staged, "reduce_scatter");
  }
  Work do_reduce(Tensor send, Tensor recv, int root, ReduceOp op) override {
    return reduction(send, send, recv, op, rank_ == root ? Receives::staged : Receives::nothing, "reduce");
  }
  Work do_all_gather(Tensor send, Tensor recv) override {
    for (int r = 0; r < world_; ++r) be().copy(recv.slice(r * send.numel(), send.numel()), send);
    return Work();
  }
  // Every peer sends this rank what it would send itself: its own chunk, in every slot.
  Work do_all_to_all(Tensor send, Tensor recv) override {
    const int64_t c = send.numel() / world_, at = rank_ * c;
    for (int r = 0; r < world_; ++r) be().copy(recv.slice(r * c, c), send.slice(at, c));
    return Work();
  }
  // The peers' chunks are unknown here: zeros, and this rank's own chunk where it keeps it.
  Work do_all_to_all_v(Tensor send, std::span<const int64_t> send_counts, Tensor recv,
                       std::span<const int64_t> recv_counts) override {
    be().fill(recv, 0.f);
    int64_t s_at = 0, r_at = 0;
    for (int j = 0; j < rank_; ++j) s_at += send_counts[j], r_at += recv_counts[j];
    be().copy(recv.slice(r_at, recv_counts[rank_]), send.slice(s_at, send_counts[rank_]));
    return Work();
  }
  Work do_gather(Tensor send, Tensor recv, int root) override {
    if (rank_ == root)
      for (int r = 0; r < world_; ++r) be().copy(recv.slice(r * send.numel(), send.numel()), send);
    return Work();
  }
  Work do_scatter(Tensor send, Tensor recv, int root) override {
    if (rank_ == root) be().copy(recv, send.slice(rank_ * recv.numel(), recv.numel()));
    return Work();
  }
  // The group is imaginary like the world: rank `rank` of `size`, the others holding what it holds.
  std::unique_ptr<Communicator> do_split(int, int, int size, int rank) override {
    return std::make_unique<SimCommunicator>(rank, size, pool_, transport_);
  }
  Work do_broadcast(Tensor, int) override { return Work(); }
  Work do_barrier() override { return Work(); }
  // The peer sends what this rank would send: a receive leaves buf as it is, a send moves nothing.
  Work do_send(Tensor, int) override { return Work(); }
  Work do_recv(Tensor, int) override { return Work(); }
  // No real peer: nothing is posted, and nothing comes to compare (--check-collectives).
  void do_post_control(int, const std::string&) override {}
  std::string do_take_control(int) override { return {}; }

 private:
  Backend& be() { return pool_.backend(); }
  // Host buffers (a loss, a gradient norm) are reduced on the host even when the ranks compute on a
  // GPU: a kernel given one would read host memory (an illegal address on CUDA).
  bool on_device(const Tensor& t) { return t.device() == be().device() || t.data() == nullptr; }
  Backend& on(const Tensor& t) { return on_device(t) ? be() : be().host(); }
  Pool& staging_pool() { return private_ ? *private_ : pool_; }

  // How MPI receives a widened reduction: into the widened send buffer (all_reduce), into an f32
  // buffer of its own (reduce_scatter; reduce at the root, even in place), or not at all.
  enum class Receives { in_place, staged, nothing };

  // recv <- (sum: N x, max: 1 x) `mine`, this rank's contribution (part of send), where this rank
  // receives; staged in f32 as MPI stages it when the dtype is not f32.
  Work reduction(Tensor send, Tensor mine, Tensor recv, ReduceOp op, Receives receives, const char* what) {
    const float factor = op == ReduceOp::sum ? static_cast<float>(world_) : 1.f;
    if (mine.dtype() == DType::f32) {
      if (receives != Receives::nothing) {
        if (recv.data() != mine.data()) be().copy(recv, mine);
        if (factor != 1.f) on(recv).scale(recv, factor);
      }
      return Work();
    }
    SHARD_CHECK(be().device() != Device::cuda || (on_device(send) && on_device(recv)),
                "sim {}: a {} reduction of host buffers (only f32 ones are reduced on the host)", what,
                dtype_name(send.dtype()));
    std::vector<Block> staging;
    staging.push_back(staging_pool().alloc(DType::f32, send.numel(), Category::comm_buffer, fmt::format("sim {} send (f32)", what)));
    Tensor wide_send = staging.back().flat(DType::f32).slice(0, send.numel());
    be().cast(wide_send, send);
    if (receives == Receives::nothing) return Work(std::make_unique<SimWork>(std::move(staging), nullptr));
    Tensor wide_mine = wide_send.slice((static_cast<const char*>(mine.data()) - static_cast<const char*>(send.data())) /
                                           static_cast<int64_t>(dtype_size(send.dtype())),
                                       mine.numel());
    Tensor wide_recv = wide_send;
    if (receives == Receives::staged) {
      staging.push_back(staging_pool().alloc(DType::f32, recv.numel(), Category::comm_buffer, fmt::format("sim {} recv (f32)", what)));
      wide_recv = staging.back().flat(DType::f32).slice(0, recv.numel());
      be().copy(wide_recv, wide_mine);
    }
    auto finish = [this, wide_recv, recv, factor] {
      if (factor != 1.f) be().scale(wide_recv, factor);
      be().cast(recv, wide_recv);
    };
    return Work(std::make_unique<SimWork>(std::move(staging), finish));
  }

  int rank_, world_;
  Pool& pool_;
  SimTransport transport_;
  std::unique_ptr<Pool> private_;  // staging outside the rank's ledger (SimTransport::gpu)
};

}  // namespace

std::unique_ptr<Communicator> make_sim_communicator(int rank, int world, Pool& pool, SimTransport transport) {
  return std::make_unique<SimCommunicator>(rank, world, pool, transport);
}

}  // namespace shardlab
