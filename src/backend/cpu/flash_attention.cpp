// flash_attention.cpp — the CPU fused attention kernels (ops/attention.hpp, shape in
// ops/flash_shape.hpp): the online softmax over key tiles, no (T, T) buffer.
//
// Forward, per (batch, query tile, run of query heads reading one K/V head: flash_heads_per_task):
// for each key tile, packed once for the run, and each head, the scores transposed, St = scale K Qᵀ
// (keys by queries), each query's max over the tile taken as they are stored, the running max m
// and sum l of each query updated, P = exp(S - m) with the accumulator O rescaled by
// exp(m_old - m), then O += P V; at the end out = O / l and lse = m + log l. Causal: key tiles
// wholly after a tile's last query are never visited, only the tiles crossing the diagonal are
// masked, and in those the products skip the register blocks the mask leaves nothing of
// (tile_product's TileMask: the same bits, without the zero terms).
//
// Backward, per (batch, K/V head), which is then the only writer of that head's dk and dv and of
// its query heads' dq (no races, and the same bits whatever the thread count): D = rowsum(dO * O);
// for each key tile, each query head reading it and each query tile that sees it,
// P = exp(S - lse), dV += Pᵀ dO, dP = dO Vᵀ, dS = P (dP - D), dQ += scale dS K, dK += scale dSᵀ Q.
//
// Each task's products are tile products (tile_product.hpp) on the calling thread: their operands
// are copied into tiles first (forward: the key and value tiles, each query tile transposed;
// backward: the key and value tiles transposed, the key tile, the query and output-gradient tiles)
// whose row strides (FlashTiles) are not multiples of 256 bytes, so no product reads rows that
// alias in the L1 cache, nor rows a page apart in the fused [q | k | v] buffer. A thread's tiles
// are its slot of the workspace. Where and how a value is copied never changes a result's bits.
//
// bf16 inputs (FlashShape::bf16) are widened as they are packed, so the products, sums and
// accumulators are the f32 kernels' own. (Decoding, fewer queries than a vector, reads f32 keys in
// place: its scores go to sgemm.)
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "src/backend/cpu/gemm.hpp"
#include "src/backend/cpu/kernel_util.hpp"
#include "src/backend/cpu/kernels.hpp"
#include "src/backend/cpu/tile_product.hpp"
#include "src/core/dtype.hpp"

namespace shardlab::cpu {
namespace {

inline float widen(float x) { return x; }
inline float widen(bf16 x) { return bf16_bits_to_f32(x.bits); }

// Key rows [0, n) of a key tile starting at s0 that query row t sees.
inline int64_t visible(const FlashShape& s, int64_t t, int64_t s0, int64_t cols) {
  if (!s.causal) return cols;
  return std::clamp<int64_t>(t + s.offset - s0 + 1, 0, cols);
}

// row[j] = exp(row[j] - shift) for j < n, returning their sum; row[n, cols) = 0.
inline float exp_row(float* row, int64_t n, int64_t cols, float shift) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    row[j] = fast_exp(row[j] - shift);
    sum += row[j];
  }
  for (int64_t j = n; j < cols; ++j) row[j] = 0.f;
  return sum;
}

static_assert(kFlashPad % kTileVec == 0, "key tiles are padded to whole vectors of the tile product");

constexpr float kNone = -std::numeric_limits<float>::infinity();  // a masked score; a max over no key

// Kt (hd, ld) = the key tile's rows [0, rows) transposed, columns [rows, pad) zero.
template <class In>
void pack_transposed(float* Kt, int64_t ld, const In* K, int64_t k_ld, int64_t rows, int64_t pad, int64_t hd) {
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t c = 0; c < hd; ++c) Kt[c * ld + j] = widen(K[j * k_ld + c]);
  for (int64_t c = 0; c < hd; ++c) std::fill(Kt + c * ld + rows, Kt + c * ld + pad, 0.f);
}

// dst (rows, hd), row stride dst_ld = the rows of src (row stride ld).
template <class In>
void pack_rows(float* dst, int64_t dst_ld, const In* src, int64_t ld, int64_t rows, int64_t hd) {
  for (int64_t j = 0; j < rows; ++j) {
    if constexpr (std::is_same_v<In, float>) {
      std::memcpy(dst + j * dst_ld, src + j * ld, hd * sizeof(float));
    } else {
      for (int64_t c = 0; c < hd; ++c) dst[j * dst_ld + c] = widen(src[j * ld + c]);
    }
  }
}

