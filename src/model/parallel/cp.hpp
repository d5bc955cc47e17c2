// cp.hpp — context parallelism (--cp C): every sequence of a micro-batch is cut into pieces spread
// over the C ranks of a cp group (src/comm/axes.hpp), so one rank holds T / C of its positions and
// their activations. Everything but attention is per position and runs on the rank's rows as it
// would on a whole sequence (the positions themselves follow the pieces: RoPE's angles, GPT-2's
// learned positions). Attention brings every key and value to the queries that see them:
//
//   allgather  each layer all-gathers the group's K/V rows (Llama 3's choice: one collective, small
//              under GQA), lays them out in sequence order, and runs the fused kernel once per
//              piece, its queries at their causal offset; backward gathers them again (nothing of
//              size T is kept between forward and backward), computes dK/dV over the whole
//              sequence and reduce-scatters them back to the ranks that own those rows.
//   ring       a ring of point-to-point exchanges (Ring Attention, Megatron's p2p): each step the
//              rank computes its pieces against the K/V rows it holds while they move on to the
//              next rank, merging partial results through the log-sum-exp; dK/dV travel the ring
//              beside them in backward. Holds two ranks' rows instead of the whole sequence's.
//
// Balance (--cp-balance): causal attention's work grows with the position, so head-tail cuts each
// sequence into 2C pieces and gives rank r pieces r and 2C-1-r (every rank the same number of
// (query, key) pairs: Llama 3 and torchtitan do the same); contiguous gives rank r piece r of C.
//
// The cp ranks hold different tokens of the same sequences, so their gradients add up like
// data-parallel ranks': strategies reduce over dp x cp and ZeRO/FSDP shard over dp_shard x cp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shardlab {

class Communicator;

enum class CpMethod : uint8_t { allgather, ring };
enum class CpBalance : uint8_t { head_tail, contiguous };
CpMethod parse_cp_method(const std::string& s);  // InputError naming the choices otherwise
const char* cp_method_name(CpMethod m);
CpBalance parse_cp_balance(const std::string& s);
const char* cp_balance_name(CpBalance b);

// --cp-method and --cp-balance (the degree is ParallelDims::cp).
struct CpConfig {
  CpMethod method = CpMethod::allgather;
  CpBalance balance = CpBalance::head_tail;
  bool operator==(const CpConfig&) const = default;
};

// Consecutive positions of every sequence held by one rank: its local rows [row0, row0 + len) are
// the sequence's positions [pos0, pos0 + len).
struct CpPiece {
  int64_t row0 = 0, pos0 = 0, len = 0;
  bool operator==(const CpPiece&) const = default;
};
// Rank r's pieces of a T-position sequence over C ranks, in local row order (pos0 ascending).
std::vector<CpPiece> cp_pieces(int64_t T, int C, int r, CpBalance b);
// The (query, key) pairs causal attention computes for these pieces: each query sees every key
// up to its own position.
int64_t cp_causal_pairs(const std::vector<CpPiece>& pieces);
// T against the degree: InputError naming both unless the pieces are whole (2C of them head-tail).
void check_cp_seq(int64_t T, int C, CpBalance b);

// What a rank's units need to compute on their pieces (the Batch points at it; none at cp 1).
struct CpContext {
  int degree = 1, rank = 0;
  CpConfig config;
  Communicator* comm = nullptr;  // the cp group's
  int64_t seq = 0;               // positions of a whole sequence
  std::vector<CpPiece> pieces;   // this rank's
  int64_t local() const;         // rows per sequence held here: seq / degree
  bool active() const { return degree > 1; }
  // Every sequence's pieces in a (B, Tl) batch, sequence after sequence, row0 counted over all B Tl
  // rows: per-position operations that depend on the position (RoPE, learned positions) run piece
  // by piece over them.
  std::vector<CpPiece> batch_pieces(int64_t B) const;
  // (query, key) pairs per sequence and head this rank's attention forward calls computed since it
  // was built (a test reads it); seconds this rank spent in the cp group's collectives, calls and
  // waits (the trainer reads and resets it each step: the time the group waited on its exchanges).
  int64_t pairs = 0;
  double wait_s = 0;
};

}  // namespace shardlab
