// cp_attention.cpp — attention over the cp group's pieces (cp_attention.hpp, cp.hpp).
//
// Buffers, per layer: this rank's K/V rows (B Tl, KV (hd + v): keys then values, a row per position),
// the group's all-gathered (C, B, Tl, KV (hd + v): rank after rank) and the same rows in sequence
// order (B, T, KV (hd + v)), which the fused kernel reads for every piece: piece (row0, pos0, len)
// is len queries at causal offset pos0 over keys [0, pos0 + len). Backward accumulates dK/dV of
// both pieces over the sequence-ordered rows, lays them out rank after rank again and
// reduce-scatters them, so each rank receives the sum of the group's gradients for its own rows.
//
// Ring (--cp-method ring): only this rank's K/V rows and one other rank's are held. At step i of C
// the rank holds rank (r - i)'s rows, computes its pieces against those pieces it sees (a partial
// result at the pair's causal offset, merged into out and lse through the log-sum-exp), while the
// rows move on to rank r + 1 (sent before the tiles run, waited for after). Backward walks the same
// ring with dK/dV travelling beside K/V: each rank adds its queries' part into the gradient of the
// rows it holds and passes both on; after C steps every gradient is back at the rank holding its rows.
#include "src/model/parallel/cp_attention.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include "src/backend/ops/flash_attention.hpp"
#include "src/backend/ops/kv_cache.hpp"
#include "src/comm/communicator.hpp"
#include "src/model/parallel/cp.hpp"

