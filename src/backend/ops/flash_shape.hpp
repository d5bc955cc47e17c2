// flash_shape.hpp — one fused (flash) attention call's shape, strides and tiles, shared by its CPU
// and CUDA kernels and by the code that sizes its workspace (plain data: nvcc includes it too).
//
// Query head h reads K/V head h / (H / KV). q, k, v, out and the gradients are row-major with the
// row and batch strides below (the fused [q | k | v] buffer of the layers, or a KV cache), head h
// at column h hd of q and h vd of out, K/V head g at column g hd of k and g vd of v. Queries and
// keys have hd channels a head, values and the output vd (flash_vd: hd unless set; DeepSeek's
// multi-head latent attention has 192 and 128). lse (B, H, Tq) is each query
// row's log-sum-exp of its scaled scores: forward saves it, backward recomputes the probabilities
// from it, and partial results over disjoint key ranges merge with it.
#pragma once
#include <cstdint>

namespace shardlab {

struct FlashShape {
  int64_t B = 0, Tq = 0, Tk = 0, H = 0, KV = 0, hd = 0;
  int64_t vd = 0;  // the value (and output) head dimension; 0: hd
  int64_t q_ld = 0, k_ld = 0, v_ld = 0, o_ld = 0;  // row strides (elements)
  int64_t q_b = 0, k_b = 0, v_b = 0, o_b = 0;      // batch strides (elements)
  bool causal = true;
  int64_t offset = 0;  // causal: query row t sees key rows s <= t + offset (decoding: the cached length)
  float scale = 1.f;   // on the scores: 1/sqrt(hd)
  // Backward adds into dq, dk and dv instead of overwriting them: context parallelism's pieces of
  // one sequence write the same gathered keys' gradients (src/model/parallel/cp.hpp).
  bool accumulate = false;
  // q, k, v, out and dout hold bf16 rather than f32: read into f32 tiles, every product and sum in
  // f32, out rounded once at the end; lse, the workspace and backward's dq, dk and dv stay f32.
  bool bf16 = false;
};

// Tiles: kFlashRows query rows by kFlashCols key rows (smaller when the sequence is). The CPU kernels
// keep one set of tiles per thread in the workspace, for at most kFlashMaxSlots threads; the
// workspace depends on the shape alone, so a prediction on the meta backend allocates the same
// bytes as any device and thread count (the CUDA kernels use its D part, and on-chip tiles).
// A tile's row stride is whole vectors for the CPU's tile product (cpu/tile_product.hpp): its
// width padded to kFlashPad columns, and kFlashPad more where that would be a multiple of 256 bytes,
// whose rows share a few of the L1 cache's sets (a product reading down a column of such a tile
// evicts its own lines). brp: a row per query's width; bcp: per key's; hdp: per head dimension.
inline constexpr int64_t kFlashRows = 128, kFlashCols = 256, kFlashMaxSlots = 64, kFlashPad = 16;

struct FlashTiles {
  int64_t br = 0, brp = 0, bc = 0, bcp = 0, hdp = 0, vdp = 0;
};
inline int64_t flash_min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t flash_max(int64_t a, int64_t b) { return a > b ? a : b; }
inline int64_t flash_vd(const FlashShape& s) { return s.vd > 0 ? s.vd : s.hd; }
inline int64_t flash_pad(int64_t n) { return (n + kFlashPad - 1) / kFlashPad * kFlashPad; }
inline int64_t flash_stride(int64_t n) {
  const int64_t p = flash_pad(n);
  return p % (4 * kFlashPad) == 0 ? p + kFlashPad : p;
}
inline FlashTiles flash_tiles(const FlashShape& s) {
  const int64_t br = flash_min(s.Tq, kFlashRows), bc = flash_min(s.Tk, kFlashCols);
  return {br, flash_stride(br), bc, flash_stride(bc), flash_stride(s.hd), flash_stride(flash_vd(s))};
}
inline int64_t flash_query_tiles(const FlashShape& s) { return (s.Tq + kFlashRows - 1) / kFlashRows; }

// Forward: tasks (batch, query tile, a run of flash_heads_per_task query heads reading one K/V head),
// so each key and value tile is packed once for the run's heads; a thread's tiles are the scores
// transposed (bc, brp), the key tile (bc, hdp) and the value tile (bc, vdp), and per head of the run
// O (br, vdp), the running max and sum and the tile's max (brp each) and the query tile transposed
// (hd, brp).
// At most kFlashHeadsPerTask heads a task, a divisor of H / KV, and fewer (down to one) where more
// would leave under kFlashMinTasks tasks to share among the threads (decoding, short sequences).
inline constexpr int64_t kFlashHeadsPerTask = 4, kFlashMinTasks = 16;
inline int64_t flash_heads_per_task(const FlashShape& s) {
  const int64_t group = s.KV > 0 ? s.H / s.KV : 1, qtiles = flash_query_tiles(s);
  for (int64_t n = flash_min(group, kFlashHeadsPerTask); n > 1; --n)
    if (group % n == 0 && s.B * (s.H / n) * qtiles >= kFlashMinTasks) return n;
  return 1;
}
inline int64_t flash_forward_tasks(const FlashShape& s) {
  return s.B * (s.H / flash_heads_per_task(s)) * flash_query_tiles(s);
}
inline int64_t flash_forward_slots(const FlashShape& s) { return flash_min(kFlashMaxSlots, flash_forward_tasks(s)); }
inline int64_t flash_forward_head_elems(const FlashTiles& t, int64_t hd) {  // one head's tiles in a slot
  return t.br * t.vdp + 3 * t.brp + hd * t.brp;
}
inline int64_t flash_forward_slot_elems(const FlashShape& s) {
  const FlashTiles t = flash_tiles(s);
  return t.bc * t.brp + t.bc * (t.hdp + t.vdp) + flash_heads_per_task(s) * flash_forward_head_elems(t, s.hd);
}
inline int64_t flash_forward_workspace_elems(const FlashShape& s) {
  return flash_forward_slots(s) * flash_forward_slot_elems(s);
}

// Backward: tasks (batch, K/V head), each the only writer of its K/V head's gradients and of its
// query heads' dq; a thread's tiles are P and dP (br, bcp), the key and value tiles transposed
// (hd and vd, bcp), the key tile (bc, hdp), the query tile (br, the wider of hdp and vdp: it also
// holds a widened output row) and the output-gradient tile (br, vdp). Then D = rowsum(dO * O),
// (B, H, Tq).
inline int64_t flash_backward_slots(const FlashShape& s) { return flash_min(kFlashMaxSlots, s.B * s.KV); }
inline int64_t flash_backward_slot_elems(const FlashShape& s) {
  const FlashTiles t = flash_tiles(s);
  return 2 * t.br * t.bcp + (s.hd + flash_vd(s)) * t.bcp + t.bc * t.hdp + t.br * flash_max(t.hdp, t.vdp) +
         t.br * t.vdp;
}
inline int64_t flash_backward_workspace_elems(const FlashShape& s) {
  return flash_backward_slots(s) * flash_backward_slot_elems(s) + s.B * s.H * s.Tq;
}

}  // namespace shardlab
