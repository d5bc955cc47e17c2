// flash_shape.hpp — one fused (flash) attention call's shape, strides and tiles, shared by its CPU
// and CUDA kernels and by the code that sizes its workspace (plain data: nvcc includes it too).
//
// Query head h reads K/V head h / (H / KV). q, k, v, out and the gradients are row-major with the
// row and batch strides below (the fused [q | k | v] buffer of the layers, or a KV cache), head h
// at column h hd of q and out, K/V head g at column g hd of k and v. lse (B, H, Tq) is each query
// row's log-sum-exp of its scaled scores: forward saves it, backward recomputes the probabilities
// from it, and partial results over disjoint key ranges merge with it.
#pragma once
#include <cstdint>

namespace shardlab {

struct FlashShape {
  int64_t B = 0, Tq = 0, Tk = 0, H = 0, KV = 0, hd = 0;
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
// Tiles laid out with a row per query or per key are padded to kFlashPad columns (brp, bcp): whole
// vectors for the CPU's tile product (cpu/tile_product.hpp).
inline constexpr int64_t kFlashRows = 128, kFlashCols = 256, kFlashMaxSlots = 64, kFlashPad = 16;

struct FlashTiles {
  int64_t br = 0, brp = 0, bc = 0, bcp = 0;
};
inline int64_t flash_min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t flash_pad(int64_t n) { return (n + kFlashPad - 1) / kFlashPad * kFlashPad; }
inline FlashTiles flash_tiles(const FlashShape& s) {
  const int64_t br = flash_min(s.Tq, kFlashRows), bc = flash_min(s.Tk, kFlashCols);
  return {br, flash_pad(br), bc, flash_pad(bc)};
}

// Forward: tasks (batch, head, query tile); a thread's tiles are the scores transposed (bc, brp),
// O (br, hd), the running max and sum and the tile's max (brp each), the query tile transposed
// (hd, brp) and the value tile (bc, hd); with bf16 inputs the key tile (bc, hd) too.
inline int64_t flash_forward_slots(const FlashShape& s) {
  const FlashTiles t = flash_tiles(s);
  return flash_min(kFlashMaxSlots, s.B * s.H * ((s.Tq + t.br - 1) / t.br));
}
inline int64_t flash_forward_slot_elems(const FlashShape& s) {
  const FlashTiles t = flash_tiles(s);
  return t.bc * t.brp + t.br * s.hd + 3 * t.brp + s.hd * t.brp + (s.bf16 ? 2 : 1) * t.bc * s.hd;
}
inline int64_t flash_forward_workspace_elems(const FlashShape& s) {
  return flash_forward_slots(s) * flash_forward_slot_elems(s);
}

// Backward: tasks (batch, K/V head), each the only writer of its K/V head's gradients and of its
// query heads' dq; a thread's tiles are P and dP (br, bcp), the key and value tiles transposed
// (hd, bcp), the key tile (bc, hd), the query and output-gradient tiles (br, hd). Then
// D = rowsum(dO * O), (B, H, Tq).
inline int64_t flash_backward_slots(const FlashShape& s) { return flash_min(kFlashMaxSlots, s.B * s.KV); }
inline int64_t flash_backward_slot_elems(const FlashShape& s) {
  const FlashTiles t = flash_tiles(s);
  return 2 * t.br * t.bcp + 2 * s.hd * t.bcp + t.bc * s.hd + 2 * t.br * s.hd;
}
inline int64_t flash_backward_workspace_elems(const FlashShape& s) {
  return flash_backward_slots(s) * flash_backward_slot_elems(s) + s.B * s.H * s.Tq;
}

}  // namespace shardlab
