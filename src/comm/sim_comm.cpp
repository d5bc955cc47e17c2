#include "src/comm/sim_comm.hpp"

namespace shardlab {
namespace {

class SimCommunicator final : public Communicator {
 public:
  SimCommunicator(int rank, int world, Pool& pool) : rank_(rank), world_(world), pool_(pool) {
    SHARD_REQUIRE(world >= 1, "sim communicator: world size must be at least 1, got {}", world);
    SHARD_REQUIRE(rank >= 0 && rank < world, "sim communicator: rank {} outside world of {}", rank, world);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "sim"; }

 protected:
  Work do_all_reduce(Tensor buf, ReduceOp op) override {
    if (op == ReduceOp::sum) scale_by_world(buf);
    return Work();
  }
  Work do_reduce_scatter(Tensor send, Tensor recv, ReduceOp op) override {
    be().copy(recv, send.slice(rank_ * recv.numel(), recv.numel()));  // a no-op when in place
    if (op == ReduceOp::sum) scale_by_world(recv);
    return Work();
  }
  Work do_all_gather(Tensor send, Tensor recv) override {
    for (int r = 0; r < world_; ++r) be().copy(recv.slice(r * send.numel(), send.numel()), send);
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
  Work do_broadcast(Tensor, int) override { return Work(); }
  Work do_reduce(Tensor send, Tensor recv, int root, ReduceOp op) override {
    if (rank_ != root) return Work();
    be().copy(recv, send);
    if (op == ReduceOp::sum) scale_by_world(recv);
    return Work();
  }
  Work do_barrier() override { return Work(); }

 private:
  Backend& be() { return pool_.backend(); }

  void scale_by_world(Tensor t) {
    if (world_ == 1) return;
    if (t.dtype() == DType::f32) {
      be().scale(t, static_cast<float>(world_));
      return;
    }
    Block wide = pool_.alloc(DType::f32, t.numel(), Category::comm_buffer, "sim reduction (f32)");
    Tensor w = wide.flat(DType::f32).slice(0, t.numel());
    be().cast(w, t);
    be().scale(w, static_cast<float>(world_));
    be().cast(t, w);
  }

  int rank_, world_;
  Pool& pool_;
};

}  // namespace

std::unique_ptr<Communicator> make_sim_communicator(int rank, int world, Pool& pool) {
  return std::make_unique<SimCommunicator>(rank, world, pool);
}

}  // namespace shardlab
