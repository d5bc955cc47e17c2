// launches.hpp — what each CUDA operation puts on its stream, declared once in plain C++: the
// kernels with their grids, the cuBLAS calls and the copies, in order, as functions of the
// operation's sizes. The CUDA launchers (*.cu, and the entry points in cuda/*.cpp) take their grids
// from these functions, and the meta backend's cost ledger counts the same lists without a GPU, so
// a prediction's launches and grids cannot drift from the device's. Also the host-side grid
// constants and helpers the kernels share (kernel_util.cuh includes this header).
//
// Compiled by the host compiler and by nvcc, without the CUDA toolkit's headers: GemmDesc is only
// declared here (src/backend/backend.hpp defines it), so nvcc never parses the Backend interface.
//
// Arguments: each function takes sizes of its entry point (cuda/ops.hpp, or the CudaBackend
// primitive), in their order, without pointers or streams: a Tensor becomes its element count, a
// struct (RopeFreqs, QuantSpec) the fields that shape the launch. Two kinds of extra argument:
//  * `aligned`: every pointer of a float4 pack kernel is 16-byte aligned. The .cu passes its own
//    test; the meta backend's blocks are 256-byte aligned, hence the default.
//  * what the operation reads from its data rather than its shape (embedding_backward's buckets).
// What these lists leave out: stream-ordered allocation of scratch (cudaMallocAsync /
// cudaFreeAsync when a scratch buffer grows), event records, host synchronisations, and the naive
// attention's products, which are more than a Launches holds (attention_*_launches).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <span>

#include "src/backend/ops/flash_shape.hpp"
#include "src/backend/ops/mla_heads.hpp"
#include "src/core/dtype.hpp"
#include "src/core/elem_range.hpp"

namespace shardlab {
struct GemmDesc;  // src/backend/backend.hpp
}

namespace shardlab::cuda {

// ---- grid constants and helpers (host and device) ---------------------------------------------

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kThreads / kWarp;  // warp-per-row kernels
// Blocks of per-block partial results a reduction needs in its workspace (doubles).
inline constexpr int kReduceBlocks = 512;
// Threads of a block of the flash merge (a thread per query row).
inline constexpr int kFlashMergeThreads = 256;

// Blocks of a grid-stride loop over n elements: at least one, at most 65535 * 8 (the loop strides
// over the rest).
inline int grid_for(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65535 * 8));
}

// A column sum (sum_rows, a bias gradient) in two deterministic stages of one launch: blocks of
// kWarp columns x a chunk of rows each write their columns' partial sums (doubles) over the chunk,
// then the last block of each column tile to finish folds the tile's chunks in order. The chunks
// are a function of the shape only (enough blocks to fill a device, at least kSumRowsMinRows rows
// each).
inline constexpr int64_t kSumRowsBlocks = 528;   // 4 per SM of an H100 / H200
inline constexpr int64_t kSumRowsMinRows = 32;
inline int64_t sum_rows_tiles(int64_t cols) { return std::max<int64_t>(1, (cols + kWarp - 1) / kWarp); }
inline int64_t sum_rows_chunks(int64_t rows, int64_t cols) {
  const int64_t want = (kSumRowsBlocks + sum_rows_tiles(cols) - 1) / sum_rows_tiles(cols);
  const int64_t most = std::max<int64_t>(1, (rows + kSumRowsMinRows - 1) / kSumRowsMinRows);
  return std::min(want, most);
}
inline int64_t sum_rows_chunk_rows(int64_t rows, int64_t cols) {
  const int64_t chunks = sum_rows_chunks(rows, cols);
  return std::max<int64_t>(1, (rows + chunks - 1) / chunks);
}

