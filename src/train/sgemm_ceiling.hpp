// sgemm_ceiling.hpp — sgemm throughput on the products a training step runs, for every candidate the
// backend can use (on the cpu: oneDNN and OpenBLAS), beside the one the backend picks. The best
// candidate per product is the host's sgemm ceiling that train's progress line and the step
// benchmarks compare against; bench-gemm prints the whole table.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "memory/pool.hpp"
#include "src/model/spec.hpp"
#include "shard/step_config.hpp"

namespace shardlab {

struct GemmBenchConfig {
  int64_t dim = 768;      // model width C
  int64_t tokens = 1024;  // B*T rows
  // The step's products: attention's per-head ones need heads and seq, the LM head's vocab
  // (0 = leave those products out); each is weighted by how often a step runs it.
  int64_t heads = 12, seq = 1024, vocab = 0, layers = 1;
  int64_t kv_heads = 0;  // K/V heads of grouped-query attention (0: as many as heads)
  int64_t head_dim = 0;  // each head's size (0: dim / heads)
  // The step's other products as the model issues them (step_gemms: a step on the meta backend),
  // for any family; empty: GPT-2's linears and LM head, from dim, layers and vocab.
  std::vector<GemmDesc> recorded;
  bool grid = true;       // also the four layer shapes under all four transpose combinations
  double seconds = 0.3;   // minimum time per product and candidate (three windows; the best counts)
};

struct GemmBenchResult {
  double ceiling = 0;     // the step's products, each at its best candidate: FLOPs / time, GFLOP/s
  double chosen = 0;      // the same at the candidate the backend picks
  double worst_ratio = 1; // the lowest chosen / best over every product timed (grid included)
  std::string worst;      // that product
};

// Prints one line per product with every candidate's GFLOP/s, the pick and its share of the best.
GemmBenchResult run_gemm_benchmark(Pool& pool, const GemmBenchConfig& cfg, std::FILE* out);

// The products of one rank's micro-step of `spec` with `micro_batch` sequences, as its units issue
// them (step_gemms: any family) and as attention runs them inside the CPU kernels, without the grid:
// what bench-train and train's progress line measure their sgemm ceiling on.
GemmBenchConfig step_gemm_config(const ModelSpec& spec, int64_t micro_batch);
// The same for rank 0 of `world` ranks under `step`'s mesh (layout.dims, sequence_parallel):
// under tensor parallelism a rank's part, whose linears are 1/tp as wide and whose attention runs
// heads/tp heads. At tp 1 the products are the whole model's, as above.
GemmBenchConfig step_gemm_config(const StepConfig& step, int world, int64_t micro_batch);
// FLOPs of one call of each distinct product of cfg, every candidate: a timing pass costs about
// 10 times this (a warm-up and three windows of at least three calls).
double gemm_benchmark_pass_flops(const GemmBenchConfig& cfg);

struct TrainConfig;
class Communicator;
// train's --sgemm-ceiling auto: sets cfg.sgemm_ceiling, what the progress line's share of the CPU's
// sgemm ceiling is taken against, and cfg.sgemm_ceiling_note, where it came from. It times this
// step's products (bench-train's measurement, shorter) before the first step, on every rank at once,
// since the ranks share the host as they will while training; the job's ceiling is their sum. A
// step whose products would take long to time (a larger model: about 10 passes over them, both
// libraries) is not measured; the note says so. Collective over comm.
void measure_sgemm_ceiling(TrainConfig& cfg, Backend& be, Communicator& comm);
// train's --sgemm-ceiling FLAG: auto (measure_sgemm_ceiling), off, or a rank's GFLOP/s from
// bench-train ("ceiling"). InputError for anything else, and for a figure on a GPU.
void set_sgemm_ceiling(TrainConfig& cfg, const std::string& flag, Backend& be, Communicator& comm);

// Whether the step's products are too small for a second CPU thread to pay: its largest product on
// one rank (a micro-step's tokens x the MLP's width or the vocabulary x the model's width, 1/tp of
// it) is under kThreadedProductFlops. On 2 cores of this machine type (AVX-512), the `small` preset
// (C 128, T 128, B 8; 134 MFLOP) steps in 65 ms on one thread and 83 ms on two; C 256 (537 MFLOP)
// in 226 ms on one and 131 ms on two (docs/strategies-and-mesh.md, "Threads").
inline constexpr double kThreadedProductFlops = 256e6;
bool step_too_small_for_threads(const TrainConfig& cfg, int world);

}  // namespace shardlab
