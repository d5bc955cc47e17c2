// cuda_layers.cpp — the CUDA Backend's operations of the models' layers, in backend.hpp's groups:
// embeddings, normalisation, positions, activations, attention (cuBLAS products around a softmax
// kernel, grouped-query heads included) and losses; and the upload of the token ids they take from
// the host.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "src/backend/cuda/cuda_backend.hpp"

namespace shardlab::cuda {
namespace {

// n host ids in [0, V): the CPU kernels' check, with their message.
void check_ids(const int32_t* ids, int64_t n, int64_t V, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    SHARD_CHECK(ids[i] >= 0 && ids[i] < V, "{} id {} at position {} outside vocabulary of {}", what, ids[i], i, V);
}

}  // namespace

// ---- embeddings ---------------------------------------------------------------------------------
// Token ids are host memory (the trainer's Batch holds host vectors): they are checked on the
// host, as the CPU kernels check them, and copied to device scratch on the compute stream.

void CudaBackend::embedding_forward(Tensor out, const int32_t* tokens, int64_t B, int64_t T, Tensor wte, Tensor wpe) {
  const int64_t C = embedding_shape(out, wte, wpe, B, T);
  const int32_t* ids = upload_ids(tokens, B * T, wte.dim(0), "token");
  const float* positions = wpe.data() != nullptr ? wpe.ptr<float>() : nullptr;  // null: none to add
  CUDA_CHECK(launch_embedding_forward(out.ptr<float>(), ids, wte.ptr<float>(), positions, B, T, C, compute_));
}

// Deterministic without atomics: positions are grouped by token on the host (a stable counting
// sort), and one block per distinct token adds its positions' rows in ascending order, as the CPU.
void CudaBackend::embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int64_t B,
                                     int64_t T) {
  const int64_t C = embedding_backward_shape(dwte, dwpe, dout, B, T);
  check_ids(tokens, B * T, dwte.dim(0), "token");  // before anything is launched
  if (dwpe.data() != nullptr)  // empty: a family without learned positions
    CUDA_CHECK(launch_embedding_backward_dwpe(dwpe.ptr<float>(), dout.ptr<float>(), B, T, C, compute_));
  const int64_t buckets = group_positions_by_row(tokens, B * T, dwte.dim(0));  // a token id is its row
  const int32_t* grouped = upload_host_ids();  // [bucket tokens | offsets | positions]
  CUDA_CHECK(launch_embedding_backward_dwte(dwte.ptr<float>(), dout.ptr<float>(), grouped, grouped + buckets,
                                            grouped + 2 * buckets + 1, buckets, C, compute_));
}

// ---- normalisation ------------------------------------------------------------------------------

void CudaBackend::layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias,
                                    float eps) {
  const auto [N, C] = layernorm_shape(out, mean, rstd, inp, weight, bias, "layernorm_forward");
  CUDA_CHECK(launch_layernorm_forward(out.ptr<float>(), mean.ptr<float>(), rstd.ptr<float>(), inp.ptr<float>(),
                                      weight.ptr<float>(), bias.ptr<float>(), N, C, eps, compute_));
}

void CudaBackend::layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                                     Tensor mean, Tensor rstd) {
  const auto [N, C] = layernorm_backward_shape(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  auto* workspace = static_cast<float*>(device_scratch(layernorm_backward_workspace(N, C) * sizeof(float)));
  CUDA_CHECK(launch_layernorm_backward(dinp.ptr<float>(), dweight.ptr<float>(), dbias.ptr<float>(), dout.ptr<float>(),
                                       inp.ptr<float>(), weight.ptr<float>(), mean.ptr<float>(), rstd.ptr<float>(),
                                       workspace, N, C, compute_));
}

void CudaBackend::rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps) {
  const auto [N, C] = rmsnorm_shape(out, rstd, inp, weight, "rmsnorm_forward");
  CUDA_CHECK(launch_rmsnorm_forward(out.ptr<float>(), rstd.ptr<float>(), inp.ptr<float>(), weight.ptr<float>(), N, C,
                                    eps, compute_));
}

void CudaBackend::rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd) {
  const auto [N, C] = rmsnorm_backward_shape(dinp, dweight, dout, inp, weight, rstd);
  auto* workspace = static_cast<float*>(device_scratch(rmsnorm_backward_workspace(N, C) * sizeof(float)));
  CUDA_CHECK(launch_rmsnorm_backward(dinp.ptr<float>(), dweight.ptr<float>(), dout.ptr<float>(), inp.ptr<float>(),
                                     weight.ptr<float>(), rstd.ptr<float>(), workspace, N, C, compute_));
}

// ---- positions ----------------------------------------------------------------------------------