// Blocks for `rows` rows at one warp each.
inline int row_blocks(int64_t rows) { return static_cast<int>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

// float4 packs need whole packs per row (n % 4 == 0) and every pointer 16-byte aligned.
inline bool packable(int64_t n, bool aligned) { return aligned && n % 4 == 0; }
// Every pointer 16-byte aligned (null is: an absent operand): packable's `aligned`, and what
// cuBLASLt's tensor-core kernels ask of theirs (gemm_epilogue.cpp).
template <class... P>
bool aligned16(const P*... ptrs) {
  return ((reinterpret_cast<uintptr_t>(ptrs) % 16 == 0) && ...);
}

// LayerNorm's (and RMSNorm's) backward chunking of N rows: at most 256 chunks of at least 32 rows
// (fewer when N is small). A function of N only, which is what makes dw/db reproducible.
inline int64_t layernorm_chunks(int64_t N) { return std::clamp<int64_t>((N + 31) / 32, 1, 256); }

// The norms' backward in one launch (norm.cu's norm_backward_fused_kernel): norm_fused_blocks(N)
// blocks, each over a chunk of rows, of norm_fused_warps(C, stats) warps; a warp takes its rows in
// turn (dinp row by row) and adds their dw (and db: stats 2) terms into a shared row of stats x C
// floats of its own, the block adds its warps' rows in order into its chunk's partial, and the
// last block to arrive folds the chunks in order. All a function of the shape: reproducible. 0
// warps where two such rows do not fit a block's 48 KiB of shared memory (LayerNorm past C 3,068,
// RMSNorm past 6,136): the three-launch form (dinp, partial, fold) then.
inline constexpr int64_t kNormFusedSmem = 48 * 1024 - 64;  // bytes, less the block's own flag
inline int norm_fused_warps(int64_t C, int stats) {
  const int64_t w = std::min<int64_t>(kRowsPerBlock, kNormFusedSmem / std::max<int64_t>(1, stats * C * 4));
  return w >= 2 ? static_cast<int>(w) : 0;
}
inline int64_t norm_fused_blocks(int64_t N) { return std::clamp<int64_t>((N + 31) / 32, 1, 264); }

// Elements a GEMM operand spans: `rows` rows of `ld` in each of `batch` entries `stride` apart.
inline int64_t gemm_operand_elems(int64_t batch, int64_t stride, int64_t rows, int64_t ld) {
  return (batch - 1) * stride + rows * ld;
}
// Whether CudaBackend::gemm rounds an operand of dtype t to d.round_inputs_to first (a cast kernel).
bool gemm_rounds(const GemmDesc& d, DType t);

// ---- the lists ---------------------------------------------------------------------------------

enum class LaunchKind : uint8_t { kernel, library, copy, memset };
// One command an operation puts on its stream: a kernel with its grid (blocks x, y, z), a library
// call (cuBLAS: its grid is the library's, blocks() 0), a copy or a memset.
struct Launch {
  const char* name = "";
  LaunchKind kind = LaunchKind::kernel;
  uint32_t x = 0, y = 1, z = 1;
  int64_t blocks() const { return kind == LaunchKind::kernel ? int64_t{x} * y * z : 0; }
};
// What one operation issues, in order.
struct Launches {
  std::array<Launch, 8> at{};
  int count = 0;
  Launches& add(Launch l);  // SHARD_CHECK count < 8
  const Launch& operator[](int i) const;  // SHARD_CHECK 0 <= i < count
  const Launch* begin() const { return at.data(); }
  const Launch* end() const { return at.data() + count; }
};

// ---- CudaBackend's primitives (cuda_elementwise.cpp, cuda_backend.cpp) ----
Launches fill_launches(int64_t n);
Launches cast_launches(int64_t n);
// Backend::cast_ranges: one kernel per kCastRanges ranges (passed by value), a grid over their elements.
inline constexpr int kCastRanges = 16;
Launches cast_ranges_launches(std::span<const ElemRange> ranges);
Launches axpy_launches(int64_t n);
Launches scale_launches(int64_t n);
Launches add_launches(int64_t n);
Launches mul_launches(int64_t n);
Launches add_into_launches(int64_t n);
Launches add_bias_launches(int64_t N, int64_t OC, bool aligned = true);
Launches reduce_launches(int64_t n);  // sum, sum_squares and max_abs
Launches sum_rows_launches(int64_t rows, int64_t cols);
Launches copy_launches(bool host);  // host: one side is host memory (the copy then waits for the stream)
// The cast kernels of f32 operands gemm_rounds, then the product.
Launches gemm_launches(const GemmDesc& d);

// ---- the operation families (cuda/ops.hpp) ----
// The forward uploads the token ids (copy), then runs its kernel.
Launches embedding_forward_launches(int64_t B, int64_t T, int64_t C, bool aligned = true);
Launches embedding_forward_shard_launches(int64_t B, int64_t T, int64_t v0, int64_t C, bool aligned = true);
// dwpe: the family has learned positions (a dwpe kernel). buckets: the distinct rows among the
// B T ids (this shard's, for _shard), one block each, which only the ids tell: at most min(B T, V).
// The positions grouped by row are uploaded (copy) between the two kernels.
Launches embedding_backward_launches(int64_t B, int64_t T, int64_t C, bool dwpe, int64_t buckets);
Launches embedding_backward_shard_launches(int64_t B, int64_t T, int64_t v0, int64_t C, bool dwpe, int64_t buckets);
Launches layernorm_forward_launches(int64_t N, int64_t C);
Launches layernorm_backward_launches(int64_t N, int64_t C);
Launches rmsnorm_forward_launches(int64_t N, int64_t C);
Launches rmsnorm_backward_launches(int64_t N, int64_t C);
Launches head_rmsnorm_forward_launches(int64_t N, int64_t W, int64_t col0, int64_t heads, int64_t hd);
Launches head_rmsnorm_backward_launches(int64_t N, int64_t W, int64_t col0, int64_t heads, int64_t hd);
// half: RopeFreqs::half (head_dim / 2).
Launches rope_launches(int64_t heads, int64_t half, int64_t pos0, bool inverse, int64_t B, int64_t T, int64_t W);
// The latent attention's packing (one kernel over qkv's elements) and its backward (dq and dkv
// element-wise, then the shared rotary key's pairs, heads summed in order).
Launches mla_qkv_forward_launches(const MlaHeads& m, int64_t B, int64_t T);
Launches mla_qkv_backward_launches(const MlaHeads& m, int64_t B, int64_t T);
Launches gelu_forward_launches(int64_t n, bool aligned = true);
Launches gelu_backward_launches(int64_t n, bool aligned = true);
Launches swiglu_forward_launches(int64_t N, int64_t F);
Launches swiglu_backward_launches(int64_t N, int64_t F);
// The naive attention's own kernels only. Its products go through CudaBackend::gemm (f32 operands:
// gemm_launches is one library call each), and there are more of them than a Launches holds:
// forward issues B G score products (G = H / KV), this softmax, then B G output products; backward
// issues, per batch entry, 2 G products, the softmax backward listed here, then 2 G products, so
// the list is one batch entry's and the entry point issues it B times.
Launches attention_forward_launches(int64_t H, int64_t KV, int64_t B, int64_t T, int64_t C);
Launches attention_backward_launches(int64_t H, int64_t KV, int64_t B, int64_t T, int64_t C);
Launches flash_attention_forward_launches(const FlashShape& s);
Launches flash_attention_merge_launches(const FlashShape& s);
Launches flash_attention_backward_launches(const FlashShape& s);
// cuDNN's fused attention (ops/cudnn_attention.hpp), beside the casts the family issues through the
// Backend: one library call (cuDNN's SDPA graph; its kernels are cuDNN's to choose).
Launches cudnn_attention_launches(bool backward);
// bits, block: the QuantSpec's.
Launches quantize_blocks_launches(DType t, int64_t x_stride, int64_t rows, int64_t n, int bits, int64_t block);
Launches dequantize_blocks_launches(DType t, int64_t x_stride, int64_t rows, int64_t n, int bits, int64_t block,
                                    bool accumulate);
Launches copy_rows_launches(int64_t dst_ld, int64_t src_ld, int64_t rows, int64_t width);
Launches kv_cache_write_launches(int64_t H, int64_t KV, int64_t pos0, int64_t B, int64_t T, int64_t C, int64_t S);
Launches attention_cached_launches(int64_t H, int64_t KV, int64_t pos0, int64_t B, int64_t T, int64_t C, int64_t S);
// cross_entropy, vocab_ce_sums and vocab_ce_finish upload the targets (copy) before their kernel.
Launches cross_entropy_launches(int64_t N, int64_t V);
Launches vocab_ce_max_launches(int64_t N, int64_t Vl);
Launches vocab_ce_sums_launches(int64_t N, int64_t Vl);
Launches vocab_ce_finish_launches(int64_t N, int64_t Vl);
Launches adamw_update_launches(int64_t n, bool aligned = true);
Launches adamw_bf16_grad_launches(int64_t n);  // bf16 gradients: one element a thread
// adamw_update_segments: a kernel for each kAdamWSegmentsPerLaunch segments (of these element
// counts, in order), its grid grid_for(the batch's largest) blocks x the batch's segments; bf16
// gradients or f32 (one element a thread either way). At most 8 launches: 256 segments a call.
inline constexpr int kAdamWSegmentsPerLaunch = 32;
Launches adamw_segments_launches(std::span<const int64_t> numels, bool bf16_grads);
Launches sgd_update_launches(int64_t n, bool aligned = true);
Launches muon_momentum_launches(int64_t n);
Launches muon_normalize_launches(int64_t n);  // the sums of squares, the norm, the divide
Launches muon_apply_launches(int64_t n);
Launches moe_gather_launches(int64_t rows, int64_t C);
Launches moe_combine_launches(int64_t N, int64_t k, int64_t C, bool accumulate);
Launches moe_combine_backward_launches(int64_t N, int64_t k, int64_t C);

}  // namespace shardlab::cuda
