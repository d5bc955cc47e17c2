#include "src/backend/cost.hpp"

#include <algorithm>

#include "src/backend/cuda/launches.hpp"
#include "src/backend/ops/dispatch.hpp"

namespace shardlab {

void CostLedger::add(OpCost c, StreamKind stream) {
  if (paused()) return;
  const int syncs = c.host_syncs;
  ops_.push_back(std::move(c));
  commands_.push_back({CostCommand::Kind::op, stream, -1, static_cast<int>(ops_.size()) - 1});
  for (int i = 0; i < syncs; ++i) host_sync();  // the host waits once the operation is issued
}

int CostLedger::record(StreamKind stream) {
  if (paused()) return -1;
  const int e = events_++;
  commands_.push_back({CostCommand::Kind::record, stream, e, -1});
  return cleared_ + e;
}

void CostLedger::wait(StreamKind stream, int event) {
  if (paused() || event < cleared_) return;
  SHARD_CHECK(event - cleared_ < events_, "cost ledger: a wait on event {} of {}", event - cleared_, events_);
  commands_.push_back({CostCommand::Kind::wait, stream, event - cleared_, -1});
}

void CostLedger::host_sync(bool all_streams) {
  if (paused()) return;
  commands_.push_back({CostCommand::Kind::host_sync, StreamKind::compute, -1, -1, all_streams});
}

int CostLedger::collective(OpCost c) {
  if (paused()) return -1;
  wait(StreamKind::comm, record(StreamKind::compute));
  add(std::move(c), StreamKind::comm);
  return record(StreamKind::comm);
}

void CostLedger::clear() {
  ops_.clear();
  commands_.clear();
  cleared_ += events_;
  events_ = 0;
}

namespace ops {
void add_launches(OpCost& c, const cuda::Launches& l, int64_t times) {
  for (const cuda::Launch& x : l) {
    c.launches += static_cast<int>(times);
    if (x.kind == cuda::LaunchKind::kernel) c.kernels += static_cast<int>(times);
    if (x.kind == cuda::LaunchKind::copy || x.kind == cuda::LaunchKind::memset) c.copies += static_cast<int>(times);
    c.blocks = std::max(c.blocks, x.blocks());
  }
}
}  // namespace ops

}  // namespace shardlab
