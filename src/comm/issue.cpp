// issue.cpp — Communicator::issue, where every public call ends: its bus bytes counted, the
// transport's call made and watched, and, in a prediction, the call written to the cost ledger
// (src/backend/cost.hpp) on the comm stream.
#include <utility>

#include "src/backend/cost.hpp"
#include "src/comm/communicator.hpp"

namespace shardlab {
namespace {

// A collective in the cost ledger: once waited on (or found done), the compute stream waits on its
// end, as the NCCL communicator's Work orders it. The transport's own work at the wait (the sim's
// stand-in copies) is bookkeeping, not the step's.
class CostedWork final : public WorkImpl {
 public:
  CostedWork(Work inner, CostLedger* ledger, int done) : inner_(std::move(inner)), ledger_(ledger), done_(done) {}
  // The sim's calls are done at once, a GPU's only when the device is: a poll (the pipeline executor
  // lets sends and receives progress between units) must not order the compute stream after them, so
  // the call stays pending until the code waits for it (Work::wait, or the Work's destructor).
  bool test() override { return false; }
  bool progress() override { return false; }
  void wait() override {
    {
      CostLedger::Pause paused(ledger_);
      inner_.wait();
    }
    order();
  }

 private:
  void order() {
    if (!std::exchange(ordered_, true)) ledger_->wait(StreamKind::compute, done_);
  }
  Work inner_;
  CostLedger* ledger_;
  int done_;
  bool ordered_ = false;
};

}  // namespace

Work Communicator::issue(uint64_t seq, CommOp op, DType dtype, double full_bytes, const std::function<Work()>& run) {
  const double b = bus_bytes(op, full_bytes, world_size());
  last_bytes_ = b;
  stats_.record(op, b, b * wire_factor(op, dtype), axis_);
  if (parent_) parent_->stats_.record(op, b, b * wire_factor(op, dtype), axis_);
  CostLedger* ledger = stats_.cost;
  if (ledger == nullptr) return watched(seq, run());
  Work w;
  {
    CostLedger::Pause paused(ledger);
    w = run();
  }
  OpCost c{.name = comm_op_name(op), .axis = comm_axis_name(axis_), .group = world_size(), .bus_bytes = b};
  if (ledger->target() == Device::cuda && world_size() > 1) c.launches = 1;  // one NCCL kernel on the comm stream
  const int done = ledger->collective(std::move(c));
  return watched(seq, Work(std::make_unique<CostedWork>(std::move(w), ledger, done)));
}

}  // namespace shardlab
