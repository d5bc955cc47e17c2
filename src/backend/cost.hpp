// cost.hpp — the cost ledger: what a step costs on the device it stands for, recorded by the step
// itself, as the memory ledger records what it holds.
//
// A prediction runs the real step on the meta backend (src/train/predict.hpp). With a CostLedger
// attached, every operation the step issues is written down instead of computed: its FLOPs (on the
// vector units, or on tensor cores when its operands are bf16/f16 on a GPU), the fewest bytes it
// must move through device memory (inputs read once, outputs written once), the commands it puts on
// its stream as that backend issues them (kernels with their grids, library calls, copies: the
// CUDA backend's own declarations, src/backend/cuda/launches.hpp) and the host synchronisations it
// forces. Collectives come from the communicator, which knows their axis and bus bytes. Each entry
// lands on a stream (compute or comm) after the events that stream waits on, so overlap is the
// code's: the device model (src/backend/price.hpp) replays the streams to find the step's critical
// path instead of assuming one.
//
// Nothing here knows a model family, an operation or an axis: an operation names itself, a
// collective names its axis (the mesh's table), and a new one is priced by existing.
#pragma once
#include <cstdint>
#include <vector>

#include "src/backend/backend.hpp"

namespace shardlab {

// One command group an operation issues: a kernel family's launch, a GEMM, a collective, a copy.
struct OpCost {
  // Names are static strings (an operation's, a collective's, an axis's), so writing an entry
  // allocates nothing but the entry.
  const char* name = "";    // "layernorm_backward", "gemm", "all_reduce"
  double flops = 0;         // on vector units (CUDA cores, the CPU's FMA units)
  double tensor_flops = 0;  // on tensor cores (bf16/f16 products on a GPU)
  double bytes = 0;         // device-memory bytes at the least: inputs read once, outputs written once
  int launches = 0;         // commands on the stream (kernels, library calls, copies), as issued
  int kernels = 0;          // of them: kernels of our own (the rest: library calls, copies and memsets)
  int copies = 0;           // of them: copies and memsets
  // The largest kernel grid among them, in blocks: the kernel that streams the operation's data (a
  // fold of partial sums after it is small), whose share of the SMs sets the bandwidth it gets. 0: no
  // kernel of its own (a library call, a copy).
  int64_t blocks = 0;
  int host_syncs = 0;       // times the host waits for the device inside this operation
  // A GEMM's shape (its efficiency depends on it): (m x k) . (k x n), `batch` of them.
  int64_t m = 0, n = 0, k = 0, batch = 0;
  // A collective: its axis (the mesh's name), ranks in the group and bus bytes.
  const char* axis = "";
  int group = 0;
  double bus_bytes = 0;
  bool collective() const { return group > 0; }
};

// A command of the ledger, in the order the host issued it.
struct CostCommand {
  enum class Kind : uint8_t { op, record, wait, host_sync } kind;
  // op, record, wait: its stream; host_sync: the stream the host waits for (a copy to or from host
  // memory waits for the compute stream, as CudaBackend::copy does), or every stream when all_streams.
  StreamKind stream = StreamKind::compute;
  int event = -1;  // record: the event it creates; wait: the event the stream waits on
  int op = -1;     // op: index into ops()
  bool all_streams = false;
};

class CostLedger {
 public:
  // `target`: the device the meta step stands for (cpu or cuda): which launches and tensor cores apply.
  explicit CostLedger(Device target) : target_(target) {}
  Device target() const { return target_; }

  // The operation on `stream`, after what that stream already holds. Ignored while paused.
  void add(OpCost c, StreamKind stream = StreamKind::compute);
  // An event at the end of `stream` so far; a stream made to wait on it; the host waiting for the
  // compute stream (an operation's host_syncs), or for every stream (Backend::synchronize).
  int record(StreamKind stream);
  void wait(StreamKind stream, int event);
  void host_sync(bool all_streams = false);

  // A collective on the comm stream, ordered after the compute stream's work so far (as the NCCL
  // communicator orders it); returns the event the compute stream waits on when the Work is waited.
  int collective(OpCost c);

  // Work done for bookkeeping rather than by the step (the sim communicator's stand-in copies).
  class Pause {
   public:
    explicit Pause(CostLedger* l) : l_(l) {
      if (l_) ++l_->paused_;
    }
    ~Pause() {
      if (l_) --l_->paused_;
    }
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;

   private:
    CostLedger* l_;
  };
  bool paused() const { return paused_ > 0; }

  const std::vector<OpCost>& ops() const { return ops_; }
  // Commands name events 0 .. events() - 1 (an event's number less the numbers cleared before).
  const std::vector<CostCommand>& commands() const { return commands_; }
  int events() const { return events_; }
  // Forgets what was written (a prediction clears what set-up issued, then runs the step); waits on
  // events recorded before are ignored.
  void clear();

 private:
  Device target_;
  std::vector<OpCost> ops_;
  std::vector<CostCommand> commands_;
  int events_ = 0;
  int cleared_ = 0;  // events recorded before the last clear: ids below it are gone
  int paused_ = 0;
};

// The fewest bytes of an element-wise pass: `reads` and `writes` tensors of n elements of `bytes`.
inline double pass_bytes(int64_t n, int reads, int writes, size_t elem = 4) {
  return static_cast<double>(n) * static_cast<double>(elem) * (reads + writes);
}

}  // namespace shardlab
