// muon.hpp — Muon (momentum orthogonalized by a Newton–Schulz iteration; torch.optim.Muon's
// definition) for the optimizer's whole matrices, and how a rank of a sharding group finds them.
//
// Muon updates a 2-D weight as a whole: its momentum-updated gradient is orthogonalized by five
// steps of a quintic iteration, a function of the whole matrix. ZeRO gives each rank an equal slice
// of a unit's flat elements, which cuts matrices apart, so a group whose elements are such a slice
// brings the unit whole (MatrixExchange::gather, an all-gather of the momentum-updated gradient),
// each matrix is iterated by one owner of the group (owners balanced by the iteration's FLOPs,
// assign_owners), and the results come back to the slices (MatrixExchange::scatter, a
// reduce-scatter that adds the owner's result to the others' zeros, which is exact).
#pragma once
#include <cstdint>
#include <vector>

#include "memory/pool.hpp"

namespace shardlab {

enum class MuonAdjustLr : uint8_t { original, match_rms_adamw };
MuonAdjustLr parse_muon_adjust_lr(const std::string& s);  // InputError naming the choices otherwise
const char* muon_adjust_lr_name(MuonAdjustLr a);

// torch.optim.Muon's momentum, Muon's default wherever --momentum is not given (sgd's is 0.9).
inline constexpr float kMuonMomentum = 0.95f;

struct MuonConfig {
  int ns_steps = 5;
  DType ns_dtype = DType::bf16;  // the iteration's arithmetic (torch's is bf16)
  MuonAdjustLr adjust_lr = MuonAdjustLr::original;
  bool nesterov = true;
  float eps = 1e-7f;
  float a = 3.4445f, b = -4.7750f, c = 2.0315f;  // torch's quintic coefficients
  void validate() const;
};

// The learning-rate ratio torch's _adjust_lr gives a parameter of shape (A, B) (Hugging Face's
// shape: a GPT-2 Conv1D is (in, out)): original sqrt(max(1, A / B)), match_rms_adamw 0.2 sqrt(max(A, B)).
double muon_lr_ratio(MuonAdjustLr how, int64_t A, int64_t B);
// FLOPs of one orthogonalization of a rows x cols matrix: each step X X^T, (X X^T)^2 and the
// product with X, on the wide orientation (m = min, n = max): steps (4 m^2 n + 2 m^3).
double newton_schulz_flops(int64_t rows, int64_t cols, int steps);

// g (rows x cols, row-major, f32) orthogonalized into out (f32; may be g): torch's
// _zeropower_via_newtonschulz. The iteration runs in cfg.ns_dtype: bf16 storage on a backend with
// fast bf16 GEMMs (a GPU), else f32 storage rounded to bf16 after every operation; its buffers
// are workspace from `pool`.
void newton_schulz(Pool& pool, Tensor g, Tensor out, int64_t rows, int64_t cols, const MuonConfig& cfg);

// A matrix Muon updates: where it lies in its unit's flat buffer, its stored shape (this rank's
// part under tensor parallelism), its learning-rate ratio (from Hugging Face's shape of the whole
// tensor), and how tensor parallelism split it: along tp_dim (-1: not split), each of tp_parts
// blocks of that dimension cut into the group's ranks' pieces (TpSplit's layout).
struct MuonMatrix {
  int64_t offset = 0, rows = 0, cols = 0;
  double lr_ratio = 1;
  int owner = 0;  // the rank of the group that iterates it (assign_owners)
  int tp_dim = -1, tp_parts = 1;
  int64_t numel() const { return rows * cols; }
};

// The tensor-parallel group's parts of a split matrix and the whole: `parts` holds the T ranks'
// parts (rows x cols each) in rank order; to_whole writes them into `whole` (the whole matrix,
// row-major), else rank t's part is taken back out of it into `parts`' first part.
void tp_pieces(Backend& be, Tensor parts, Tensor whole, const MuonMatrix& m, int T, int t, bool to_whole);

// Owners for every matrix of every group, in order, over `ranks` ranks: largest iteration first to
// the least loaded rank (the lowest on a tie), loads carried across groups; the same on every rank.
void assign_owners(std::vector<std::vector<MuonMatrix>*>& groups, int ranks, int steps);

// The collectives Muon needs (shard/matrix_exchange.hpp: over a ZeRO shard group, where a group's
// elements are a slice of its unit, or the tensor-parallel group, whose ranks hold parts of a
// matrix). gather: whole <- every rank's part, in rank order; scatter: part <- the sum over ranks of
// whole's slice at this rank.
class MatrixExchange {
 public:
  virtual ~MatrixExchange() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  virtual void gather(Tensor part, Tensor whole) = 0;
  virtual void scatter(Tensor whole, Tensor part) = 0;
};

}  // namespace shardlab
