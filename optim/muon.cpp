#include "optim/muon.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "src/backend/ops/kv_cache.hpp"
#include "src/backend/ops/muon.hpp"

namespace shardlab {

MuonAdjustLr parse_muon_adjust_lr(const std::string& s) {
  if (s == "original") return MuonAdjustLr::original;
  if (s == "match_rms_adamw") return MuonAdjustLr::match_rms_adamw;
  throw InputError(fmt::format("--muon-adjust-lr '{}': expected original or match_rms_adamw", s));
}

const char* muon_adjust_lr_name(MuonAdjustLr a) {
  return a == MuonAdjustLr::original ? "original" : "match_rms_adamw";
}

void MuonConfig::validate() const {
  SHARD_REQUIRE(ns_steps >= 1 && ns_steps < 100, "--muon-ns-steps {}: expected 1 to 99 (torch refuses 100 and more)",
                ns_steps);
  SHARD_REQUIRE(ns_dtype == DType::bf16 || ns_dtype == DType::f32, "--muon-ns-dtype {}: expected bf16 or f32",
                dtype_name(ns_dtype));
}

double muon_lr_ratio(MuonAdjustLr how, int64_t A, int64_t B) {
  if (how == MuonAdjustLr::original) return std::sqrt(std::max(1.0, static_cast<double>(A) / static_cast<double>(B)));
  return 0.2 * std::sqrt(static_cast<double>(std::max(A, B)));
}

double newton_schulz_flops(int64_t rows, int64_t cols, int steps) {
  const double m = static_cast<double>(std::min(rows, cols)), n = static_cast<double>(std::max(rows, cols));
  return steps * (4 * m * m * n + 2 * m * m * m);
}

namespace {

GemmDesc product(DType t, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, float alpha,
                 float beta) {
  GemmDesc d;
  d.trans_a = ta, d.trans_b = tb;
  d.m = m, d.n = n, d.k = k;
  d.lda = lda, d.ldb = ldb, d.ldc = n;
  d.alpha = alpha, d.beta = beta;
  d.a_type = d.b_type = d.c_type = t;
  return d;
}

}  // namespace

void newton_schulz(Pool& pool, Tensor g, Tensor out, int64_t rows, int64_t cols, const MuonConfig& cfg) {
  Backend& be = pool.backend();
  const int64_t n = rows * cols;
  SHARD_CHECK(g.numel() == n && out.numel() == n && g.dtype() == DType::f32 && out.dtype() == DType::f32,
              "newton_schulz: {} x {} expects f32 g and out of {} elements, got {} and {}", rows, cols, n, g.numel(),
              out.numel());
  const bool bf16 = cfg.ns_dtype == DType::bf16;
  const DType S = bf16 && be.low_precision_gemm() ? DType::bf16 : DType::f32;
  const bool round = bf16 && S == DType::f32;  // bf16 arithmetic on f32 storage
  const bool wide = rows <= cols;
  const int64_t m = wide ? rows : cols;  // the Gram matrix's side
  // Sized for f32 on every backend, bf16 storage included: one size whatever dtype S the backend
  // computes in, so the memory prediction holds without asking which.
  Block xb = pool.alloc(DType::f32, n, Category::workspace, "muon iteration X");
  Block yb = pool.alloc(DType::f32, n, Category::workspace, "muon iteration X'");
  Block ab = pool.alloc(DType::f32, m * m, Category::workspace, "muon iteration gram");
  Block bb = pool.alloc(DType::f32, m * m, Category::workspace, "muon iteration gram update");
  Tensor X = xb.flat(S).slice(0, n), Y = yb.flat(S).slice(0, n);
  const Tensor A = ab.flat(S).slice(0, m * m), B = bb.flat(S).slice(0, m * m);
  const auto rounded = [&](Tensor t) {
    if (round) ops::round_to_bf16(be, t);
  };
  be.cast(X, g);
  rounded(X);
  ops::muon_normalize(be, X, cfg.eps, round);
  for (int s = 0; s < cfg.ns_steps; ++s) {
    // A = W W^T of the wide orientation W (X, or X^T when X is tall).
    if (wide) be.gemm(product(S, Trans::N, Trans::T, m, m, cols, cols, cols, 1.f, 0.f), X.data(), X.data(), A.data());
    else be.gemm(product(S, Trans::T, Trans::N, m, m, rows, cols, cols, 1.f, 0.f), X.data(), X.data(), A.data());
    rounded(A);
    be.copy(B, A);  // B = b A + c A A (torch.addmm(A, A, A, beta=b, alpha=c))
    be.gemm(product(S, Trans::N, Trans::N, m, m, m, m, m, cfg.c, cfg.b), A.data(), A.data(), B.data());
    rounded(B);
    be.copy(Y, X);  // W' = a W + B W; for a tall X: X' = a X + X B^T
    if (wide) be.gemm(product(S, Trans::N, Trans::N, rows, cols, rows, m, cols, 1.f, cfg.a), B.data(), X.data(), Y.data());
    else be.gemm(product(S, Trans::N, Trans::T, rows, cols, cols, cols, m, 1.f, cfg.a), X.data(), B.data(), Y.data());
    rounded(Y);
    std::swap(X, Y);
  }
  be.cast(out, X);
}

void tp_pieces(Backend& be, Tensor parts, Tensor whole, const MuonMatrix& m, int T, int t, bool to_whole) {
  const int64_t R = m.tp_dim == 0 ? m.rows * T : m.rows, C = m.tp_dim == 1 ? m.cols * T : m.cols;
  SHARD_CHECK(m.tp_dim == 0 || m.tp_dim == 1, "tp_pieces: a matrix split along {}", m.tp_dim);
  SHARD_CHECK(whole.numel() == R * C && parts.numel() >= m.numel() * (to_whole ? T : 1),
              "tp_pieces: {} x {} in {} parts of {}: whole {}, parts {}", R, C, T, m.numel(), whole.numel(),
              parts.numel());
  // Block b of rank r's part is block b * T + r of the whole along the split dimension.
  const int64_t per = (m.tp_dim == 0 ? m.rows : m.cols) / m.tp_parts;  // a block's rows or columns in a part
  for (int r = to_whole ? 0 : t; r < (to_whole ? T : t + 1); ++r) {
    Tensor part = parts.slice(to_whole ? r * m.numel() : 0, m.numel());
    for (int b = 0; b < m.tp_parts; ++b) {
      const int64_t at = (static_cast<int64_t>(b) * T + r) * per;
      // dim 0: per rows of C, contiguous; dim 1: R rows of per columns, strided.
      const int64_t rows = m.tp_dim == 0 ? per : R, width = m.tp_dim == 0 ? C : per;
      const int64_t part_at = m.tp_dim == 0 ? b * per * C : b * per, whole_at = m.tp_dim == 0 ? at * C : at;
      const int64_t part_ld = m.tp_dim == 0 ? C : m.cols;
      Tensor w = whole.slice(whole_at, whole.numel() - whole_at), p = part.slice(part_at, part.numel() - part_at);
      if (to_whole) ops::copy_rows(be, w, C, p, part_ld, rows, width);
      else ops::copy_rows(be, p, part_ld, w, C, rows, width);
    }
  }
}

void assign_owners(std::vector<std::vector<MuonMatrix>*>& groups, int ranks, int steps) {
  std::vector<double> load(static_cast<size_t>(std::max(ranks, 1)), 0.0);
  for (std::vector<MuonMatrix>* g : groups) {
    std::vector<size_t> order(g->size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t i, size_t j) {
      return newton_schulz_flops((*g)[i].rows, (*g)[i].cols, steps) > newton_schulz_flops((*g)[j].rows, (*g)[j].cols, steps);
    });
    for (size_t i : order) {
      const auto least = std::min_element(load.begin(), load.end());
      (*g)[i].owner = static_cast<int>(least - load.begin());
      *least += newton_schulz_flops((*g)[i].rows, (*g)[i].cols, steps);
    }
  }
}

}  // namespace shardlab
