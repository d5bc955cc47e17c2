// nccl_comm.cpp — the NCCL transport (see nccl_comm.hpp). Host code; needs CUDA and NCCL.
//
// Design notes.
//  * Why events and not a host sync: a host sync after each collective would stall the CPU thread
//    that issues the next unit's kernels, and ZeRO-3's prefetch would overlap nothing. The comm
//    stream waits on the compute stream's event, NCCL runs, and an event on the comm stream is what
//    the compute stream waits on in Work::wait. A Block freed after wait() is freed on the compute
//    stream (stream-ordered), hence after the collective that used it.
//  * Failing loudly: every NCCL call is checked; on failure the communicator is aborted
//    (ncclCommAbort, so no rank stays blocked in it) and the error names this rank, the collective
//    and NCCL's last message. test() also polls ncclCommGetAsyncError.
//  * NCCL has no gather or scatter: they are grouped point-to-point sends and receives.
//  * Sends and receives are held, then issued together in one ncclGroupStart/End. An ungrouped
//    ncclSend is a kernel that completes only once the peer runs the matching ncclRecv, and a comm
//    stream runs its kernels in order: two pipeline stages that each send before they receive
//    (1F1B's steady state: an activation goes forward while a gradient comes back) would both
//    stall in their sends, each peer's receive queued behind its own send (for messages past
//    NCCL's buffers). Held calls go out as one group (Megatron's batch_isend_irecv) when one of
//    their Works is waited for or tested, or before any other call of this communicator. Calls to
//    one peer keep their order, which is how NCCL matches them.
#include "src/comm/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <nccl.h>
#include <nvtx3/nvToolsExt.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "src/backend/cuda/cuda_check.hpp"
#include "src/comm/mpi_backed.hpp"
#include "src/comm/mpi_runtime.hpp"

namespace shardlab {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
  }
  return ncclFloat32;
}
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }

// Communicators aborted after an error: their handles are gone, so their owners must not destroy them.
std::mutex g_aborted_mutex;
std::set<ncclComm_t> g_aborted;
bool aborted(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(g_aborted_mutex);
  return g_aborted.count(comm) != 0;
}

// Aborts the communicator, then reports through the common reporter (rank, device, file:line).
void nccl_failed(ncclComm_t comm, ncclResult_t st, const char* call, const char* what, const char* file, int line) {
  std::string last = comm ? ncclGetLastError(comm) : "";
  if (comm && !aborted(comm)) {
    ncclCommAbort(comm);
    std::lock_guard<std::mutex> lock(g_aborted_mutex);
    g_aborted.insert(comm);
  }
  check_failed(call, file, line,
               fmt::format("NCCL error in {}: {} ({}){}{}", what, static_cast<int>(st), ncclGetErrorString(st),
                           last.empty() ? "" : ": ", last));
}

