// staged_comm.cpp — the staged transport (see staged_comm.hpp).
//
// Design notes.
//  * The MPI work is done by an mpi communicator over host buffers (`mpi_`, see mpi_backed.hpp), so
//    widening bf16/f16 reductions to f32 and the watchdog's records are the mpi transport's own.
//  * A device input is copied to the host before MPI sees it; Backend::copy synchronises the
//    compute stream whenever host memory is involved, so the input is complete when copied.
//  * Results go back to the device in Work::wait (or when test() finds the MPI request done).
//    Until then the device buffer is untouched, exactly as with the mpi transport's results.
#include "src/comm/staged_comm.hpp"

#include <functional>
#include <vector>

#include "src/comm/mpi_backed.hpp"

namespace shardlab {
namespace {

// A host buffer for one device tensor of a collective, freed with the Work that uses it.
class HostStage {
 public:
  HostStage(Backend& be, const Tensor& like) : be_(&be), bytes_(like.bytes()), dtype_(like.dtype()), n_(like.numel()) {
    p_ = be.raw_alloc_host(bytes_);
  }
  HostStage(HostStage&& o) noexcept : be_(o.be_), p_(o.p_), bytes_(o.bytes_), dtype_(o.dtype_), n_(o.n_) {
    o.p_ = nullptr;
  }
  HostStage(const HostStage&) = delete;
  HostStage& operator=(const HostStage&) = delete;
  HostStage& operator=(HostStage&&) = delete;
  ~HostStage() {
    if (p_) be_->raw_free_host(p_, bytes_);
  }
  Tensor view() const { return Tensor::flat(p_, dtype_, n_, Device::cpu); }

 private:
  Backend* be_;
  void* p_ = nullptr;
  size_t bytes_;
  DType dtype_;
  int64_t n_;
};

class StagedWork final : public WorkImpl {
 public:
  StagedWork(Work mpi, std::vector<HostStage> stages, std::function<void()> finish)
      : mpi_(std::move(mpi)), stages_(std::move(stages)), finish_(std::move(finish)) {}
  bool test() override {
    if (!completed_ && mpi_.done()) complete();
    return completed_;
  }
  void wait() override {
    if (completed_) return;
    mpi_.wait();
    complete();
  }

 private:
  void complete() {
    completed_ = true;
    if (finish_) finish_();
    stages_.clear();
  }
  Work mpi_;
  std::vector<HostStage> stages_;  // live exactly as long as the MPI request that reads or writes them
  std::function<void()> finish_;
  bool completed_ = false;
};

class StagedCommunicator final : public MpiBackedCommunicator {
 public:
  StagedCommunicator(MPI_Comm comm, Backend& be) : MpiBackedCommunicator(comm, be) {}
  std::string name() const override { return "staged"; }

 protected:
  // The mpi communicator inside watches its own calls (it blocks); this one only stages.
  double wire_factor(CommOp op, DType dtype) const override { return mpi_wire_factor(op, dtype); }
  std::unique_ptr<Communicator> same_kind(MPI_Comm comm) override {
    return std::make_unique<StagedCommunicator>(comm, be_);
  }

  Work do_all_reduce(Tensor buf, ReduceOp op) override {
    Call c(*this);
    Tensor h = c.in(buf);
    return c.done(mpi_->all_reduce(h, op), {{buf, h}});
  }
  Work do_reduce_scatter(Tensor send, Tensor recv, ReduceOp op) override {
    Call c(*this);
    Tensor hs = c.in(send), hr = c.out(recv);
    return c.done(mpi_->reduce_scatter(hs, hr, op), {{recv, hr}});
  }
  Work do_all_gather(Tensor send, Tensor recv) override {
    Call c(*this);
    Tensor hs = c.in(send), hr = c.out(recv);
    return c.done(mpi_->all_gather(hs, hr), {{recv, hr}});
  }
  Work do_all_to_all(Tensor send, Tensor recv) override {
    Call c(*this);
    Tensor hs = c.in(send), hr = c.out(recv);
    return c.done(mpi_->all_to_all(hs, hr), {{recv, hr}});
  }
  Work do_all_to_all_v(Tensor send, std::span<const int64_t> send_counts, Tensor recv,
                       std::span<const int64_t> recv_counts) override {
    Call c(*this);
    Tensor hs = c.in(send), hr = c.out(recv);
    return c.done(mpi_->all_to_all_v(hs, send_counts, hr, recv_counts), {{recv, hr}});
  }
  Work do_broadcast(Tensor buf, int root) override {
    Call c(*this);
    Tensor h = rank() == root ? c.in(buf) : c.out(buf);
    return c.done(mpi_->broadcast(h, root), {{buf, h}});
  }
  Work do_reduce(Tensor send, Tensor recv, int root, ReduceOp op) override {
    Call c(*this);
    Tensor hs = c.in(send);
    if (rank() != root) return c.done(mpi_->reduce(hs, Tensor(), root, op), {});
    Tensor hr = send.data() == recv.data() ? hs : c.out(recv);  // in place at the root
    return c.done(mpi_->reduce(hs, hr, root, op), {{recv, hr}});
  }
  Work do_gather(Tensor send, Tensor recv, int root) override {
    Call c(*this);
    Tensor hs = c.in(send);
    if (rank() != root) return c.done(mpi_->gather(hs, Tensor(), root), {});
    Tensor hr = c.out(recv);
    return c.done(mpi_->gather(hs, hr, root), {{recv, hr}});
  }
  Work do_scatter(Tensor send, Tensor recv, int root) override {
    Call c(*this);
    Tensor hs = rank() == root ? c.in(send) : Tensor();
    Tensor hr = c.out(recv);
    return c.done(mpi_->scatter(hs, hr, root), {{recv, hr}});
  }
  Work do_barrier() override { return mpi_->barrier(); }
  Work do_send(Tensor buf, int peer) override {
    Call c(*this);
    Tensor h = c.in(buf);
    return c.done(mpi_->send(h, peer), {});
  }
  Work do_recv(Tensor buf, int peer) override {
    Call c(*this);
    Tensor h = c.out(buf);
    return c.done(mpi_->recv(h, peer), {{buf, h}});
  }

 private:
  // One collective's staging: the host views MPI works on, and where results go back to.
  struct Call {
    explicit Call(StagedCommunicator& c) : self(c) {}
    bool on_device(const Tensor& t) const { return t.data() && t.device() == self.be_.device(); }
    Tensor out(const Tensor& t) {  // a host buffer MPI writes into
      if (!on_device(t)) return t;
      stages.emplace_back(self.be_, t);
      return stages.back().view();
    }
    Tensor in(const Tensor& t) {  // a host copy of a device input
      Tensor h = out(t);
      if (h.data() != t.data()) self.be_.copy(h, t);
      return h;
    }
    // Results (device tensor, its host stage) are copied back once the MPI work completes.
    Work done(Work mpi, std::vector<std::pair<Tensor, Tensor>> results) {
      std::erase_if(results, [](const auto& r) { return r.first.data() == r.second.data(); });
      if (stages.empty()) return mpi;
      Backend& be = self.be_;
      auto finish = [&be, results] {
        for (const auto& [dev, host] : results) be.copy(dev, host);
      };
      return Work(std::make_unique<StagedWork>(std::move(mpi), std::move(stages), finish));
    }
    StagedCommunicator& self;
    std::vector<HostStage> stages;
  };
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(MPI_Comm comm, Backend& be) {
  return std::make_unique<StagedCommunicator>(comm, be);
}

}  // namespace shardlab
