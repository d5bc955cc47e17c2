// cp.cpp — context parallelism's pieces and options (cp.hpp).
#include "src/model/parallel/cp.hpp"

#include <fmt/format.h>

#include "src/core/check.hpp"

namespace shardlab {

CpMethod parse_cp_method(const std::string& s) {
  if (s == "allgather") return CpMethod::allgather;
  if (s == "ring") return CpMethod::ring;
  throw InputError(fmt::format("--cp-method '{}': expected allgather or ring", s));
}
const char* cp_method_name(CpMethod m) { return m == CpMethod::ring ? "ring" : "allgather"; }

CpBalance parse_cp_balance(const std::string& s) {
  if (s == "head-tail") return CpBalance::head_tail;
  if (s == "contiguous") return CpBalance::contiguous;
  throw InputError(fmt::format("--cp-balance '{}': expected head-tail or contiguous", s));
}
const char* cp_balance_name(CpBalance b) { return b == CpBalance::head_tail ? "head-tail" : "contiguous"; }

void check_cp_seq(int64_t T, int C, CpBalance b) {
  const int64_t cuts = b == CpBalance::head_tail ? 2 * int64_t{C} : C;
  SHARD_REQUIRE(C >= 1 && T % cuts == 0,
                "--cp {} with --cp-balance {}: a sequence of {} positions does not cut into {} equal pieces{}", C,
                cp_balance_name(b), T, cuts,
                b == CpBalance::head_tail ? fmt::format(" (2 x --cp: each rank holds one near the head and one near "
                                                        "the tail); --seq a multiple of {}",
                                                        cuts)
                                          : fmt::format("; --seq a multiple of {}", cuts));
}

std::vector<CpPiece> cp_pieces(int64_t T, int C, int r, CpBalance b) {
  SHARD_CHECK(C >= 1 && r >= 0 && r < C, "cp rank {} of {}", r, C);
  if (C == 1) return {{0, 0, T}};
  if (b == CpBalance::contiguous) {
    const int64_t len = T / C;
    return {{0, r * len, len}};
  }
  const int64_t len = T / (2 * int64_t{C});
  return {{0, r * len, len}, {len, (2 * int64_t{C} - 1 - r) * len, len}};
}

int64_t cp_causal_pairs(const std::vector<CpPiece>& pieces) {
  int64_t n = 0;
  for (const CpPiece& p : pieces) n += p.len * p.pos0 + p.len * (p.len + 1) / 2;
  return n;
}

int64_t CpContext::local() const { return seq / degree; }

std::vector<CpPiece> CpContext::batch_pieces(int64_t B) const {
  std::vector<CpPiece> out;
  for (int64_t b = 0; b < B; ++b)
    for (const CpPiece& p : pieces) out.push_back({b * local() + p.row0, p.pos0, p.len});
  return out;
}

}  // namespace shardlab