void CudaBackend::rope(Tensor x, int64_t heads, int64_t head_dim, const RopeFreqs& freqs, int64_t pos0, bool inverse) {
  static_assert(RopeFreqs::kMaxHalf == kRopeMaxHalf, "the kernel's frequency table must hold RopeFreqs's");
  const auto [B, T, W] = rope_shape(x, heads, head_dim, freqs);
  RopeTable table{};  // a kernel parameter: 1 KB in the launch, no device buffer
  std::copy_n(freqs.inv_freq.begin(), freqs.half, table.inv_freq);
  CUDA_CHECK(launch_rope(x.ptr<float>(), B * T, T, W, heads, freqs.half, table, pos0, inverse, compute_));
}

// ---- activations --------------------------------------------------------------------------------

void CudaBackend::gelu_forward(Tensor out, Tensor inp) {
  check_same_numel(out, inp, "gelu_forward");
  CUDA_CHECK(launch_gelu_forward(out.ptr<float>(), inp.ptr<float>(), inp.numel(), compute_));
}

void CudaBackend::gelu_backward(Tensor dinp, Tensor inp, Tensor dout) {
  check_same_numel(dinp, inp, "gelu_backward");
  check_same_numel(dout, inp, "gelu_backward");
  CUDA_CHECK(launch_gelu_backward(dinp.ptr<float>(), inp.ptr<float>(), dout.ptr<float>(), inp.numel(), compute_));
}

void CudaBackend::swiglu_forward(Tensor out, Tensor gate_up) {
  const auto [N, F] = swiglu_shape(out, gate_up, "swiglu_forward");
  CUDA_CHECK(launch_swiglu_forward(out.ptr<float>(), gate_up.ptr<float>(), N, F, compute_));
}

void CudaBackend::swiglu_backward(Tensor dgate_up, Tensor gate_up, Tensor dout) {
  const auto [N, F] = swiglu_shape(dout, gate_up, "swiglu_backward");
  check_same_numel(dgate_up, gate_up, "swiglu_backward");
  CUDA_CHECK(launch_swiglu_backward(dgate_up.ptr<float>(), gate_up.ptr<float>(), dout.ptr<float>(), N, F, compute_));
}

// ---- attention ----------------------------------------------------------------------------------
// Per batch entry, cuBLAS strided-batched GEMMs read q, k and v in place in the (T, R) rows, R =
// (H + 2 KV) hd (leading dimension R; heads hd apart), and write the output to columns [h hd,
// (h+1) hd) of (T, C), C = H hd, as on the CPU.
//
// Grouped-query heads: query head h = kv G + g (G = H / KV) reads K/V head kv. A strided batch has
// one stride per operand, and the query heads of a batch must all reach their K/V head by that
// stride: so each product is issued once per member g of the groups, batched over the KV groups
// (query-side strides G hd and G T^2, K/V-side stride hd), its query-side operands offset by g
// heads. The shared K/V heads are read in place, never gathered into copies of H heads. MHA is
// G = 1: one GEMM batched over the H heads per product, the same calls as before grouped heads.
// dK and dV sum over a group's query heads: the first member overwrites, the others add (beta = 1)
// in g order, so the result is deterministic.

namespace {

// Issues `d` (batched over the KV groups) once per group member g in [0, G), with the operands
// advanced g steps; `sum` makes members after the first accumulate into C (its step is then 0).
void for_each_group_member(Backend& be, GemmDesc d, int64_t G, const float* a, int64_t a_step, const float* b,
                           int64_t b_step, float* c, int64_t c_step, bool sum) {
  for (int64_t g = 0; g < G; ++g) {
    if (sum && g > 0) d.beta = 1.f;
    be.gemm(d, a + g * a_step, b + g * b_step, c + g * c_step);
  }
}

}  // namespace

void CudaBackend::attention_forward(Tensor out, Tensor att, Tensor qkv, int64_t H, int64_t KV) {
  auto [B, T, C] = attention_shape(qkv, out, att, H, KV, "attention_forward");
  const int64_t hd = C / H, G = H / KV, R = qkv.dim(2), TT = T * T;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  for (int64_t b = 0; b < B; ++b) {  // scores, scaled: att = scale * q k^T
    const float* q = qkv.ptr<float>() + b * T * R;
    for_each_group_member(*this,
                          {.trans_b = Trans::T, .m = T, .n = T, .k = hd, .alpha = scale, .lda = R, .ldb = R, .ldc = T,
                           .batch = KV, .stride_a = G * hd, .stride_b = hd, .stride_c = G * TT},
                          G, q, hd, q + C, 0, att.ptr<float>() + b * H * TT, TT, false);
  }
  CUDA_CHECK(launch_causal_softmax(att.ptr<float>(), B * H * T, T, compute_));
  for (int64_t b = 0; b < B; ++b) {  // out_h = att_h v
    const float* v = qkv.ptr<float>() + b * T * R + C + KV * hd;
    for_each_group_member(*this,
                          {.m = T, .n = hd, .k = T, .lda = T, .ldb = R, .ldc = C, .batch = KV, .stride_a = G * TT,
                           .stride_b = hd, .stride_c = G * hd},
                          G, att.ptr<float>() + b * H * TT, TT, v, 0, out.ptr<float>() + b * T * C, hd, false);
  }
}