// One key tile's step of the online softmax over St (cols, brp), the scores transposed with the
// masked ones -inf, whose column maxima (each query's max over the tile) arrive in mt (brp): the
// running max m and sum l of each of the tile's query rows, the accumulator O (rows, vd; row stride
// ldo) rescaled by exp(m_old - m_new), and St made the probabilities exp(S - m_new), zero where
// masked (`masked`: the tile has masked scores). The pass over St goes a vector of queries at a time
// down the keys, each query's sum adding its terms in key order; columns past `rows` (the padding)
// are neither read nor written.
void online_softmax(float* St, int64_t brp, int64_t cols, int64_t rows, bool masked, float* m, float* l, float* mt,
                    float* O, int64_t ldo, int64_t vd) {
  constexpr int64_t kVec = kTileVec;
  // mt becomes the shift: the new max, or 0 for a query that has seen no key yet (all masked).
  for (int64_t r = 0; r < rows; ++r) {
    const float m_new = std::max(m[r], mt[r]);
    const float alpha = m[r] == kNone || m_new == kNone ? 0.f : std::exp(m[r] - m_new);
    m[r] = m_new;
    mt[r] = m_new == kNone ? 0.f : m_new;
    l[r] *= alpha;
    if (alpha != 1.f) {
      float* o = O + r * ldo;
#pragma omp simd
      for (int64_t c = 0; c < vd; ++c) o[c] *= alpha;
    }
  }
  for (int64_t r0 = 0; r0 < rows; r0 += kVec) {
    const int64_t n = std::min(kVec, rows - r0);
    float sum[kVec], shift[kVec];
    std::copy_n(l + r0, n, sum);
    std::copy_n(mt + r0, n, shift);
    for (int64_t j = 0; j < cols; ++j) {
      float* row = St + j * brp + r0;
      if (masked) {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) {
          const float e = row[i] == kNone ? 0.f : fast_exp(row[i] - shift[i]);
          row[i] = e;
          sum[i] += e;
        }
      } else {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) {
          const float e = fast_exp(row[i] - shift[i]);
          row[i] = e;
          sum[i] += e;
        }
      }
    }
    std::copy_n(sum, n, l + r0);
  }
}

// The causal mask of the tile pair (query rows from t0, key rows from s0) in the tile's own indices:
// query row r sees key row j when j < r + d (every key when not causal).
inline int64_t diagonal(const FlashShape& s, int64_t t0, int64_t s0) {
  return s.causal ? t0 + s.offset - s0 + 1 : std::numeric_limits<int64_t>::max() / 4;
}

inline TileMask mask_of(const FlashShape& s, TileMask::Kind kind, int64_t d) {
  return s.causal ? TileMask{kind, d} : TileMask{};
}

// The thread's tiles in backward, and the padded key-tile width.
struct BackwardTiles {
  float *P, *dP, *Kt, *Vt, *Kp, *Qp, *dOp;
  int64_t bcp, hdp, vdp;
};

// Backward over one query tile [t0, t0 + rows) and one key tile [s0, s0 + cols) whose Kt, Vt and Kp
// are packed: dV, dK (the key tile's rows) and dQ (the query tile's) accumulate.
template <class In>
void backward_tile(const FlashShape& s, const BackwardTiles& w, int64_t s0, int64_t cols, int64_t t0, int64_t rows,
                   const In* Q, const In* dO, const float* L, const float* Dh, float* dQ, float* dK, float* dV) {
  const int64_t hd = s.hd, vd = flash_vd(s), bcp = w.bcp, hdp = w.hdp, vdp = w.vdp;
  // Keys past the tile's last query are masked for all of its rows: skipped (the diagonal).
  const int64_t seen = s.causal ? std::min(cols, t0 + rows + s.offset - s0) : cols;
  if (seen <= 0) return;  // no query of the tile sees the key tile
  const int64_t np = flash_pad(seen), d = diagonal(s, t0, s0);
  // The masked scores' products are skipped a register block at a time: the elements of P and dP
  // past a row's visible keys are left as they are (then zeroed below), and the terms that would
  // add their zeros are left out.
  const TileMask wanted = mask_of(s, TileMask::cols_before, d), by_key = mask_of(s, TileMask::terms_before, d),
                 by_query = mask_of(s, TileMask::terms_after, d);
  pack_rows(w.Qp, hdp, Q + t0 * s.q_ld, s.q_ld, rows, hd);
  pack_rows(w.dOp, vdp, dO + t0 * s.o_ld, s.o_ld, rows, vd);
  tile_product(rows, np, hd, s.scale, w.Qp, hdp, 1, w.Kt, bcp, false, w.P, bcp, wanted);
  for (int64_t r = 0; r < rows; ++r) exp_row(w.P + r * bcp, visible(s, t0 + r, s0, seen), seen, L[t0 + r]);
  // dV += Pᵀ dO; dP = dO Vᵀ
  tile_product(seen, vd, rows, 1.f, w.P, 1, bcp, w.dOp, vdp, true, dV + s0 * s.v_ld, s.v_ld, by_query);
  tile_product(rows, np, vd, 1.f, w.dOp, vdp, 1, w.Vt, bcp, false, w.dP, bcp, wanted);
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = w.P + r * bcp;
    float* dp = w.dP + r * bcp;
    const float Dt = Dh[t0 + r];
    const int64_t n = visible(s, t0 + r, s0, seen);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - Dt);
    std::fill(dp + n, dp + seen, 0.f);
  }
  // dQ += scale dS K; dK += scale dSᵀ Q
  tile_product(rows, hd, seen, s.scale, w.dP, bcp, 1, w.Kp, hdp, true, dQ + t0 * s.q_ld, s.q_ld, by_key);
  tile_product(seen, hd, rows, s.scale, w.dP, 1, bcp, w.Qp, hdp, true, dK + s0 * s.k_ld, s.k_ld, by_query);
}