namespace shardlab::cp {
namespace {

using blocks::AttentionShape;

CpContext& context(const UnitContext& c, const AttentionShape& a) {
  SHARD_CHECK(c.batch.cp != nullptr && c.batch.cp->active() && c.batch.cp->comm != nullptr,
              "context-parallel attention on a batch without a cp group");
  SHARD_CHECK(a.T == c.batch.cp->local(), "context-parallel attention over {} rows; the pieces hold {} of {}", a.T,
              c.batch.cp->local(), c.batch.cp->seq);
  return *c.batch.cp;
}

// Row widths: qkv's (H + KV) hd + KV v, the K/V buffers' KV (hd + v), atty's H v (v: the value
// head dimension, AttentionShape::v()).
struct Widths {
  int64_t qkv, kv, o;
};
Widths widths(const AttentionShape& a) {
  return {(a.H + a.KV) * a.hd + a.KV * a.v(), a.KV * (a.hd + a.v()), a.H * a.v()};
}

// t's elements from `offset` on.
Tensor from(const Tensor& t, int64_t offset) { return t.slice(offset, t.numel() - offset); }

// Piece p's queries (rows of qkv) over Tk K/V rows of a buffer holding `rows` of them per sequence,
// causal at `offset` (key row j is seen by query t when j <= t + offset); out and lse as atty's.
FlashShape shape_over(const AttentionShape& a, const CpPiece& p, int64_t Tk, int64_t rows, int64_t offset) {
  const Widths w = widths(a);
  FlashShape s;
  s.B = a.B, s.Tq = p.len, s.Tk = Tk, s.H = a.H, s.KV = a.KV, s.hd = a.hd, s.vd = a.vd;
  s.q_ld = w.qkv, s.q_b = a.T * w.qkv;
  s.k_ld = s.v_ld = w.kv, s.k_b = s.v_b = rows * w.kv;
  s.o_ld = w.o, s.o_b = a.T * w.o;
  s.causal = true, s.offset = offset;
  s.scale = 1.f / std::sqrt(static_cast<float>(a.hd));  // as the whole-sequence call's
  return s;
}

// allgather: piece p over the sequence-ordered rows up to its last position.
FlashShape piece_shape(const AttentionShape& a, const CpContext& cp, const CpPiece& p) {
  return shape_over(a, p, p.pos0 + p.len, cp.seq, p.pos0);
}

// Piece `index`'s log-sum-exps in lse (B, H, Tl): the pieces' (B, H, len) blocks one after another.
Tensor piece_lse(const AttentionShape& a, const CpPiece& p, size_t index, Tensor lse) {
  const int64_t n = a.B * a.H * p.len;
  return lse.slice(static_cast<int64_t>(index) * n, n);
}

// Piece p's operands: its query rows of qkv, the K/V rows (keys, then values) from the shape's key
// row 0 on, its rows of the output and its block of lse.
ops::FlashOperands operands(const AttentionShape& a, const CpPiece& p, size_t index, Tensor qkv, Tensor kv,
                            Tensor atty, Tensor lse) {
  const Widths w = widths(a);
  return {from(qkv, p.row0 * w.qkv), kv, from(kv, a.KV * a.hd), from(atty, p.row0 * w.o), piece_lse(a, p, index, lse)};
}
// Its gradients, laid out as the operands are.
ops::FlashGrads grads(const AttentionShape& a, const CpPiece& p, Tensor dqkv, Tensor dkv, Tensor datty) {
  const Widths w = widths(a);
  return {from(dqkv, p.row0 * w.qkv), dkv, from(dkv, a.KV * a.hd), from(datty, p.row0 * w.o)};
}

// This rank's K/V rows (B Tl, KV (hd + v)) from the K and V columns of qkv, and their gradients back
// into dqkv's K and V columns.
void take_kv(Backend& be, const AttentionShape& a, Tensor qkv, Tensor rows) {
  const Widths w = widths(a);
  ops::copy_rows(be, rows, w.kv, from(qkv, a.H * a.hd), w.qkv, a.B * a.T, w.kv);
}
void give_dkv(Backend& be, const AttentionShape& a, Tensor rows, Tensor dqkv) {
  const Widths w = widths(a);
  ops::copy_rows(be, from(dqkv, a.H * a.hd), w.qkv, rows, w.kv, a.B * a.T, w.kv);
}

// The (query, key) pairs a causal call computes: query t sees keys [0, t + offset].
int64_t causal_pairs(const FlashShape& s) {
  int64_t n = 0;
  for (int64_t t = 0; t < s.Tq; ++t) n += std::clamp<int64_t>(t + s.offset + 1, 0, s.Tk);
  return n;
}

// Between the group's rank-major rows (C, B, Tl, W) and sequence order (B, T, W): every rank's
// pieces move as blocks of consecutive rows.
void reorder(Backend& be, const CpContext& cp, const AttentionShape& a, Tensor ranked, Tensor seq, bool to_seq) {
  const int64_t W = widths(a).kv;
  for (int q = 0; q < cp.degree; ++q)
    for (const CpPiece& p : cp_pieces(cp.seq, cp.degree, q, cp.config.balance))
      for (int64_t b = 0; b < a.B; ++b) {
        Tensor r = ranked.slice(((q * a.B + b) * a.T + p.row0) * W, p.len * W);
        Tensor s = seq.slice((b * cp.seq + p.pos0) * W, p.len * W);
        if (to_seq)
          be.copy(s, r);
        else
          be.copy(r, s);
      }
}

// A collective of the cp group (or the wait of one issued before), its time added to cp.wait_s.
template <class F>
void timed(CpContext& cp, F collective) {
  const auto t0 = std::chrono::steady_clock::now();
  collective().wait();
  cp.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The group's K/V rows in sequence order, into kv (B, T, KV (hd + v)).
void gather_kv(UnitContext& c, CpContext& cp, Tensor qkv, const AttentionShape& a, Tensor kv) {
  const Widths w = widths(a);
  const int64_t rows = a.B * a.T;
  Block mine = c.pool.alloc(DType::f32, rows * w.kv, Category::comm_buffer, "cp K/V rows");
  Block all = c.pool.alloc(DType::f32, cp.degree * rows * w.kv, Category::comm_buffer, "cp gathered K/V rows");
  take_kv(c.be, a, qkv, mine.flat(DType::f32));
  timed(cp, [&] { return cp.comm->all_gather(mine.flat(DType::f32), all.flat(DType::f32)); });
  reorder(c.be, cp, a, all.flat(DType::f32), kv, true);
}

// ---- ring ----

// This rank's piece p against piece k of the rows it holds (B, Tl, KV (hd + v)), at their causal offset.
FlashShape pair_shape(const AttentionShape& a, const CpPiece& p, const CpPiece& k) {
  return shape_over(a, p, k.len, a.T, p.pos0 - k.pos0);
}
bool sees(const CpPiece& p, const CpPiece& k) { return k.pos0 <= p.pos0 + p.len - 1; }

// Every (my piece, held piece) pair of ring step `step` that sees keys: f(p, index of p, k).
template <class F>
void for_each_pair(const CpContext& cp, int step, F f) {
  const int src = (cp.rank - step + cp.degree) % cp.degree;
  for (const CpPiece& k : cp_pieces(cp.seq, cp.degree, src, cp.config.balance))
    for (size_t i = 0; i < cp.pieces.size(); ++i)
      if (sees(cp.pieces[i], k)) f(cp.pieces[i], i, k);
}

// The ring's next hop: `send` to rank r + 1, `recv` from rank r - 1 (issued now, waited for by the caller).
std::pair<Work, Work> pass_on(CpContext& cp, Tensor send, Tensor recv) {
  const int next = (cp.rank + 1) % cp.degree, prev = (cp.rank - 1 + cp.degree) % cp.degree;
  Work s = cp.comm->send(send, next);
  Work r = cp.comm->recv(recv, prev);
  return {std::move(s), std::move(r)};
}
void wait_both(CpContext& cp, std::pair<Work, Work>& w) {
  timed(cp, [&] { return std::move(w.first); });
  timed(cp, [&] { return std::move(w.second); });
}

int64_t ring_tiles(const CpContext& cp, const AttentionShape& a, bool backward) {
  int64_t n = 0;
  for (int step = 0; step < cp.degree; ++step)
    for_each_pair(cp, step, [&](const CpPiece& p, size_t, const CpPiece& k) {
      const FlashShape sh = pair_shape(a, p, k);
      n = std::max(n, backward ? flash_backward_workspace_elems(sh) : flash_forward_workspace_elems(sh));
    });
  return n;
}

void ring_forward(UnitContext& c, CpContext& cp, Tensor qkv, const AttentionShape& a, Tensor atty, Tensor lse) {
  const Widths w = widths(a);
  const int64_t rows = a.B * a.T;
  Block kv = c.pool.alloc(DType::f32, 2 * rows * w.kv, Category::comm_buffer, "cp ring K/V rows");
  Block partial = c.pool.alloc(DType::f32, rows * w.o + a.B * a.H * a.T, Category::workspace, "cp ring partial");
  Block ws = c.pool.alloc(DType::f32, ring_tiles(cp, a, false), Category::workspace, "attention tiles");
  Tensor held[2] = {kv.flat(DType::f32).slice(0, rows * w.kv), kv.flat(DType::f32).slice(rows * w.kv, rows * w.kv)};
  const Tensor part_out = partial.flat(DType::f32).slice(0, rows * w.o);
  const Tensor part_lse = partial.flat(DType::f32).slice(rows * w.o, a.B * a.H * a.T);
  take_kv(c.be, a, qkv, held[0]);
  c.be.fill(atty, 0.f);
  c.be.fill(lse, -std::numeric_limits<float>::infinity());  // no key seen yet
  for (int step = 0; step < cp.degree; ++step) {
    Tensor cur = held[step % 2];
    std::pair<Work, Work> hop;
    if (step + 1 < cp.degree) hop = pass_on(cp, cur, held[(step + 1) % 2]);
    for_each_pair(cp, step, [&](const CpPiece& p, size_t i, const CpPiece& k) {
      const FlashShape sh = pair_shape(a, p, k);
      const ops::FlashOperands part = operands(a, p, i, qkv, from(cur, k.row0 * w.kv), part_out, part_lse);
      ops::flash_attention_forward(c.be, sh, part, ws.flat(DType::f32));
      ops::flash_attention_merge(c.be, sh, from(atty, p.row0 * w.o), piece_lse(a, p, i, lse), part.out, part.lse);
      cp.pairs += causal_pairs(sh);
    });
    if (step + 1 < cp.degree) wait_both(cp, hop);
  }
}

void ring_backward(UnitContext& c, CpContext& cp, Saved& s, Tensor dqkv, Tensor datty, Tensor scratch,
                   const AttentionShape& a) {
  const Widths w = widths(a);
  const int64_t rows = a.B * a.T, n = rows * w.kv;
  Block kv = c.pool.alloc(DType::f32, 2 * n, Category::comm_buffer, "cp ring K/V rows");
  Block dkv = c.pool.alloc(DType::f32, 2 * n, Category::comm_buffer, "cp ring dK/dV rows");
  Tensor held[2] = {kv.flat(DType::f32).slice(0, n), kv.flat(DType::f32).slice(n, n)};
  Tensor grad[2] = {dkv.flat(DType::f32).slice(0, n), dkv.flat(DType::f32).slice(n, n)};
  take_kv(c.be, a, s("qkv"), held[0]);
  c.be.fill(grad[0], 0.f);
  c.be.fill(dqkv, 0.f);  // the steps' dq add into it; dK/dV are written at the end
  for (int step = 0; step < cp.degree; ++step) {
    Tensor cur = held[step % 2], dcur = grad[step % 2];
    std::pair<Work, Work> hop;
    if (step + 1 < cp.degree) hop = pass_on(cp, cur, held[(step + 1) % 2]);
    for_each_pair(cp, step, [&](const CpPiece& p, size_t i, const CpPiece& k) {
      FlashShape sh = pair_shape(a, p, k);
      sh.accumulate = true;
      ops::flash_attention_backward(c.be, sh, operands(a, p, i, s("qkv"), from(cur, k.row0 * w.kv), s("atty"), s("lse")),
                                    grads(a, p, dqkv, from(dcur, k.row0 * w.kv), datty), scratch);
    });
    if (step + 1 < cp.degree) wait_both(cp, hop);
    // The gradient of the rows held moves on once this rank's part is in; after the last step it
    // reaches the rank holding those rows, and this rank receives its own.
    std::pair<Work, Work> back = pass_on(cp, dcur, grad[(step + 1) % 2]);
    wait_both(cp, back);
  }
  give_dkv(c.be, a, grad[cp.degree % 2], dqkv);
}

}  // namespace

Tensor attention_forward(UnitContext& c, Saved& s, Tensor qkv, const AttentionShape& a) {
  CpContext& cp = context(c, a);
  Tensor atty = s.add(c.pool, "atty", {a.B * a.T, a.H * a.v()}), lse = s.add_f32(c.pool, "lse", {a.B, a.H, a.T});
  if (cp.config.method == CpMethod::ring) {
    ring_forward(c, cp, qkv, a, atty, lse);
    return atty;
  }
  Block kv = c.pool.alloc(DType::f32, a.B * cp.seq * widths(a).kv, Category::workspace, "cp K/V in sequence order");
  gather_kv(c, cp, qkv, a, kv.flat(DType::f32));
  int64_t tiles = 0;
  for (const CpPiece& p : cp.pieces) tiles = std::max(tiles, flash_forward_workspace_elems(piece_shape(a, cp, p)));
  Block ws = c.pool.alloc(DType::f32, tiles, Category::workspace, "attention tiles");
  for (size_t i = 0; i < cp.pieces.size(); ++i) {
    const FlashShape sh = piece_shape(a, cp, cp.pieces[i]);
    ops::flash_attention_forward(c.be, sh, operands(a, cp.pieces[i], i, qkv, kv.flat(DType::f32), atty, lse),
                                 ws.flat(DType::f32));
    cp.pairs += causal_pairs(sh);
  }
  return atty;
}

int64_t attention_scratch_elems(const UnitContext& c, const AttentionShape& a) {
  const CpContext& cp = context(c, a);
  if (cp.config.method == CpMethod::ring) return ring_tiles(cp, a, true);
  int64_t n = 0;
  for (const CpPiece& p : cp.pieces) n = std::max(n, flash_backward_workspace_elems(piece_shape(a, cp, p)));
  return n;
}

void attention_backward(UnitContext& c, Saved& s, Tensor dqkv, Tensor datty, Tensor scratch,
                        const AttentionShape& a) {
  CpContext& cp = context(c, a);
  if (cp.config.method == CpMethod::ring) return ring_backward(c, cp, s, dqkv, datty, scratch, a);
  const Widths w = widths(a);
  const int64_t rows = a.B * a.T, seq_elems = a.B * cp.seq * w.kv;
  Block kv = c.pool.alloc(DType::f32, seq_elems, Category::workspace, "cp K/V in sequence order");
  gather_kv(c, cp, s("qkv"), a, kv.flat(DType::f32));
  Block dkv = c.pool.alloc(DType::f32, seq_elems, Category::workspace, "cp dK/dV in sequence order");
  c.be.fill(dkv.flat(DType::f32), 0.f);
  c.be.fill(dqkv, 0.f);  // the pieces' dq add into their rows; dK/dV are written at the end
  for (size_t i = 0; i < cp.pieces.size(); ++i) {
    const CpPiece& p = cp.pieces[i];
    FlashShape sh = piece_shape(a, cp, p);
    sh.accumulate = true;
    ops::flash_attention_backward(c.be, sh, operands(a, p, i, s("qkv"), kv.flat(DType::f32), s("atty"), s("lse")),
                                  grads(a, p, dqkv, dkv.flat(DType::f32), datty), scratch);
  }
  kv.reset();
  Block ranked = c.pool.alloc(DType::f32, cp.degree * rows * w.kv, Category::comm_buffer, "cp dK/dV by rank");
  reorder(c.be, cp, a, ranked.flat(DType::f32), dkv.flat(DType::f32), false);
  dkv.reset();
  Block mine = c.pool.alloc(DType::f32, rows * w.kv, Category::comm_buffer, "cp dK/dV rows");
  timed(cp, [&] { return cp.comm->reduce_scatter(ranked.flat(DType::f32), mine.flat(DType::f32)); });
  give_dkv(c.be, a, mine.flat(DType::f32), dqkv);
}

double micro_step_bus_bytes(const ModelSpec& spec, CpMethod method, int layers, int tp, int cp, int64_t B,
                            Checkpointing ck) {
  const double C = cp, hd = static_cast<double>(spec.head_size());
  const double vd = spec.mla.enabled() ? static_cast<double>(spec.mla.v) : hd;  // latent attention's values
  const double kv = static_cast<double>(spec.num_kv_heads()) / tp;
  const double gathered = static_cast<double>(B) * static_cast<double>(spec.seq) * kv * (hd + vd) * sizeof(float);
  const int forwards = 1 + (ck == Checkpointing::blocks ? 1 : 0);
  if (method == CpMethod::ring)  // a send and a receive of the rank's rows (gathered / C) per hop
    return layers * 2 * gathered / C * (forwards * (C - 1) + (C - 1) + C);
  return layers * (forwards + 2) * (C - 1) / C * gathered;
}

}  // namespace shardlab::cp
