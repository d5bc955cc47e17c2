// mpi_comm.cpp — the MPI transport.
//
// f32 goes to MPI as MPI_FLOAT. bf16 and f16 have no MPI type: data movement (all-gather,
// broadcast) carries them as MPI_UINT16_T bit patterns, and reductions widen them to f32 in a
// staging buffer, reduce in f32, and round once when the work completes — a bf16 sum over N ranks
// is then as accurate as one rounding allows, where a 2-byte custom op would round N-1 times.
#include "src/comm/mpi_comm.hpp"

#include <array>
#include <climits>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "src/comm/mpi_runtime.hpp"

namespace shardlab {
namespace {

class MpiWork final : public WorkImpl {
 public:
  MpiWork(MPI_Request req, std::vector<Block> staging, std::function<void()> finish)
      : req_(req), staging_(std::move(staging)), finish_(std::move(finish)) {}
  bool test() override {
    if (completed_) return true;
    int flag = 0;
    MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    if (flag) complete();
    return flag != 0;
  }
  void wait() override {
    if (completed_) return;
    MPI_CHECK(MPI_Wait(&req_, MPI_STATUS_IGNORE));
    complete();
  }

 private:
  void complete() {
    completed_ = true;
    if (finish_) finish_();
    staging_.clear();
  }
  MPI_Request req_;
  std::vector<Block> staging_;  // lives exactly as long as the request that reads or writes it
  std::function<void()> finish_;
  bool completed_ = false;
};

int mpi_count(int64_t n, const char* op) {
  SHARD_CHECK(n <= INT_MAX, "{}: {} elements exceed MPI's int count; split the buffer", op, n);
  return static_cast<int>(n);
}

MPI_Datatype mpi_type(DType t) { return t == DType::f32 ? MPI_FLOAT : MPI_UINT16_T; }
MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::sum ? MPI_SUM : MPI_MAX; }
bool widened(DType t) { return t != DType::f32; }
void check_host(const Tensor& t, const char* op) {
  SHARD_CHECK(t.device() == Device::cpu, "{}: the mpi communicator takes host buffers, got a {} tensor", op,
              device_name(t.device()));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, Pool& pool) : pool_(pool) {
    MPI_CHECK(MPI_Comm_dup(comm, &comm_));
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &world_));
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      // A fingerprint nobody received (its receiver failed first) is withdrawn, not waited for.
      for (PostedControl& p : posted_) {
        int done = 0;
        MPI_Test(&p.req, &done, MPI_STATUS_IGNORE);
        if (!done) {
          MPI_Cancel(&p.req);
          MPI_Wait(&p.req, MPI_STATUS_IGNORE);
        }
      }
      MPI_Comm_free(&comm_);
      if (control_ != MPI_COMM_NULL) MPI_Comm_free(&control_);
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "mpi"; }
  bool blocks() const override { return true; }

 protected:
  double wire_factor(CommOp op, DType dtype) const override { return mpi_wire_factor(op, dtype); }

  std::unique_ptr<Communicator> do_split(int color, int key, int, int) override {
    MPI_Comm part = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(comm_, color, key, &part));
    auto c = std::make_unique<MpiCommunicator>(part, pool_);  // duplicates it
    MPI_CHECK(MPI_Comm_free(&part));
    return c;
  }

  // The control channel: a duplicate of the data communicator, so control messages never match
  // a data collective in flight.
  std::vector<std::string> exchange(const std::string& mine) override {
    if (control_ == MPI_COMM_NULL) MPI_CHECK(MPI_Comm_dup(comm_, &control_));
    int len = mpi_count(static_cast<int64_t>(mine.size()), "control exchange");
    std::vector<int> lens(static_cast<size_t>(world_)), offs(static_cast<size_t>(world_));
    MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, control_));
    int64_t total = 0;
    for (int r = 0; r < world_; ++r) offs[r] = mpi_count(total, "control exchange"), total += lens[r];
    std::string all(static_cast<size_t>(mpi_count(total, "control exchange")), '\0');
    MPI_CHECK(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, control_));
    std::vector<std::string> out;
    for (int r = 0; r < world_; ++r) out.push_back(all.substr(static_cast<size_t>(offs[r]), static_cast<size_t>(lens[r])));
    return out;
  }

  // Point-to-point control: on the data communicator under a tag of its own (duplicating a
  // communicator for it would be collective over ranks that take no part). The bytes are kept
  // with their request until MPI is done with them, so posting never waits for the peer.
  void do_post_control(int peer, const std::string& bytes) override {
    std::erase_if(posted_, [](PostedControl& p) {
      int done = 0;
      MPI_CHECK(MPI_Test(&p.req, &done, MPI_STATUS_IGNORE));
      return done != 0;
    });
    posted_.push_back({std::make_unique<std::string>(bytes), MPI_REQUEST_NULL});
    const std::string& b = *posted_.back().bytes;
    MPI_CHECK(MPI_Isend(b.data(), mpi_count(static_cast<int64_t>(b.size()), "post_control"), MPI_CHAR, peer, kControlTag,
                        comm_, &posted_.back().req));
  }
  std::string do_take_control(int peer) override {
    MPI_Status st;
    MPI_CHECK(MPI_Probe(peer, kControlTag, comm_, &st));
    int n = 0;
    MPI_CHECK(MPI_Get_count(&st, MPI_CHAR, &n));
    std::string out(static_cast<size_t>(n), '\0');
    MPI_CHECK(MPI_Recv(out.data(), n, MPI_CHAR, peer, kControlTag, comm_, MPI_STATUS_IGNORE));
    return out;
  }

  Work do_all_reduce(Tensor buf, ReduceOp op) override {
    check_host(buf, "all_reduce");
    int n = mpi_count(buf.numel(), "all_reduce");
    MPI_Request req;
    if (!widened(buf.dtype())) {
      MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, mpi_op(op), comm_, &req));
      return make_work(req, {}, nullptr);
    }
    Block wide = widen(buf, "all_reduce");
    float* w = static_cast<float*>(wide.data());
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, w, n, MPI_FLOAT, mpi_op(op), comm_, &req));
    auto finish = [w, buf] { convert(w, DType::f32, buf.data(), buf.dtype(), static_cast<size_t>(buf.numel())); };
    std::vector<Block> staging;
    staging.push_back(std::move(wide));
    return make_work(req, std::move(staging), finish);
  }

  Work do_reduce_scatter(Tensor send, Tensor recv, ReduceOp op) override {
    check_host(send, "reduce_scatter");
    check_host(recv, "reduce_scatter");
    int n = mpi_count(recv.numel(), "reduce_scatter");
    mpi_count(send.numel(), "reduce_scatter");
    MPI_Request req;
    if (!widened(send.dtype())) {
      if (recv.data() != send.slice(static_cast<int64_t>(rank_) * n, n).data()) {
        MPI_CHECK(MPI_Ireduce_scatter_block(send.data(), recv.data(), n, MPI_FLOAT, mpi_op(op), comm_, &req));
        return make_work(req, {}, nullptr);
      }
      // In place, MPI leaves the result at the start of the buffer; move it to this rank's chunk.
      MPI_CHECK(MPI_Ireduce_scatter_block(MPI_IN_PLACE, send.data(), n, MPI_FLOAT, mpi_op(op), comm_, &req));
      auto finish = [send, recv, n] {
        if (recv.data() != send.data()) std::memmove(recv.data(), send.data(), static_cast<size_t>(n) * sizeof(float));
      };
      return make_work(req, {}, finish);
    }
    Block wide_send = widen(send, "reduce_scatter send");
    Block wide_recv = pool_.alloc(DType::f32, recv.numel(), Category::comm_buffer, "mpi reduce_scatter recv (f32)");
    float* r = static_cast<float*>(wide_recv.data());
    MPI_CHECK(MPI_Ireduce_scatter_block(wide_send.data(), r, n, MPI_FLOAT, mpi_op(op), comm_, &req));
    auto finish = [r, recv] { convert(r, DType::f32, recv.data(), recv.dtype(), static_cast<size_t>(recv.numel())); };
    std::vector<Block> staging;
    staging.push_back(std::move(wide_send));
    staging.push_back(std::move(wide_recv));
    return make_work(req, std::move(staging), finish);
  }

  Work do_all_gather(Tensor send, Tensor recv) override {
    check_host(send, "all_gather");
    check_host(recv, "all_gather");
    int n = mpi_count(send.numel(), "all_gather");
    mpi_count(recv.numel(), "all_gather");
    MPI_Datatype t = mpi_type(send.dtype());
    MPI_Request req;
    bool in_place = send.data() == recv.slice(static_cast<int64_t>(rank_) * n, n).data();
    MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send.data(), n, t, recv.data(), n, t, comm_, &req));
    return make_work(req, {}, nullptr);
  }

  Work do_all_to_all(Tensor send, Tensor recv) override {
    check_host(send, "all_to_all");
    check_host(recv, "all_to_all");
    int n = mpi_count(send.numel() / world_size(), "all_to_all");
    MPI_Datatype t = mpi_type(send.dtype());
    MPI_Request req;
    MPI_CHECK(MPI_Ialltoall(send.data(), n, t, recv.data(), n, t, comm_, &req));
    return make_work(req, {}, nullptr);
  }

  Work do_all_to_all_v(Tensor send, std::span<const int64_t> send_counts, Tensor recv,
                       std::span<const int64_t> recv_counts) override {
    check_host(send, "all_to_all_v");
    check_host(recv, "all_to_all_v");
    // Counts and displacements in elements, kept alive until the request completes.
    auto arrays = std::make_shared<std::array<std::vector<int>, 4>>();
    auto& [sc, sd, rc, rd] = *arrays;
    int64_t s_at = 0, r_at = 0;
    for (int j = 0; j < world_size(); ++j) {
      sc.push_back(mpi_count(send_counts[j], "all_to_all_v")), sd.push_back(mpi_count(s_at, "all_to_all_v"));
      rc.push_back(mpi_count(recv_counts[j], "all_to_all_v")), rd.push_back(mpi_count(r_at, "all_to_all_v"));
      s_at += send_counts[j], r_at += recv_counts[j];
    }
    MPI_Datatype t = mpi_type(send.dtype());
    MPI_Request req;
    MPI_CHECK(MPI_Ialltoallv(send.data(), sc.data(), sd.data(), t, recv.data(), rc.data(), rd.data(), t, comm_, &req));
    return make_work(req, {}, [arrays] {});
  }

  Work do_gather(Tensor send, Tensor recv, int root) override {
    check_host(send, "gather");
    int n = mpi_count(send.numel(), "gather");
    MPI_Datatype t = mpi_type(send.dtype());
    MPI_Request req;
    MPI_CHECK(MPI_Igather(send.data(), n, t, rank_ == root ? recv.data() : nullptr, n, t, root, comm_, &req));
    return make_work(req, {}, nullptr);
  }

  Work do_scatter(Tensor send, Tensor recv, int root) override {
    check_host(recv, "scatter");
    int n = mpi_count(recv.numel(), "scatter");
    MPI_Datatype t = mpi_type(recv.dtype());
    MPI_Request req;
    MPI_CHECK(MPI_Iscatter(rank_ == root ? send.data() : nullptr, n, t, recv.data(), n, t, root, comm_, &req));
    return make_work(req, {}, nullptr);
  }

  Work do_broadcast(Tensor buf, int root) override {
    check_host(buf, "broadcast");
    int n = mpi_count(buf.numel(), "broadcast");
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(buf.data(), n, mpi_type(buf.dtype()), root, comm_, &req));
    return make_work(req, {}, nullptr);
  }

  Work do_reduce(Tensor send, Tensor recv, int root, ReduceOp op) override {
    check_host(send, "reduce");
    int n = mpi_count(send.numel(), "reduce");
    bool is_root = rank_ == root;
    MPI_Request req;
    if (!widened(send.dtype())) {
      const void* s = is_root && send.data() == recv.data() ? MPI_IN_PLACE : send.data();
      MPI_CHECK(MPI_Ireduce(s, is_root ? recv.data() : nullptr, n, MPI_FLOAT, mpi_op(op), root, comm_, &req));
      return make_work(req, {}, nullptr);
    }
    std::vector<Block> staging;
    staging.push_back(widen(send, "reduce send"));
    float* r = nullptr;
    if (is_root) {
      staging.push_back(pool_.alloc(DType::f32, send.numel(), Category::comm_buffer, "mpi reduce recv (f32)"));
      r = static_cast<float*>(staging.back().data());
    }
    MPI_CHECK(MPI_Ireduce(staging.front().data(), r, n, MPI_FLOAT, mpi_op(op), root, comm_, &req));
    std::function<void()> finish;
    if (is_root)
      finish = [r, recv] { convert(r, DType::f32, recv.data(), recv.dtype(), static_cast<size_t>(recv.numel())); };
    return make_work(req, std::move(staging), finish);
  }

  Work do_barrier() override {
    MPI_Request req;
    MPI_CHECK(MPI_Ibarrier(comm_, &req));
    return make_work(req, {}, nullptr);
  }

  // Point to point: bf16/f16 travel as their bit patterns. MPI keeps the order of messages with one
  // (source, tag, communicator), which is the order Communicator::send promises.
  Work do_send(Tensor buf, int peer) override {
    check_host(buf, "send");
    MPI_Request req;
    MPI_CHECK(MPI_Isend(buf.data(), mpi_count(buf.numel(), "send"), mpi_type(buf.dtype()), peer, kDataTag, comm_, &req));
    return make_work(req, {}, nullptr);
  }
  Work do_recv(Tensor buf, int peer) override {
    check_host(buf, "recv");
    MPI_Request req;
    MPI_CHECK(MPI_Irecv(buf.data(), mpi_count(buf.numel(), "recv"), mpi_type(buf.dtype()), peer, kDataTag, comm_, &req));
    return make_work(req, {}, nullptr);
  }

 private:
  static Work make_work(MPI_Request req, std::vector<Block> staging, std::function<void()> finish) {
    return Work(std::make_unique<MpiWork>(req, std::move(staging), std::move(finish)));
  }

  // An f32 copy of a bf16/f16 host tensor, from the pool.
  Block widen(const Tensor& t, const char* what) {
    Block b = pool_.alloc(DType::f32, t.numel(), Category::comm_buffer, fmt::format("mpi {} (f32)", what));
    convert(t.data(), t.dtype(), b.data(), DType::f32, static_cast<size_t>(t.numel()));
    return b;
  }

  static constexpr int kDataTag = 0, kControlTag = 1;
  struct PostedControl {
    std::unique_ptr<std::string> bytes;  // stays where MPI reads it until the request completes
    MPI_Request req;
  };
  std::vector<PostedControl> posted_;
  Pool& pool_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm control_ = MPI_COMM_NULL;
  int rank_ = 0, world_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, Pool& pool) {
  return std::make_unique<MpiCommunicator>(comm, pool);
}

}  // namespace shardlab
