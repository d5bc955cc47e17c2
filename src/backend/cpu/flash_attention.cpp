// flash_attention.cpp — the CPU fused attention kernels (ops/attention.hpp, shape in
// ops/flash_shape.hpp): the online softmax over key tiles, no (T, T) buffer.
//
// Forward, per (batch, head, query tile): for each key tile S = scale Q Kᵀ (sgemm), the running
// row max m and sum l updated, P = exp(S - m) with the accumulator O rescaled by exp(m_old - m),
// then O += P V (sgemm); at the end out = O / l and lse = m + log l. Causal: key tiles wholly
// after a tile's last query are never visited, and only the tiles crossing the diagonal are masked.
//
// Backward, per (batch, K/V head), which is then the only writer of that head's dk and dv and of
// its query heads' dq (no races, and the same bits whatever the thread count): D = rowsum(dO * O);
// for each key tile and each query tile that sees it, P = exp(S - lse), dV += Pᵀ dO, dP = dO Vᵀ,
// dS = P (dP - D), dQ += scale dS K, dK += scale dSᵀ Q.
//
// Each task's products are small sgemm calls made inside the OpenMP region (the libraries run them
// on the calling thread); a thread's tiles are its slot of the workspace.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "src/backend/cpu/gemm.hpp"
#include "src/backend/cpu/kernel_util.hpp"
#include "src/backend/cpu/kernels.hpp"

namespace shardlab::cpu {
namespace {

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

// The tiles' products go to oneDNN unless --cpu-gemm names OpenBLAS: on these small shapes it was the
// faster library on both ISAs measured (bench-attention, T 2048, 8 heads of 64, one thread: AVX2
// 385 ms against 459 for OpenBLAS and 481 for the shape rule's mix; AVX-512 194 against 296 and 253).
void tile_gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const GemmLib lib = gemm_policy() == GemmPolicy::openblas ? GemmLib::openblas : GemmLib::onednn;
  sgemm_with(lib, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

int threads_for(int64_t slots) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(slots, omp_get_max_threads())));
}

}  // namespace

void flash_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, const FlashShape& s,
                             float* workspace) {
  const FlashTiles tl = flash_tiles(s);
  const int64_t br = tl.br, bc = tl.bc, hd = s.hd, group = s.H / s.KV;
  const int64_t qtiles = (s.Tq + br - 1) / br, tasks = s.B * s.H * qtiles;
  const int64_t slot = flash_forward_slot_elems(s);
  const int threads = threads_for(flash_forward_slots(s));
#pragma omp parallel num_threads(threads) if (threads > 1 && s.B * s.H * s.Tq * s.Tk * hd > kParallelMin)
  {
    float* S = workspace + omp_get_thread_num() * slot;
    float* O = S + br * bc;
    float* m = O + br * hd;
    float* l = m + br;
    // Later query tiles see more keys: the costly tasks first, handed out one at a time.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t i = qtiles - 1 - task % qtiles, bh = task / qtiles, b = bh / s.H, h = bh % s.H;
      const int64_t t0 = i * br, rows = std::min(br, s.Tq - t0);
      const float* Q = q + b * s.q_b + t0 * s.q_ld + h * hd;
      const float* K = k + b * s.k_b + (h / group) * hd;
      const float* V = v + b * s.v_b + (h / group) * hd;
      std::fill_n(m, rows, -std::numeric_limits<float>::infinity());
      std::fill_n(l, rows, 0.f);
      std::fill_n(O, rows * hd, 0.f);
      const int64_t kv_end = s.causal ? std::min(s.Tk, t0 + rows + s.offset) : s.Tk;
      for (int64_t s0 = 0; s0 < kv_end; s0 += bc) {
        const int64_t cols = std::min(bc, kv_end - s0);
        tile_gemm(Trans::N, Trans::T, rows, cols, hd, s.scale, Q, s.q_ld, K + s0 * s.k_ld, s.k_ld, 0.f, S, cols);
        for (int64_t r = 0; r < rows; ++r) {
          float* row = S + r * cols;
          const int64_t n = visible(s, t0 + r, s0, cols);
          if (n == 0) {
            std::fill_n(row, cols, 0.f);
            continue;
          }
          float mx = row[0];
#pragma omp simd reduction(max : mx)
          for (int64_t j = 1; j < n; ++j) mx = std::max(mx, row[j]);
          const float m_new = std::max(m[r], mx);
          const float alpha = m[r] == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(m[r] - m_new);
          l[r] = l[r] * alpha + exp_row(row, n, cols, m_new);
          m[r] = m_new;
          if (alpha != 1.f) {
            float* o = O + r * hd;
#pragma omp simd
            for (int64_t c = 0; c < hd; ++c) o[c] *= alpha;
          }
        }
        tile_gemm(Trans::N, Trans::N, rows, hd, cols, 1.f, S, cols, V + s0 * s.v_ld, s.v_ld, 1.f, O, hd);
      }
      float* lse_row = lse + bh * s.Tq + t0;
      for (int64_t r = 0; r < rows; ++r) {
        // l > 0 whenever a key is visible; a row that sees none (a causal offset below zero) is 0.
        const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
        float* dst = out + b * s.o_b + (t0 + r) * s.o_ld + h * hd;
        const float* o = O + r * hd;
#pragma omp simd
        for (int64_t c = 0; c < hd; ++c) dst[c] = o[c] * inv;
        lse_row[r] = l[r] > 0.f ? m[r] + std::log(l[r]) : -std::numeric_limits<float>::infinity();
      }
    }
  }
}