#define NCCL_CHECK(comm, what, call)                                                   \
  do {                                                                                 \
    ncclResult_t st_ = (call);                                                         \
    if (st_ != ncclSuccess) [[unlikely]]                                               \
      nccl_failed(comm, st_, #call, what, __FILE__, __LINE__);                         \
  } while (0)

class NcclWork final : public WorkImpl {
 public:
  NcclWork(ncclComm_t comm, cudaStream_t compute, cudaEvent_t done, const char* what)
      : comm_(comm), compute_(compute), done_(done), what_(what) {}
  ~NcclWork() override { cudaEventDestroy(done_); }
  bool test() override {
    if (waited_) return true;
    cudaError_t st = cudaEventQuery(done_);
    if (st == cudaErrorNotReady) {
      ncclResult_t async = ncclSuccess;
      NCCL_CHECK(comm_, what_, ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress) nccl_failed(comm_, async, "(asynchronous)", what_, __FILE__, __LINE__);
      return false;
    }
    CUDA_CHECK(st);
    wait();
    return true;
  }
  // The compute stream waits; the host does not.
  void wait() override {
    if (waited_) return;
    CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
    waited_ = true;
  }

 private:
  ncclComm_t comm_;
  cudaStream_t compute_;
  cudaEvent_t done_;
  const char* what_;
  bool waited_ = false;
};

// A send or receive held by the communicator (see the design notes): wait() and test() issue it,
// with every other held call, first.
struct HeldSlot {
  std::function<void()> flush;  // issues every held call of the communicator
  std::unique_ptr<WorkImpl> issued;
};
class HeldWork final : public WorkImpl {
 public:
  explicit HeldWork(std::shared_ptr<HeldSlot> slot) : slot_(std::move(slot)) {}
  bool test() override { return issued().test(); }
  bool progress() override { return slot_->issued && slot_->issued->test(); }  // never issues the group
  void wait() override { issued().wait(); }

 private:
  WorkImpl& issued() {
    if (!slot_->issued) slot_->flush();
    SHARD_CHECK(slot_->issued != nullptr, "nccl communicator: a held send or receive was never issued");
    return *slot_->issued;
  }
  std::shared_ptr<HeldSlot> slot_;
};

class NcclCommunicator final : public MpiBackedCommunicator {
 public:
  NcclCommunicator(MPI_Comm comm, Backend& be) : MpiBackedCommunicator(comm, be) {
    SHARD_REQUIRE(be.device() == Device::cuda, "--comm nccl needs --device cuda (the backend is {})",
                  device_name(be.device()));
    compute_ = static_cast<cudaStream_t>(be.native_stream(StreamKind::compute));
    stream_ = static_cast<cudaStream_t>(be.native_stream(StreamKind::comm));
    check_one_rank_per_device();
    ncclUniqueId id{};
    if (rank() == 0) NCCL_CHECK(nullptr, "ncclGetUniqueId", ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm_));
    CUDA_CHECK(cudaSetDevice(be.device_index()));
    NCCL_CHECK(nullptr, "ncclCommInitRank", ncclCommInitRank(&nccl_, world_size(), id, rank()));
  }
  ~NcclCommunicator() override {
    for (Held& h : held_) h.slot->flush = [] {};  // never waited for: a bug the check in HeldWork names
    if (nccl_ && !aborted(nccl_)) {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(nccl_);
    }
  }
  std::string name() const override { return "nccl"; }

 protected:
  std::unique_ptr<Communicator> same_kind(MPI_Comm comm) override {
    return std::make_unique<NcclCommunicator>(comm, be_);
  }

  Work do_all_reduce(Tensor buf, ReduceOp op) override {
    if (on_host(buf)) return mpi_->all_reduce(buf, op);
    return issue("all_reduce", [&] {
      return ncclAllReduce(buf.data(), buf.data(), count(buf), nccl_type(buf.dtype()), nccl_op(op), nccl_, stream_);
    });
  }
  Work do_reduce_scatter(Tensor send, Tensor recv, ReduceOp op) override {
    if (on_host(send, recv)) return mpi_->reduce_scatter(send, recv, op);
    // In place when recv is chunk `rank` of send: NCCL's own in-place rule.
    return issue("reduce_scatter", [&] {
      return ncclReduceScatter(send.data(), recv.data(), count(recv), nccl_type(recv.dtype()), nccl_op(op), nccl_,
                               stream_);
    });
  }
  Work do_all_gather(Tensor send, Tensor recv) override {
    if (on_host(send, recv)) return mpi_->all_gather(send, recv);
    return issue("all_gather", [&] {
      return ncclAllGather(send.data(), recv.data(), count(send), nccl_type(send.dtype()), nccl_, stream_);
    });
  }
  Work do_broadcast(Tensor buf, int root) override {
    if (on_host(buf)) return mpi_->broadcast(buf, root);
    return issue("broadcast", [&] {
      return ncclBroadcast(buf.data(), buf.data(), count(buf), nccl_type(buf.dtype()), root, nccl_, stream_);
    });
  }
  Work do_reduce(Tensor send, Tensor recv, int root, ReduceOp op) override {
    const bool is_root = rank() == root;
    if (on_host(send, is_root ? recv : send)) return mpi_->reduce(send, recv, root, op);
    return issue("reduce", [&] {
      return ncclReduce(send.data(), is_root ? recv.data() : nullptr, count(send), nccl_type(send.dtype()),
                        nccl_op(op), root, nccl_, stream_);
    });
  }
  Work do_gather(Tensor send, Tensor recv, int root) override {
    const bool is_root = rank() == root;
    if (on_host(send, is_root ? recv : send)) return mpi_->gather(send, recv, root);
    return issue("gather", [&] { return root_exchange(true, recv, send, root); });
  }
  Work do_scatter(Tensor send, Tensor recv, int root) override {
    const bool is_root = rank() == root;
    if (on_host(recv, is_root ? send : recv)) return mpi_->scatter(send, recv, root);
    return issue("scatter", [&] { return root_exchange(false, send, recv, root); });
  }
  Work do_all_to_all(Tensor send, Tensor recv) override {
    if (on_host(send, recv)) return mpi_->all_to_all(send, recv);
    return issue("all_to_all", [&] {
      const size_t n = count(send) / static_cast<size_t>(world_size()), bytes = send.bytes() / world_size();
      const ncclDataType_t t = nccl_type(send.dtype());
      ncclResult_t st = ncclGroupStart();
      for (int r = 0; r < world_size() && st == ncclSuccess; ++r) {
        st = ncclSend(static_cast<const char*>(send.data()) + r * bytes, n, t, r, nccl_, stream_);
        if (st == ncclSuccess) st = ncclRecv(static_cast<char*>(recv.data()) + r * bytes, n, t, r, nccl_, stream_);
      }
      const ncclResult_t end = ncclGroupEnd();
      return st != ncclSuccess ? st : end;
    });
  }
  Work do_all_to_all_v(Tensor send, std::span<const int64_t> send_counts, Tensor recv,
                       std::span<const int64_t> recv_counts) override {
    if (on_host(send, recv)) return mpi_->all_to_all_v(send, send_counts, recv, recv_counts);
    return issue("all_to_all_v", [&] {
      const size_t elem = dtype_size(send.dtype());
      const ncclDataType_t t = nccl_type(send.dtype());
      size_t s_at = 0, r_at = 0;
      ncclResult_t st = ncclGroupStart();
      for (int r = 0; r < world_size() && st == ncclSuccess; ++r) {
        const auto sn = static_cast<size_t>(send_counts[r]), rn = static_cast<size_t>(recv_counts[r]);
        if (sn > 0) st = ncclSend(static_cast<const char*>(send.data()) + s_at * elem, sn, t, r, nccl_, stream_);
        if (st == ncclSuccess && rn > 0)
          st = ncclRecv(static_cast<char*>(recv.data()) + r_at * elem, rn, t, r, nccl_, stream_);
        s_at += sn, r_at += rn;
      }
      const ncclResult_t end = ncclGroupEnd();
      return st != ncclSuccess ? st : end;
    });
  }
  Work do_barrier() override { return mpi_->barrier(); }
  // NCCL matches a peer's sends and receives in issue order, as Communicator::send promises. Both
  // are held until one of them is waited for, or another call comes (design notes).
  Work do_send(Tensor buf, int peer) override {
    if (on_host(buf)) return mpi_->send(buf, peer);
    return hold(true, buf, peer);
  }
  Work do_recv(Tensor buf, int peer) override {
    if (on_host(buf)) return mpi_->recv(buf, peer);
    return hold(false, buf, peer);
  }

 private:
  static size_t count(const Tensor& t) { return static_cast<size_t>(t.numel()); }
  // Host tensors (all of a call's, or none) travel over MPI.
  static bool on_host(const Tensor& a, const Tensor& b = Tensor()) {
    const bool ha = a.device() == Device::cpu, hb = b.data() ? b.device() == Device::cpu : ha;
    SHARD_CHECK(ha == hb, "nccl communicator: one collective mixes host and device buffers");
    return ha;
  }

  // NCCL has no gather or scatter: one group of point-to-point calls in which the root receives
  // (gather) or sends (scatter) chunk r of `chunks` from or to rank r, and every rank sends or
  // receives `mine`.
  ncclResult_t root_exchange(bool gather, Tensor chunks, Tensor mine, int root) {
    const size_t n = count(mine), bytes = mine.bytes();
    const ncclDataType_t t = nccl_type(mine.dtype());
    ncclResult_t st = ncclGroupStart();
    for (int r = 0; rank() == root && r < world_size() && st == ncclSuccess; ++r) {
      char* chunk = static_cast<char*>(chunks.data()) + r * bytes;
      st = gather ? ncclRecv(chunk, n, t, r, nccl_, stream_) : ncclSend(chunk, n, t, r, nccl_, stream_);
    }
    if (st == ncclSuccess)
      st = gather ? ncclSend(mine.data(), n, t, root, nccl_, stream_) : ncclRecv(mine.data(), n, t, root, nccl_, stream_);
    const ncclResult_t end = ncclGroupEnd();
    return st != ncclSuccess ? st : end;
  }

  // Orders the collective after the compute stream's work so far, issues it on the comm stream
  // (after the held point-to-point calls), and returns a Work whose wait() orders the compute
  // stream after it.
  template <class F>
  Work issue(const char* what, F&& call) {
    nvtxRangePushA(what);
    after_compute();
    issue_held();
    NCCL_CHECK(nccl_, what, call());
    std::unique_ptr<WorkImpl> done = recorded(what);
    nvtxRangePop();
    return Work(std::move(done));
  }
  void after_compute() {
    cudaEvent_t ready{};
    CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(ready, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    CUDA_CHECK(cudaEventDestroy(ready));  // destruction is deferred until the wait is satisfied
  }
  // The comm stream's position now, as a Work.
  std::unique_ptr<WorkImpl> recorded(const char* what) {
    cudaEvent_t done{};
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(done, stream_));
    return std::make_unique<NcclWork>(nccl_, compute_, done, what);
  }

  Work hold(bool send, Tensor buf, int peer) {
    auto slot = std::make_shared<HeldSlot>();
    slot->flush = [this] {
      nvtxRangePushA("send/recv");
      after_compute();
      issue_held();
      nvtxRangePop();
    };
    held_.push_back({send, buf, peer, slot});
    return Work(std::make_unique<HeldWork>(std::move(slot)));
  }
  // Every held send and receive in one group, in the order they were called; each one's Work then
  // waits for the group.
  void issue_held() {
    if (held_.empty()) return;
    std::vector<Held> held = std::move(held_);
    held_.clear();
    NCCL_CHECK(nccl_, "send/recv", ncclGroupStart());
    for (const Held& h : held) {
      const size_t n = count(h.buf);
      const ncclDataType_t t = nccl_type(h.buf.dtype());
      NCCL_CHECK(nccl_, h.send ? "send" : "recv",
                 h.send ? ncclSend(h.buf.data(), n, t, h.peer, nccl_, stream_)
                        : ncclRecv(h.buf.data(), n, t, h.peer, nccl_, stream_));
    }
    NCCL_CHECK(nccl_, "send/recv", ncclGroupEnd());
    for (Held& h : held) h.slot->issued = recorded(h.send ? "send" : "recv");
  }

  // NCCL refuses two ranks on one GPU with an opaque error; say which ranks and what to use.
  void check_one_rank_per_device() {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    const std::string mine = fmt::format("{}:{}", host, be_.device_index());
    const std::vector<std::string> all = mpi_->all_gather_strings(mine);
    // Every rank sees the same list, so every rank throws (none is left waiting in NCCL's init).
    for (size_t i = 0; i < all.size(); ++i)
      for (size_t j = i + 1; j < all.size(); ++j)
        if (all[i] == all[j])
          throw InputError(fmt::format("--comm nccl: ranks {} and {} share GPU {}; NCCL needs one rank per device: "
                                       "use --comm staged (or auto, which picks it)",
                                       i, j, all[i]));
  }

  struct Held {
    bool send;
    Tensor buf;
    int peer;
    std::shared_ptr<HeldSlot> slot;
  };
  std::vector<Held> held_;  // point-to-point calls not yet issued, in call order
  ncclComm_t nccl_ = nullptr;
  cudaStream_t compute_{}, stream_{};
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, Backend& be) {
  return std::make_unique<NcclCommunicator>(comm, be);
}

}  // namespace shardlab