void CudaBackend::attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor att, int64_t H, int64_t KV,
                                     Tensor scratch) {
  auto [B, T, C] = attention_shape(qkv, dout, att, H, KV, "attention_backward");
  check_attention_backward(dqkv, qkv, scratch, T, H);
  const int64_t hd = C / H, G = H / KV, R = qkv.dim(2), TT = T * T, KVd = KV * hd;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  float* datt = scratch.ptr<float>();  // (H, T, T), reused by every batch entry (stream order)
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv.ptr<float>() + b * T * R;  // k at q + C, v at q + C + KVd; dqkv alike
    float* dq = dqkv.ptr<float>() + b * T * R;
    const float* a = att.ptr<float>() + b * H * TT;
    const float* dh = dout.ptr<float>() + b * T * C;
    for_each_group_member(*this,
                          {.trans_b = Trans::T, .m = T, .n = T, .k = hd, .lda = C, .ldb = R, .ldc = T, .batch = KV,
                           .stride_a = G * hd, .stride_b = hd, .stride_c = G * TT},
                          G, dh, hd, q + C + KVd, 0, datt, TT, false);  // d(att) = dh v^T
    for_each_group_member(*this,
                          {.trans_a = Trans::T, .m = T, .n = hd, .k = T, .lda = T, .ldb = C, .ldc = R, .batch = KV,
                           .stride_a = G * TT, .stride_b = G * hd, .stride_c = hd},
                          G, a, TT, dh, hd, dq + C + KVd, 0, true);  // dv = sum over the group of att^T dh
    CUDA_CHECK(launch_causal_softmax_backward(datt, a, H * T, T, scale, compute_));
    for_each_group_member(*this,
                          {.m = T, .n = hd, .k = T, .lda = T, .ldb = R, .ldc = R, .batch = KV, .stride_a = G * TT,
                           .stride_b = hd, .stride_c = G * hd},
                          G, datt, TT, q + C, 0, dq, hd, false);  // dq = dpre k
    for_each_group_member(*this,
                          {.trans_a = Trans::T, .m = T, .n = hd, .k = T, .lda = T, .ldb = R, .ldc = R, .batch = KV,
                           .stride_a = G * TT, .stride_b = G * hd, .stride_c = hd},
                          G, datt, TT, q, hd, dq + C, 0, true);  // dk = sum over the group of dpre^T q
  }
}

// Decoding's attention over a KV cache: one small kernel per op (a decoded position is one query
// row per head, too thin for cuBLAS's batched products to pay), the scores in device scratch.

void CudaBackend::kv_cache_write(Tensor k_cache, Tensor v_cache, Tensor qkv, int64_t H, int64_t KV, int64_t pos0) {
  const auto [B, T, C, S] = attention_cached_shape(Tensor(), qkv, k_cache, v_cache, H, KV, pos0, "kv_cache_write");
  CUDA_CHECK(launch_kv_cache_write(k_cache.ptr<float>(), v_cache.ptr<float>(), qkv.ptr<float>(), B, T, S, H, KV, C / H,
                                   pos0, compute_));
}

void CudaBackend::attention_cached(Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t H, int64_t KV,
                                   int64_t pos0) {
  const auto [B, T, C, S] = attention_cached_shape(out, qkv, k_cache, v_cache, H, KV, pos0, "attention_cached");
  auto* scores = static_cast<float*>(device_scratch(static_cast<size_t>(B * H * T * (pos0 + T)) * sizeof(float)));
  CUDA_CHECK(launch_attention_cached(out.ptr<float>(), qkv.ptr<float>(), k_cache.ptr<float>(), v_cache.ptr<float>(),
                                     scores, B, T, S, H, KV, C / H, pos0, compute_));
}

// ---- losses -------------------------------------------------------------------------------------

void CudaBackend::cross_entropy(Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets,
                                float dloss_scale) {
  const auto [N, V] = cross_entropy_shape(losses, dlogits, logits);
  float* d = dlogits.data() ? dlogits.ptr<float>() : nullptr;
  const int32_t* ids = upload_ids(targets, N, V, "target");
  CUDA_CHECK(launch_cross_entropy(losses.ptr<float>(), d, logits.ptr<float>(), ids, N, V, dloss_scale, compute_));
}

