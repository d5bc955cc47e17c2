// ep.cpp — expert parallelism's dispatch and combine around the local experts (ep.hpp).
#include "src/model/parallel/ep.hpp"

#include <algorithm>
#include <chrono>

#include "src/backend/ops/activation.hpp"
#include "src/backend/ops/moe.hpp"
#include "src/comm/communicator.hpp"
#include "src/model/blocks/linear.hpp"

namespace shardlab::blocks {
namespace {

// One layer's exchange over the ep group of D ranks, E / D = El experts each.
struct Exchange {
  int D = 1;
  int64_t El = 0, R = 0;             // R: rows this rank's experts receive
  std::vector<int32_t> from;         // (D El): rows peer s sends local expert l, at s El + l
  std::vector<int64_t> send, recv;   // elements to and from each peer
  std::vector<int64_t> expert_rows;  // (El): each local expert's rows, every peer's
  std::vector<int32_t> by_expert;    // (R): expert-major row i is received (peer-major) row by_expert[i]
  std::vector<int32_t> by_peer;      // (R): received row j is expert-major row by_peer[j]
};

// The counts both ways (elements of C columns) from `from` (known) and this rank's per_expert (E),
// and the reorderings (not on the meta backend, `meta`: they would go to a device that keeps no
// values, and a prediction makes many).
Exchange exchange_of(int D, int64_t C, std::span<const int32_t> per_expert, std::vector<int32_t> from, bool meta) {
  Exchange x;
  x.D = D, x.El = static_cast<int64_t>(per_expert.size()) / D, x.from = std::move(from);
  const int64_t El = x.El;
  x.send.assign(static_cast<size_t>(D), 0), x.recv.assign(static_cast<size_t>(D), 0);
  x.expert_rows.assign(static_cast<size_t>(El), 0);
  for (int s = 0; s < D; ++s)
    for (int64_t l = 0; l < El; ++l) {
      x.send[s] += per_expert[static_cast<size_t>(s * El + l)] * C;
      x.recv[s] += x.from[static_cast<size_t>(s * El + l)] * C;
      x.expert_rows[l] += x.from[static_cast<size_t>(s * El + l)];
    }
  for (int64_t n : x.expert_rows) x.R += n;
  if (meta) return x;
  // Received row of (peer s, expert l, i): s's block, then s's rows of the experts before l.
  std::vector<int64_t> at(static_cast<size_t>(D * El), 0);
  for (int64_t s = 0, row = 0; s < D; ++s)
    for (int64_t l = 0; l < El; ++l) at[s * El + l] = row, row += x.from[s * El + l];
  x.by_expert.reserve(static_cast<size_t>(x.R));
  for (int64_t l = 0; l < El; ++l)
    for (int64_t s = 0; s < D; ++s)
      for (int64_t i = 0; i < x.from[s * El + l]; ++i) x.by_expert.push_back(static_cast<int32_t>(at[s * El + l] + i));
  x.by_peer.assign(static_cast<size_t>(x.R), 0);
  for (int64_t i = 0; i < x.R; ++i) x.by_peer[x.by_expert[i]] = static_cast<int32_t>(i);
  return x;
}

// Runs one of the ep group's collectives, its seconds added to the group's wait_s.
template <class F>
void timed(UnitContext& c, F f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  c.ep->wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// On the meta backend, which has no values, the counts from each peer: what this rank sends its
// own experts (every rank routes as evenly as its round robin).
void assume_balanced(const UnitContext& c, std::span<const int32_t> per_expert, std::vector<int32_t>& from) {
  if (c.be.device() != Device::meta) return;
  const int64_t El = static_cast<int64_t>(per_expert.size()) / c.ep->comm->world_size();
  for (size_t i = 0; i < from.size(); ++i)
    from[i] = per_expert[static_cast<size_t>(c.ep->comm->rank() * El) + i % static_cast<size_t>(El)];
}

// Forward: the counts all-to-all (every peer's rows for each of this rank's experts).
Exchange plan(UnitContext& c, std::span<const int32_t> per_expert, int64_t C) {
  Communicator& comm = *c.ep->comm;
  const int64_t E = static_cast<int64_t>(per_expert.size());
  Block b = c.pool.alloc(DType::f32, 2 * E, Category::comm_buffer, "moe ep counts");
  Tensor mine = b.flat(DType::f32).slice(0, E), theirs = b.flat(DType::f32).slice(E, E);
  std::vector<float> h(per_expert.begin(), per_expert.end());  // counts below 2^24: exact in f32
  c.be.copy(mine, Tensor::flat(h.data(), DType::f32, E));
  timed(c, [&] { comm.all_to_all(mine, theirs).wait(); });
  c.be.copy(Tensor::flat(h.data(), DType::f32, E), theirs);
  std::vector<int32_t> from(h.begin(), h.end());
  assume_balanced(c, per_expert, from);
  return exchange_of(comm.world_size(), C, per_expert, std::move(from), c.be.device() == Device::meta);
}


const int32_t* ints(Tensor t, int64_t at) { return static_cast<const int32_t*>(t.data()) + at; }

// Rows of the buffers for what arrives: under --moe-capacity-factor (training) every peer sends at
// most `capacity` rows of each local expert, so D El capacity rows whatever the routing (memory
// independent of the data, as without --ep); dropless, what arrives (at least one row).
int64_t buffer_rows(const Exchange& x, int64_t capacity) {
  return std::max<int64_t>(capacity > 0 ? x.D * x.El * capacity : x.R, 1);
}

// Rows moved by one all-to-all over the ep group: sent in `send`'s counts, received in `recv`'s.
void exchange_rows(UnitContext& c, Tensor from, const std::vector<int64_t>& send, Tensor to,
                   const std::vector<int64_t>& recv) {
  timed(c, [&] { c.ep->comm->all_to_all_v(from, send, to, recv).wait(); });
}

// This rank's rows `src` to their experts' ranks, laid out expert by expert into dst (Rs rows: the
// first R used); ep_t holds the reorderings (after the D El counts).
void dispatch(UnitContext& c, const Exchange& x, Tensor src, Tensor dst, Tensor ep_t, const char* what) {
  const int64_t Rs = dst.dim(0), C = dst.dim(1);
  Block recv = c.pool.alloc(DType::f32, Rs * C, Category::comm_buffer, what);
  exchange_rows(c, src, x.send, row_range(recv.view(DType::f32, {Rs, C}), 0, x.R), x.recv);
  if (x.R > 0) ops::moe_gather(c.be, row_range(dst, 0, x.R), recv.view(DType::f32, {Rs, C}), ints(ep_t, x.D * x.El));
}

// The reverse: the expert-major rows of `src` (Rs, C; freed once reordered) back to the ranks they
// came from, into dst in the order those ranks sent them.
void give_back(UnitContext& c, const Exchange& x, Block src, Tensor dst, Tensor ep_t, int64_t Rs, const char* what) {
  const int64_t C = dst.dim(1);
  Block back = c.pool.alloc(DType::f32, Rs * C, Category::comm_buffer, what);
  Tensor peer_major = back.view(DType::f32, {Rs, C});
  if (x.R > 0)
    ops::moe_gather(c.be, row_range(peer_major, 0, x.R), src.view(DType::f32, {Rs, C}), ints(ep_t, x.D * x.El + x.R));
  src.reset();
  exchange_rows(c, row_range(peer_major, 0, x.R), x.recv, dst, x.send);
}

}  // namespace

void ep_experts_forward(UnitContext& c, Saved& s, Tensor xs, Tensor y, std::span<const int32_t> per_expert,
                        const MoeWeights& w, int64_t capacity) {
  const int64_t C = xs.dim(1), F = moe_local_width(c);
  const Exchange x = plan(c, per_expert, C);
  const int64_t R = x.R, Rs = buffer_rows(x, capacity), head = x.D * x.El;
  // What backward needs of the exchange: the counts from each peer, and both reorderings.
  Tensor ep_t = s.add_f32(c.pool, "moe_ep", {head + 2 * Rs});
  std::vector<int32_t> packed(x.from);
  packed.insert(packed.end(), x.by_expert.begin(), x.by_expert.end());
  packed.insert(packed.end(), x.by_peer.begin(), x.by_peer.end());
  const bool values = c.be.device() != Device::meta;  // on meta no reorderings (exchange_of): only the copy's cost
  c.be.copy(ep_t.slice(0, head + 2 * R), Tensor::flat(values ? packed.data() : nullptr, DType::f32, head + 2 * R));

  Tensor xl = s.add(c.pool, "moe_xl", {Rs, C});
  dispatch(c, x, xs, xl, ep_t, "moe ep tokens received");
  Tensor gate_up = s.add(c.pool, "moe_gate_up", {Rs, 2 * F}), act = s.add(c.pool, "moe_act", {Rs, F});
  Block yl_block = c.pool.alloc(DType::f32, Rs * C, Category::workspace, "moe ep expert outputs");
  Tensor yl = yl_block.view(DType::f32, {Rs, C});
  const auto arrived = [&](int64_t l) { return x.expert_rows[l]; };
  for_each_expert(x.El, arrived, [&](int64_t l, int64_t r0, int64_t n) {
    linear_forward(c.be, row_range(gate_up, r0, n), row_range(xl, r0, n), w.gate_up[l], n);
  });
  if (R > 0) ops::swiglu_forward(c.be, row_range(act, 0, R), row_range(gate_up, 0, R));
  for_each_expert(x.El, arrived, [&](int64_t l, int64_t r0, int64_t n) {
    linear_forward(c.be, row_range(yl, r0, n), row_range(act, r0, n), w.down[l], n);
  });
  give_back(c, x, std::move(yl_block), y, ep_t, Rs, "moe ep outputs returned");
}

void ep_experts_backward(UnitContext& c, Saved& s, Tensor dy, Tensor dxs, std::span<const int32_t> per_expert,
                         const MoeWeights& w, const MoeWeights& g, int64_t capacity) {
  const int64_t C = dy.dim(1), F = moe_local_width(c), D = c.ep->comm->world_size();
  const int64_t El = static_cast<int64_t>(per_expert.size()) / D;
  // The counts from each peer as forward received them (on meta, which kept no values: as forward assumed).
  Tensor ep_t = s("moe_ep");
  std::vector<int32_t> from(static_cast<size_t>(D * El), 0);
  c.be.copy(Tensor::flat(from.data(), DType::f32, D * El), ep_t.slice(0, D * El));
  assume_balanced(c, per_expert, from);
  const Exchange x = exchange_of(static_cast<int>(D), C, per_expert, std::move(from), c.be.device() == Device::meta);
  const int64_t R = x.R, Rs = buffer_rows(x, capacity);
  Tensor act = s("moe_act"), gate_up = s("moe_gate_up"), xl = s("moe_xl");

  Block dyl_block = c.pool.alloc(DType::f32, Rs * C, Category::workspace, "moe ep backward dy");
  Tensor dyl = dyl_block.view(DType::f32, {Rs, C});
  dispatch(c, x, dy, dyl, ep_t, "moe ep dy received");
  Block dact_block = c.pool.alloc(DType::f32, Rs * F, Category::workspace, "moe ep backward dact");
  Tensor dact = dact_block.view(DType::f32, {Rs, F});
  const auto arrived = [&](int64_t l) { return x.expert_rows[l]; };
  for_each_expert(El, arrived, [&](int64_t l, int64_t r0, int64_t n) {
    linear_backward(c, row_range(dact, r0, n), g.down[l], row_range(dyl, r0, n), row_range(act, r0, n), w.down[l], n);
  });
  dyl_block.reset();
  Block dgu_block = c.pool.alloc(DType::f32, Rs * 2 * F, Category::workspace, "moe ep backward dgate_up");
  Tensor dgu = dgu_block.view(DType::f32, {Rs, 2 * F});
  if (R > 0) ops::swiglu_backward(c.be, row_range(dgu, 0, R), row_range(gate_up, 0, R), row_range(dact, 0, R));
  dact_block.reset();
  Block dxl_block = c.pool.alloc(DType::f32, Rs * C, Category::workspace, "moe ep backward dx");
  Tensor dxl = dxl_block.view(DType::f32, {Rs, C});
  for_each_expert(El, arrived, [&](int64_t l, int64_t r0, int64_t n) {
    linear_backward(c, row_range(dxl, r0, n), g.gate_up[l], row_range(dgu, r0, n), row_range(xl, r0, n), w.gate_up[l],
                    n);
  });
  dgu_block.reset();
  give_back(c, x, std::move(dxl_block), dxs, ep_t, Rs, "moe ep dx returned");
}

}  // namespace shardlab::blocks