void flash_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                              const float* v, const float* out, const float* lse, const FlashShape& s,
                              float* workspace) {
  const FlashTiles tl = flash_tiles(s);
  const int64_t br = tl.br, bc = tl.bc, hd = s.hd, group = s.H / s.KV;
  const int64_t slot = flash_backward_slot_elems(s), slots = flash_backward_slots(s);
  float* D = workspace + slots * slot;  // (B, H, Tq)
  const int threads = threads_for(slots);
#pragma omp parallel num_threads(threads) if (threads > 1 && s.B * s.H * s.Tq * s.Tk * hd > kParallelMin)
  {
    float* P = workspace + omp_get_thread_num() * slot;
    float* dP = P + br * bc;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < s.B * s.KV; ++task) {
      const int64_t b = task / s.KV, g = task % s.KV;
      const float* K = k + b * s.k_b + g * hd;
      const float* V = v + b * s.v_b + g * hd;
      float* dK = dk + b * s.k_b + g * hd;
      float* dV = dv + b * s.v_b + g * hd;
      for (int64_t j = 0; j < s.Tk; ++j) {
        std::fill_n(dK + j * s.k_ld, hd, 0.f);
        std::fill_n(dV + j * s.v_ld, hd, 0.f);
      }
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const float* Q = q + b * s.q_b + h * hd;
        const float* O = out + b * s.o_b + h * hd;
        const float* dO = dout + b * s.o_b + h * hd;
        const float* L = lse + (b * s.H + h) * s.Tq;
        float* dQ = dq + b * s.q_b + h * hd;
        float* Dh = D + (b * s.H + h) * s.Tq;
        for (int64_t t = 0; t < s.Tq; ++t) {
          const float* o = O + t * s.o_ld;
          const float* d = dO + t * s.o_ld;
          float acc = 0.f;
#pragma omp simd reduction(+ : acc)
          for (int64_t c = 0; c < hd; ++c) acc += o[c] * d[c];
          Dh[t] = acc;
          std::fill_n(dQ + t * s.q_ld, hd, 0.f);
        }
        for (int64_t s0 = 0; s0 < s.Tk; s0 += bc) {
          const int64_t cols = std::min(bc, s.Tk - s0);
          // The first query row that sees key s0, rounded down to its tile.
          const int64_t first = s.causal ? std::max<int64_t>(0, s0 - s.offset) : 0;
          for (int64_t t0 = first / br * br; t0 < s.Tq; t0 += br) {
            const int64_t rows = std::min(br, s.Tq - t0);
            const float* Qt = Q + t0 * s.q_ld;
            const float* dOt = dO + t0 * s.o_ld;
            tile_gemm(Trans::N, Trans::T, rows, cols, hd, s.scale, Qt, s.q_ld, K + s0 * s.k_ld, s.k_ld, 0.f, P, cols);
            for (int64_t r = 0; r < rows; ++r) exp_row(P + r * cols, visible(s, t0 + r, s0, cols), cols, L[t0 + r]);
            // dV += Pᵀ dO; dP = dO Vᵀ
            tile_gemm(Trans::T, Trans::N, cols, hd, rows, 1.f, P, cols, dOt, s.o_ld, 1.f, dV + s0 * s.v_ld, s.v_ld);
            tile_gemm(Trans::N, Trans::T, rows, cols, hd, 1.f, dOt, s.o_ld, V + s0 * s.v_ld, s.v_ld, 0.f, dP, cols);
            for (int64_t r = 0; r < rows; ++r) {
              const float* p = P + r * cols;
              float* dp = dP + r * cols;
              const float Dt = Dh[t0 + r];
#pragma omp simd
              for (int64_t j = 0; j < cols; ++j) dp[j] = p[j] * (dp[j] - Dt);
            }
            // dQ += scale dS K; dK += scale dSᵀ Q
            tile_gemm(Trans::N, Trans::N, rows, hd, cols, s.scale, dP, cols, K + s0 * s.k_ld, s.k_ld, 1.f,
                  dQ + t0 * s.q_ld, s.q_ld);
            tile_gemm(Trans::T, Trans::N, cols, hd, rows, s.scale, dP, cols, Qt, s.q_ld, 1.f, dK + s0 * s.k_ld, s.k_ld);
          }
        }
      }
    }
  }
}

}  // namespace shardlab::cpu