int threads_for(int64_t slots) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(slots, omp_get_max_threads())));
}

// One query head's state in a forward task: its accumulator, running max and sum, the tile's maxima
// and its query tile transposed.
struct HeadTiles {
  float *O, *m, *l, *mt, *Qt;
};

// A forward task's end for one head: its rows of out = O / l and lse = m + log l.
template <class In>
void finish_head(const HeadTiles& e, int64_t vdp, int64_t rows, int64_t vd, In* out, int64_t o_ld, float* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    // l > 0 whenever a key is visible; a row that sees none (a causal offset below zero) is 0.
    const float inv = e.l[r] > 0.f ? 1.f / e.l[r] : 0.f;
    In* dst = out + r * o_ld;
    const float* o = e.O + r * vdp;
    if constexpr (std::is_same_v<In, float>) {
#pragma omp simd
      for (int64_t c = 0; c < vd; ++c) dst[c] = o[c] * inv;
    } else {
      for (int64_t c = 0; c < vd; ++c) dst[c] = bf16(o[c] * inv);
    }
    lse[r] = e.l[r] > 0.f ? e.m[r] + std::log(e.l[r]) : kNone;
  }
}

template <class In>
void forward(In* out, float* lse, const In* q, const In* k, const In* v, const FlashShape& s, float* workspace) {
  const FlashTiles tl = flash_tiles(s);
  const int64_t br = tl.br, brp = tl.brp, bc = tl.bc, hd = s.hd, hdp = tl.hdp, group = s.H / s.KV;
  const int64_t vd = flash_vd(s), vdp = tl.vdp;
  const int64_t hp = flash_heads_per_task(s), runs = s.H / hp;
  const int64_t qtiles = flash_query_tiles(s), tasks = flash_forward_tasks(s);
  const int64_t slot = flash_forward_slot_elems(s);
  const int threads = threads_for(flash_forward_slots(s));
#pragma omp parallel num_threads(threads) if (threads > 1 && s.B * s.H * s.Tq * s.Tk * hd > kParallelMin)
  {
    float* St = workspace + omp_get_thread_num() * slot;
    float* Kp = St + bc * brp;
    float* Vp = Kp + bc * hdp;
    HeadTiles head[kFlashHeadsPerTask];
    for (int64_t j = 0; j < hp; ++j) {
      float* O = Vp + bc * vdp + j * flash_forward_head_elems(tl, hd);
      head[j] = {O, O + br * vdp, O + br * vdp + brp, O + br * vdp + 2 * brp, O + br * vdp + 3 * brp};
    }
    // Later query tiles see more keys: the costly tasks first, handed out one at a time.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t i = qtiles - 1 - task % qtiles, run = task / qtiles, b = run / runs, h0 = run % runs * hp;
      const int64_t t0 = i * br, rows = std::min(br, s.Tq - t0);
      const In* K = k + b * s.k_b + (h0 / group) * hd;
      const In* V = v + b * s.v_b + (h0 / group) * vd;
      for (int64_t j = 0; j < hp; ++j) {
        const HeadTiles& e = head[j];
        pack_transposed(e.Qt, brp, q + b * s.q_b + t0 * s.q_ld + (h0 + j) * hd, s.q_ld, rows, flash_pad(rows), hd);
        std::fill_n(e.m, rows, kNone);
        std::fill_n(e.l, rows, 0.f);
        for (int64_t r = 0; r < rows; ++r) std::fill_n(e.O + r * vdp, vd, 0.f);
      }
      // Fewer queries than a vector (decoding) go to sgemm rather than be padded to one, and read
      // f32 keys in place.
      const int64_t nq = rows < kTileVec ? rows : flash_pad(rows);
      const bool pack_keys = !std::is_same_v<In, float> || rows >= kTileVec;
      const int64_t kv_end = s.causal ? std::min(s.Tk, t0 + rows + s.offset) : s.Tk;
      for (int64_t s0 = 0; s0 < kv_end; s0 += bc) {
        const int64_t cols = std::min(bc, kv_end - s0);
        pack_rows(Vp, vdp, V + s0 * s.v_ld, s.v_ld, cols, vd);
        const float* Ks = Kp;
        int64_t ks_ld = hdp;
        if (pack_keys) {
          pack_rows(Kp, hdp, K + s0 * s.k_ld, s.k_ld, cols, hd);
        } else if constexpr (std::is_same_v<In, float>) {
          Ks = K + s0 * s.k_ld, ks_ld = s.k_ld;
        }
        const int64_t d = diagonal(s, t0, s0);
        for (int64_t j = 0; j < hp; ++j) {
          const HeadTiles& e = head[j];
          // The scores transposed, St (cols, brp) = scale K Qᵀ, -inf where masked: row j holds key
          // s0 + j's score for every query of the tile, so the softmax below runs along rows, in
          // vectors of queries; each query's max over the tile comes out of the product.
          std::fill_n(e.mt, nq, kNone);
          tile_product_scores(cols, nq, hd, s.scale, Ks, ks_ld, 1, e.Qt, brp, St, brp, d, e.mt);
          online_softmax(St, brp, cols, rows, s.causal && d < cols, e.m, e.l, e.mt, e.O, vdp, vd);
          // O += P V, P = Stᵀ (the masked keys' zero terms left out).
          tile_product(rows, vd, cols, 1.f, St, 1, brp, Vp, vdp, true, e.O, vdp,
                       mask_of(s, TileMask::terms_before, d));
        }
      }
      for (int64_t j = 0; j < hp; ++j)
        finish_head(head[j], vdp, rows, vd, out + b * s.o_b + t0 * s.o_ld + (h0 + j) * vd, s.o_ld,
                    lse + (b * s.H + h0 + j) * s.Tq + t0);
    }
  }
}

}  // namespace

