// token_ids.cpp — the CUDA backend's token ids: the operation families take them in host memory
// (the trainer's Batch holds host vectors); they are checked on the host, as the CPU kernels check
// them, turned into what a kernel indexes (a shard's rows, positions grouped by row) and copied to
// device scratch on the compute stream through pinned slots.
#include <climits>
#include <cstring>

#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/ops/dispatch.hpp"

namespace shardlab::cuda {

// n host ids in [0, V): the CPU kernels' check, with their message.
void check_ids(const int32_t* ids, int64_t n, int64_t V, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    SHARD_CHECK(ids[i] >= 0 && ids[i] < V, "{} id {} at position {} outside vocabulary of {}", what, ids[i], i, V);
}

// host_ids_ -> device scratch on the compute stream, through a pinned slot: from pageable
// memory cudaMemcpyAsync would first wait for the stream (a host sync per upload). The slot is
// reused id_slots_.size() uploads later, once the copy that read it has run (its event). Nothing
// to upload, no copy: the lists of launches.hpp (embedding, losses) count this copy by that rule.
const int32_t* CudaBackend::upload_host_ids() {
  const size_t bytes = host_ids_.size() * sizeof(int32_t);
  if (bytes == 0) return nullptr;
  IdSlot& slot = id_slots_[next_id_slot_++ % id_slots_.size()];
  if (slot.copied) CUDA_CHECK(cudaEventSynchronize(slot.copied));
  else CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
  if (slot.bytes < bytes) {
    if (slot.host) CUDA_CHECK(cudaFreeHost(slot.host));
    slot.host = nullptr;
    CUDA_CHECK(cudaMallocHost(&slot.host, bytes));
    slot.bytes = bytes;
  }
  std::memcpy(slot.host, host_ids_.data(), bytes);
  void* dev = device_scratch(bytes);
  CUDA_CHECK(cudaMemcpyAsync(dev, slot.host, bytes, cudaMemcpyHostToDevice, compute_));
  CUDA_CHECK(cudaEventRecord(slot.copied, compute_));
  return static_cast<const int32_t*>(dev);
}

// Checks n host ids against the vocabulary (the CPU kernels' check) and uploads them.
const int32_t* CudaBackend::upload_ids(const int32_t* ids, int64_t n, int64_t V, const char* what) {
  check_ids(ids, n, V, what);
  host_ids_.assign(ids, ids + n);
  return upload_host_ids();
}

// out (n) = each id's row in the shard [v0, v0 + rows) of the vocabulary, -1 outside it. Only the
// ids' sign can be checked here (check_shard_ids, as the CPU backend).
void CudaBackend::shard_rows(const int32_t* ids, int64_t n, int64_t v0, int64_t rows, const char* what,
                             std::vector<int32_t>& out) {
  ops::check_shard_ids(ids, n, what);
  SHARD_CHECK(v0 >= 0 && rows >= 0 && v0 + rows <= INT32_MAX, "{} shard [{}, {}) outside int32 ids", what, v0,
              v0 + rows);
  out.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = ids[i] - v0;
    out[static_cast<size_t>(i)] = r >= 0 && r < rows ? static_cast<int32_t>(r) : -1;
  }
}

const int32_t* CudaBackend::host_shard_rows(const int32_t* ids, int64_t n, int64_t v0, int64_t rows,
                                            const char* what) {
  shard_rows(ids, n, v0, rows, what, shard_rows_);
  return shard_rows_.data();
}

const int32_t* CudaBackend::upload_shard_rows(const int32_t* ids, int64_t n, int64_t v0, int64_t rows,
                                              const char* what) {
  shard_rows(ids, n, v0, rows, what, host_ids_);
  return upload_host_ids();
}

// Fills host_ids_ with [bucket rows (U) | offsets (U + 1) | positions (m)]: the distinct rows in
// ascending order, and each one's positions, ascending (a stable counting sort), for the m
// positions whose row is not negative (negative: another rank's vocabulary shard). Returns U.
int64_t CudaBackend::group_positions_by_row(const int32_t* rows, int64_t n, int64_t V) {
  SHARD_CHECK(n <= INT32_MAX, "embedding_backward: {} positions overflow int32 offsets", n);
  std::vector<int32_t> start(static_cast<size_t>(V) + 1, 0);  // start[v]: first slot of row v
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0) continue;
    SHARD_CHECK(rows[i] < V, "embedding row {} at position {} outside {} rows", rows[i], i, V);
    ++start[static_cast<size_t>(rows[i]) + 1];
    ++m;
  }
  int64_t buckets = 0;
  for (int64_t v = 0; v < V; ++v) {
    buckets += start[static_cast<size_t>(v) + 1] > 0;
    start[static_cast<size_t>(v) + 1] += start[static_cast<size_t>(v)];
  }
  host_ids_.resize(static_cast<size_t>(2 * buckets + 1 + m));
  int32_t* bucket_row = host_ids_.data();
  int32_t* offsets = bucket_row + buckets;
  int32_t* positions = offsets + buckets + 1;
  int64_t u = 0;
  for (int64_t v = 0; v < V; ++v) {
    if (start[static_cast<size_t>(v) + 1] == start[static_cast<size_t>(v)]) continue;
    bucket_row[u] = static_cast<int32_t>(v);
    offsets[u++] = start[static_cast<size_t>(v)];
  }
  offsets[buckets] = static_cast<int32_t>(m);
  for (int64_t i = 0; i < n; ++i)
    if (rows[i] >= 0) positions[start[static_cast<size_t>(rows[i])]++] = static_cast<int32_t>(i);
  return buckets;
}

}  // namespace shardlab::cuda
