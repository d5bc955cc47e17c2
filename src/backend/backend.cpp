#include "src/backend/backend.hpp"

#include <sched.h>

#include <algorithm>
#include <array>
#include <initializer_list>
#include <thread>

namespace shardlab {

std::unique_ptr<Backend> make_backend(Device device, const BackendConfig& cfg) {
  return device == Device::cpu ? make_cpu_backend(cfg) : make_cuda_backend(cfg);
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu;
  if (s == "cuda" || s == "gpu") return Device::cuda;
  throw InputError(fmt::format("unknown device '{}': expected cpu or cuda", s));
}

int default_cpu_threads(int local_ranks) {
  cpu_set_t set;
  int cores = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, local_ranks));
}

void check_same_numel(const Tensor& a, const Tensor& b, const char* op) {
  SHARD_CHECK(a.numel() == b.numel(), "{}: element counts differ: {} {} vs {} {}", op, a.numel(), a.shape_str(),
              b.numel(), b.shape_str());
}

void check_f32(const Tensor& t, const char* op) {
  SHARD_CHECK(t.dtype() == DType::f32, "{}: expects f32, got {} tensor {}", op, dtype_name(t.dtype()), t.shape_str());
}

std::array<int64_t, 3> attention_shape(const Tensor& qkv, const Tensor& out, const Tensor& att, int64_t H, int64_t KV,
                                       const char* op) {
  SHARD_CHECK(H > 0 && KV > 0 && H % KV == 0, "{}: {} query heads do not share {} K/V heads evenly", op, H, KV);
  SHARD_CHECK(qkv.ndim() == 3 && qkv.dim(2) % (H + 2 * KV) == 0, "{}: qkv {} must be (B, T, (H + 2 KV) hd), H={} KV={}",
              op, qkv.shape_str(), H, KV);
  const int64_t B = qkv.dim(0), T = qkv.dim(1), hd = qkv.dim(2) / (H + 2 * KV), C = H * hd;
  SHARD_CHECK(hd > 0 && out.numel() == B * T * C && att.numel() == B * H * T * T, "{}: qkv {} out {} att {} H={} KV={}",
              op, qkv.shape_str(), out.shape_str(), att.shape_str(), H, KV);
  return {B, T, C};
}

namespace {
int64_t embedding_forward_check(const Tensor& out, const Tensor& wte, const Tensor& wpe, int64_t B, int64_t T,
                                const char* op) {
  const int64_t C = wte.dim(1);
  SHARD_CHECK(out.numel() == B * T * C && (wpe.data() == nullptr || (wpe.dim(0) >= T && wpe.dim(1) == C)),
              "{}: out {} wte {} wpe {} B={} T={}", op, out.shape_str(), wte.shape_str(), wpe.shape_str(), B, T);
  return C;
}

int64_t embedding_backward_check(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, int64_t B, int64_t T,
                                 const char* op) {
  const int64_t C = dwte.dim(1);
  SHARD_CHECK(dout.numel() == B * T * C && (dwpe.data() == nullptr || dwpe.dim(1) == C), "{}: dout {} dwte {} dwpe {}",
              op, dout.shape_str(), dwte.shape_str(), dwpe.shape_str());
  return C;
}
}  // namespace

int64_t embedding_shape(const Tensor& out, const Tensor& wte, const Tensor& wpe, int64_t B, int64_t T) {
  return embedding_forward_check(out, wte, wpe, B, T, "embedding_forward");
}

int64_t embedding_backward_shape(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, int64_t B, int64_t T) {
  return embedding_backward_check(dwte, dwpe, dout, B, T, "embedding_backward");
}

int64_t embedding_shard_shape(const Tensor& out, const Tensor& wte, const Tensor& wpe, int64_t B, int64_t T,
                              int64_t v0) {
  SHARD_CHECK(v0 >= 0, "embedding_forward_shard: the shard's first row {} is negative", v0);
  return embedding_forward_check(out, wte, wpe, B, T, "embedding_forward_shard");
}

int64_t embedding_backward_shard_shape(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, int64_t B,
                                       int64_t T, int64_t v0) {
  SHARD_CHECK(v0 >= 0, "embedding_backward_shard: the shard's first row {} is negative", v0);
  return embedding_backward_check(dwte, dwpe, dout, B, T, "embedding_backward_shard");
}

void check_shard_ids(const int32_t* ids, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i) SHARD_CHECK(ids[i] >= 0, "{} id {} at position {} is negative", what, ids[i], i);
}