void flash_attention_merge(float* out, float* lse, const float* part, const float* part_lse, const FlashShape& s) {
  for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
    const int64_t b = bh / s.H, h = bh % s.H;
    for (int64_t t = 0; t < s.Tq; ++t) {
      const float lp = part_lse[bh * s.Tq + t];
      float& l = lse[bh * s.Tq + t];
      if (lp == kNone) continue;  // the part saw no key of this row
      const float m = std::max(l, lp), w_old = std::exp(l - m), w_part = std::exp(lp - m), sum = w_old + w_part;
      const int64_t vd = flash_vd(s);
      float* o = out + b * s.o_b + t * s.o_ld + h * vd;
      const float* p = part + b * s.o_b + t * s.o_ld + h * vd;
      const float a = w_old / sum, c = w_part / sum;
#pragma omp simd
      for (int64_t k = 0; k < vd; ++k) o[k] = o[k] * a + p[k] * c;
      l = m + std::log(sum);
    }
  }
}

namespace {

template <class In>
void backward(float* dq, float* dk, float* dv, const In* dout, const In* q, const In* k, const In* v, const In* out,
              const float* lse, const FlashShape& s, float* workspace) {
  const FlashTiles tl = flash_tiles(s);
  const int64_t br = tl.br, bc = tl.bc, bcp = tl.bcp, hd = s.hd, hdp = tl.hdp, group = s.H / s.KV;
  const int64_t vd = flash_vd(s), vdp = tl.vdp;
  const int64_t slot = flash_backward_slot_elems(s), slots = flash_backward_slots(s);
  float* D = workspace + slots * slot;  // (B, H, Tq)
  const int threads = threads_for(slots);
#pragma omp parallel num_threads(threads) if (threads > 1 && s.B * s.H * s.Tq * s.Tk * hd > kParallelMin)
  {
    BackwardTiles w;
    w.P = workspace + omp_get_thread_num() * slot;
    w.dP = w.P + br * bcp;
    w.Kt = w.dP + br * bcp;
    w.Vt = w.Kt + hd * bcp;
    w.Kp = w.Vt + vd * bcp;
    w.Qp = w.Kp + bc * hdp;
    w.dOp = w.Qp + br * std::max(hdp, vdp);
    w.bcp = bcp;
    w.hdp = hdp;
    w.vdp = vdp;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < s.B * s.KV; ++task) {
      const int64_t b = task / s.KV, g = task % s.KV;
      const In* K = k + b * s.k_b + g * hd;
      const In* V = v + b * s.v_b + g * vd;
      float* dK = dk + b * s.k_b + g * hd;
      float* dV = dv + b * s.v_b + g * vd;
      for (int64_t j = 0; j < s.Tk && !s.accumulate; ++j) {
        std::fill_n(dK + j * s.k_ld, hd, 0.f);
        std::fill_n(dV + j * s.v_ld, vd, 0.f);
      }
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const In* O = out + b * s.o_b + h * vd;
        const In* dO = dout + b * s.o_b + h * vd;
        float* dQ = dq + b * s.q_b + h * hd;
        float* Dh = D + (b * s.H + h) * s.Tq;
        for (int64_t t = 0; t < s.Tq; ++t) {
          const float *o = nullptr, *d = nullptr;
          if constexpr (std::is_same_v<In, float>) {
            o = O + t * s.o_ld, d = dO + t * s.o_ld;
          } else {  // widened first, so the sum below runs as the f32 kernel's does
            pack_rows(w.Qp, vdp, O + t * s.o_ld, s.o_ld, 1, vd);
            pack_rows(w.dOp, vdp, dO + t * s.o_ld, s.o_ld, 1, vd);
            o = w.Qp, d = w.dOp;
          }
          float acc = 0.f;
#pragma omp simd reduction(+ : acc)
          for (int64_t c = 0; c < vd; ++c) acc += o[c] * d[c];
          Dh[t] = acc;
          if (!s.accumulate) std::fill_n(dQ + t * s.q_ld, hd, 0.f);
        }
      }
      // Key tiles outer, the group's query heads inner: each key tile packed once for all of them.
      // Every gradient element sums its terms in the same order as heads-outer would (a key tile's
      // rows over heads then query tiles, a query head's rows over key tiles).
      for (int64_t s0 = 0; s0 < s.Tk; s0 += bc) {
        const int64_t cols = std::min(bc, s.Tk - s0);
        pack_transposed(w.Kt, bcp, K + s0 * s.k_ld, s.k_ld, cols, bcp, hd);
        pack_transposed(w.Vt, bcp, V + s0 * s.v_ld, s.v_ld, cols, bcp, vd);
        pack_rows(w.Kp, hdp, K + s0 * s.k_ld, s.k_ld, cols, hd);
        // The first query row that sees key s0, rounded down to its tile.
        const int64_t first = s.causal ? std::max<int64_t>(0, s0 - s.offset) : 0;
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const In* Q = q + b * s.q_b + h * hd;
          const In* dO = dout + b * s.o_b + h * vd;
          const float* L = lse + (b * s.H + h) * s.Tq;
          float* dQ = dq + b * s.q_b + h * hd;
          const float* Dh = D + (b * s.H + h) * s.Tq;
          for (int64_t t0 = first / br * br; t0 < s.Tq; t0 += br)
            backward_tile(s, w, s0, cols, t0, std::min(br, s.Tq - t0), Q, dO, L, Dh, dQ, dK, dV);
        }
      }
    }
  }
}

}  // namespace

void flash_attention_forward(void* out, float* lse, const void* q, const void* k, const void* v, const FlashShape& s,
                             float* workspace) {
  if (s.bf16)
    return forward(static_cast<bf16*>(out), lse, static_cast<const bf16*>(q), static_cast<const bf16*>(k),
                   static_cast<const bf16*>(v), s, workspace);
  forward(static_cast<float*>(out), lse, static_cast<const float*>(q), static_cast<const float*>(k),
          static_cast<const float*>(v), s, workspace);
}

void flash_attention_backward(float* dq, float* dk, float* dv, const void* dout, const void* q, const void* k,
                              const void* v, const void* out, const float* lse, const FlashShape& s,
                              float* workspace) {
  if (s.bf16)
    return backward(dq, dk, dv, static_cast<const bf16*>(dout), static_cast<const bf16*>(q),
                    static_cast<const bf16*>(k), static_cast<const bf16*>(v), static_cast<const bf16*>(out), lse, s,
                    workspace);
  backward(dq, dk, dv, static_cast<const float*>(dout), static_cast<const float*>(q), static_cast<const float*>(k),
           static_cast<const float*>(v), static_cast<const float*>(out), lse, s, workspace);
}

}  // namespace shardlab::cpu
