// rope.cpp — the CUDA rotary position embedding (ops/rope.hpp): launcher in rope.cu.
#include <algorithm>

#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::cuda {

void rope(Backend& be, Tensor x, int64_t heads, const RopeFreqs& freqs, int64_t pos0, bool inverse, int64_t B,
          int64_t T, int64_t W) {
  static_assert(RopeFreqs::kMaxHalf == kRopeMaxHalf, "the kernel's frequency table must hold RopeFreqs's");
  RopeTable table{};  // a kernel parameter: 1 KB in the launch, no device buffer
  std::copy_n(freqs.inv_freq.begin(), freqs.half, table.inv_freq);
  CUDA_CHECK(launch_rope(x.ptr<float>(), B, T, W, heads, freqs.half, table, pos0, inverse,
                         CudaBackend::of(be).compute_stream()));
}

}  // namespace shardlab::cuda