// N rows of C in out and inp, C weights and biases, N statistics.
std::array<int64_t, 2> layernorm_shape(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                       const Tensor& weight, const Tensor& bias, const char* op) {
  const int64_t C = weight.numel(), N = C > 0 ? inp.numel() / C : 0;
  SHARD_CHECK(C > 0 && inp.numel() == N * C && out.numel() == N * C && mean.numel() == N && rstd.numel() == N &&
                  bias.numel() == C,
              "{}: inp {} out {} mean {} rstd {} weight {} bias {}", op, inp.shape_str(), out.shape_str(),
              mean.shape_str(), rstd.shape_str(), weight.shape_str(), bias.shape_str());
  return {N, C};
}

// As the forward's (dinp in out's place, dbias in bias's), and dout like inp, dweight like weight.
std::array<int64_t, 2> layernorm_backward_shape(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                                const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                                const Tensor& mean, const Tensor& rstd) {
  const std::array<int64_t, 2> nc = layernorm_shape(dinp, mean, rstd, inp, weight, dbias, "layernorm_backward");
  check_same_numel(dout, inp, "layernorm_backward");
  check_same_numel(dweight, weight, "layernorm_backward");
  return nc;
}

std::array<int64_t, 2> rmsnorm_shape(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                                     const char* op) {
  const int64_t C = weight.numel(), N = C > 0 ? inp.numel() / C : 0;
  SHARD_CHECK(C > 0 && inp.numel() == N * C && out.numel() == N * C && rstd.numel() == N,
              "{}: inp {} out {} rstd {} weight {}", op, inp.shape_str(), out.shape_str(), rstd.shape_str(),
              weight.shape_str());
  return {N, C};
}

std::array<int64_t, 2> rmsnorm_backward_shape(const Tensor& dinp, const Tensor& dweight, const Tensor& dout,
                                              const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  const std::array<int64_t, 2> nc = rmsnorm_shape(dinp, rstd, inp, weight, "rmsnorm_backward");
  check_same_numel(dout, inp, "rmsnorm_backward");
  check_same_numel(dweight, weight, "rmsnorm_backward");
  return nc;
}

std::array<int64_t, 3> rope_shape(const Tensor& x, int64_t heads, int64_t head_dim, const RopeFreqs& freqs) {
  SHARD_CHECK(x.ndim() == 3 && heads > 0 && head_dim > 0 && head_dim % 2 == 0 && heads * head_dim <= x.dim(2) &&
                  freqs.half == head_dim / 2 && freqs.half <= RopeFreqs::kMaxHalf,
              "rope: x {} must be (B, T, W) with W >= heads {} x head_dim {} (even, at most {}); freqs for {} pairs",
              x.shape_str(), heads, head_dim, 2 * RopeFreqs::kMaxHalf, freqs.half);
  return {x.dim(0), x.dim(1), x.dim(2)};
}

std::array<int64_t, 2> swiglu_shape(const Tensor& out, const Tensor& gate_up, const char* op) {
  const int64_t F = out.ndim() >= 1 ? out.dim(out.ndim() - 1) : 0, N = F > 0 ? out.numel() / F : 0;
  SHARD_CHECK(F > 0 && gate_up.numel() == 2 * N * F, "{}: out {} must be (N, F) and gate_up {} (N, 2F)", op,
              out.shape_str(), gate_up.shape_str());
  return {N, F};
}

int64_t bias_rows(const Tensor& x, const Tensor& bias) {
  const int64_t OC = bias.numel();
  SHARD_CHECK(OC > 0 && x.numel() % OC == 0, "add_bias: x {} bias {}", x.shape_str(), bias.shape_str());
  return x.numel() / OC;
}

void check_attention_backward(const Tensor& dqkv, const Tensor& qkv, const Tensor& scratch, int64_t T, int64_t H) {
  check_same_numel(dqkv, qkv, "attention_backward");
  SHARD_CHECK(scratch.numel() >= attention_scratch_elems(T, H), "attention_backward: scratch of {} < {} floats",
              scratch.numel(), attention_scratch_elems(T, H));
}