// ---- the vocabulary-parallel embedding and loss (--tp) ---------------------------------------
// Ids of the whole vocabulary become rows (columns) of this rank's shard on the host, -1 where
// another rank holds the id, so the kernels index the shard directly and need no v0: the
// embedding's kernels are the whole embedding's, whose rows are the ids themselves.

void CudaBackend::embedding_forward_shard(Tensor out, const int32_t* tokens, int64_t B, int64_t T, Tensor wte,
                                          Tensor wpe, int64_t v0) {
  const int64_t C = embedding_shard_shape(out, wte, wpe, B, T, v0);
  const int32_t* rows = upload_shard_rows(tokens, B * T, v0, wte.dim(0), "token");
  const float* positions = wpe.data() != nullptr ? wpe.ptr<float>() : nullptr;  // null: none to add
  CUDA_CHECK(launch_embedding_forward(out.ptr<float>(), rows, wte.ptr<float>(), positions, B, T, C, compute_));
}

// As embedding_backward, over the positions whose token is in this shard: the same per-row
// order of additions, so a shard's rows get the whole embedding's bits.
void CudaBackend::embedding_backward_shard(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int64_t B,
                                           int64_t T, int64_t v0) {
  const int64_t C = embedding_backward_shard_shape(dwte, dwpe, dout, B, T, v0);
  shard_rows(tokens, B * T, v0, dwte.dim(0), "token", shard_rows_);  // checks, before anything is launched
  if (dwpe.data() != nullptr)
    CUDA_CHECK(launch_embedding_backward_dwpe(dwpe.ptr<float>(), dout.ptr<float>(), B, T, C, compute_));
  const int64_t buckets = group_positions_by_row(shard_rows_.data(), B * T, dwte.dim(0));
  const int32_t* grouped = upload_host_ids();  // [bucket rows | offsets | positions]
  CUDA_CHECK(launch_embedding_backward_dwte(dwte.ptr<float>(), dout.ptr<float>(), grouped, grouped + buckets,
                                            grouped + 2 * buckets + 1, buckets, C, compute_));
}

void CudaBackend::vocab_ce_max(Tensor mx, Tensor logits, int64_t valid) {
  const auto [N, Vl] = vocab_ce_shape(mx, logits, valid);
  CUDA_CHECK(launch_vocab_ce_max(mx.ptr<float>(), logits.ptr<float>(), N, Vl, valid, compute_));
}

void CudaBackend::vocab_ce_sums(Tensor sumexp, Tensor tlogit, Tensor logits, const int32_t* targets, int64_t v0,
                                int64_t valid, Tensor mx) {
  const auto [N, Vl] = vocab_ce_sums_shape(sumexp, tlogit, logits, mx, v0, valid);
  const int32_t* cols = upload_shard_rows(targets, N, v0, valid, "target");
  CUDA_CHECK(launch_vocab_ce_sums(sumexp.ptr<float>(), tlogit.ptr<float>(), logits.ptr<float>(), cols,
                                  mx.ptr<float>(), N, Vl, valid, compute_));
}

void CudaBackend::vocab_ce_finish(Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets, int64_t v0,
                                  int64_t valid, Tensor mx, Tensor sumexp, Tensor tlogit, float dloss_scale) {
  const auto [N, Vl] = vocab_ce_finish_shape(losses, dlogits, logits, mx, sumexp, tlogit, v0, valid);
  float* d = dlogits.data() ? dlogits.ptr<float>() : nullptr;
  const int32_t* cols = upload_shard_rows(targets, N, v0, valid, "target");
  CUDA_CHECK(launch_vocab_ce_finish(losses.ptr<float>(), d, logits.ptr<float>(), cols, mx.ptr<float>(),
                                    sumexp.ptr<float>(), tlogit.ptr<float>(), N, Vl, valid, dloss_scale, compute_));
}

// ---- token ids ----------------------------------------------------------------------------------

// host_ids_ -> device scratch on the compute stream, through a pinned slot: from pageable
// memory cudaMemcpyAsync would first wait for the stream (a host sync per upload). The slot is
// reused kIdSlots uploads later, once the copy that read it has run (its event).
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
  check_shard_ids(ids, n, what);
  SHARD_CHECK(v0 >= 0 && rows >= 0 && v0 + rows <= INT32_MAX, "{} shard [{}, {}) outside int32 ids", what, v0,
              v0 + rows);
  out.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = ids[i] - v0;
    out[static_cast<size_t>(i)] = r >= 0 && r < rows ? static_cast<int32_t>(r) : -1;
  }
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