std::array<int64_t, 4> attention_cached_shape(const Tensor& out, const Tensor& qkv, const Tensor& k_cache,
                                              const Tensor& v_cache, int64_t H, int64_t KV, int64_t pos0,
                                              const char* op) {
  SHARD_CHECK(H > 0 && KV > 0 && H % KV == 0, "{}: {} query heads do not share {} K/V heads evenly", op, H, KV);
  SHARD_CHECK(qkv.ndim() == 3 && qkv.dim(2) % (H + 2 * KV) == 0, "{}: qkv {} must be (B, T, (H + 2 KV) hd), H={} KV={}",
              op, qkv.shape_str(), H, KV);
  const int64_t B = qkv.dim(0), T = qkv.dim(1), hd = qkv.dim(2) / (H + 2 * KV), C = H * hd;
  const bool cache_ok = k_cache.ndim() == 3 && k_cache.dim(0) == B && k_cache.dim(2) == KV * hd &&
                        v_cache.ndim() == 3 && v_cache.dim(0) == B && v_cache.dim(1) == k_cache.dim(1) &&
                        v_cache.dim(2) == KV * hd;
  SHARD_CHECK(hd > 0 && cache_ok && pos0 >= 0 && pos0 + T <= k_cache.dim(1) &&
                  (out.data() == nullptr || out.numel() == B * T * C),
              "{}: qkv {} out {} k_cache {} v_cache {} must be (B, T, (H + 2 KV) hd), (B, T, H hd) and (B, S, KV hd) "
              "with pos0 + T <= S; H={} KV={} pos0={}",
              op, qkv.shape_str(), out.shape_str(), k_cache.shape_str(), v_cache.shape_str(), H, KV, pos0);
  return {B, T, C, k_cache.dim(1)};
}

std::array<int64_t, 2> cross_entropy_shape(const Tensor& losses, const Tensor& dlogits, const Tensor& logits) {
  const int64_t N = losses.numel();
  SHARD_CHECK(N > 0 && logits.numel() % N == 0, "cross_entropy: logits {} losses {}", logits.shape_str(),
              losses.shape_str());
  if (dlogits.data() != nullptr) check_same_numel(dlogits, logits, "cross_entropy");
  return {N, logits.numel() / N};
}

namespace {
// N rows from mx, Vl columns from logits, valid of them real; the other per-row tensors hold N.
std::array<int64_t, 2> vocab_ce_check(const Tensor& mx, const Tensor& logits, int64_t valid, const char* op,
                                      std::initializer_list<const Tensor*> rows) {
  const int64_t N = mx.numel();
  SHARD_CHECK(N > 0 && logits.numel() % N == 0 && valid >= 0 && valid <= logits.numel() / N,
              "{}: logits {} for {} rows with {} valid columns", op, logits.shape_str(), N, valid);
  for (const Tensor* t : rows) check_same_numel(*t, mx, op);
  return {N, logits.numel() / N};
}
}  // namespace

std::array<int64_t, 2> vocab_ce_shape(const Tensor& mx, const Tensor& logits, int64_t valid) {
  return vocab_ce_check(mx, logits, valid, "vocab_ce_max", {});
}

std::array<int64_t, 2> vocab_ce_sums_shape(const Tensor& sumexp, const Tensor& tlogit, const Tensor& logits,
                                           const Tensor& mx, int64_t v0, int64_t valid) {
  SHARD_CHECK(v0 >= 0, "vocab_ce_sums: the shard's first column {} is negative", v0);
  return vocab_ce_check(mx, logits, valid, "vocab_ce_sums", {&sumexp, &tlogit});
}

std::array<int64_t, 2> vocab_ce_finish_shape(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                             const Tensor& mx, const Tensor& sumexp, const Tensor& tlogit, int64_t v0,
                                             int64_t valid) {
  SHARD_CHECK(v0 >= 0, "vocab_ce_finish: the shard's first column {} is negative", v0);
  const std::array<int64_t, 2> nv = vocab_ce_check(mx, logits, valid, "vocab_ce_finish", {&losses, &sumexp, &tlogit});
  if (dlogits.data() != nullptr) check_same_numel(dlogits, logits, "vocab_ce_finish");
  return nv;
}

void check_gemm(const GemmDesc& d) {
  SHARD_CHECK(d.m >= 0 && d.n >= 0 && d.k >= 0 && d.batch >= 1, "gemm: m={} n={} k={} batch={}", d.m, d.n, d.k,
              d.batch);
  int64_t a_cols = d.trans_a == Trans::N ? d.k : d.m;
  int64_t b_cols = d.trans_b == Trans::N ? d.n : d.k;
  SHARD_CHECK(d.lda >= std::max<int64_t>(1, a_cols), "gemm: lda={} < {} columns of A", d.lda, a_cols);
  SHARD_CHECK(d.ldb >= std::max<int64_t>(1, b_cols), "gemm: ldb={} < {} columns of B", d.ldb, b_cols);
  SHARD_CHECK(d.ldc >= std::max<int64_t>(1, d.n), "gemm: ldc={} < n={}", d.ldc, d.n);
}

}  // namespace shardlab
