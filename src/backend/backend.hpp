// backend.hpp — Backend: the one interface between shardlab and a device. Kernels, streams and
// events, raw allocation (used only by memory::Pool) and copies. Two implementations: cpu/
// (oneDNN sgemm + OpenMP) and cuda/ (cuBLAS + CUDA kernels), chosen at run time by --device; and
// meta/, which accounts for memory and computes nothing (memory predictions).
//
// Conventions. Matrices are row-major. Element-wise kernels compute in f32 and take f32 tensors
// unless they say otherwise; `cast` moves between f32, bf16 and f16. Reductions write one f32 to
// `out` on the backend's device (no host sync on a GPU) and accumulate in higher precision than
// their inputs. Work is issued on a stream: on the CPU everything is synchronous and events are
// complete when recorded; on CUDA, kernels go to the compute stream and collectives to the comm
// stream, and the two are ordered by events, never by a host sync.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <functional>
#include <string>

#include "src/core/tensor.hpp"

namespace shardlab {

enum class Trans : uint8_t { N, T };

// C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b], for b in [0, batch), row-major.
// op(A) is (m, k), op(B) is (k, n), C is (m, n). Leading dimensions are row strides in elements.
struct GemmDesc {
  Trans trans_a = Trans::N;
  Trans trans_b = Trans::N;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.f;
  float beta = 0.f;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch entries
  DType a_type = DType::f32, b_type = DType::f32;  // A's and B's storage (bf16 on GPUs; f32 everywhere)
  DType c_type = DType::f32;                        // C; accumulation is always f32
  // f32 inputs may be rounded to this dtype first: a backend whose low-precision GEMMs are much
  // faster (low_precision_gemm()) does, so an f32 activation meets a bf16 weight on the tensor
  // cores; the others compute in f32 and ignore it.
  DType round_inputs_to = DType::f32;
};

enum class StreamKind : uint8_t { compute, comm };

// Rotary position embedding's frequencies for one head size, computed on the host by the model
// (HF's inv_freq = 1 / theta^(2i / head_dim), with Llama 3.1's frequency scaling when asked) and
// passed by value, so a CUDA kernel takes them as a parameter with no device copy.
struct RopeFreqs {
  static constexpr int kMaxHalf = 256;  // head_dim up to 512
  int64_t half = 0;                     // head_dim / 2
  std::array<float, kMaxHalf> inv_freq{};
};

// AdamW with decoupled weight decay (Loshchilov & Hutter): p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p).
struct AdamWArgs {
  float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.f;
  int64_t step = 1;         // 1-based, for bias correction
  float grad_scale = 1.f;   // gradients are multiplied by this first (clipping, averaging)
};

// SGD with momentum (PyTorch's form): b = mu * b + g + wd * p; p -= lr * b.
struct SgdArgs {
  float lr = 0.01f, momentum = 0.9f, weight_decay = 0.f;
  float grad_scale = 1.f;
};

class Event {
 public:
  virtual ~Event() = default;
  virtual bool done() const = 0;
  virtual void synchronize() = 0;  // host waits
};

struct BackendConfig {
  int threads = 0;        // CPU threads for this rank; 0 = cores / ranks on this node
  int local_ranks = 1;    // processes sharing this node (for the default thread count)
  int device_index = -1;  // CUDA device; -1 = local rank modulo device count
  int local_rank = 0;
  std::string cpu_gemm = "auto";  // sgemm library of the CPU backend: auto (by shape) | onednn | openblas
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string describe() const = 0;
  virtual int threads() const = 0;

  // Raw device memory. Only memory::Pool calls these; everything else allocates through a Pool.
  virtual void* raw_alloc(size_t bytes) = 0;
  virtual void raw_free(void* p, size_t bytes) = 0;
  // Host memory for the host tier of a Pool (pinned on CUDA, so copies can be asynchronous); on
  // the CPU and meta backends the same memory as raw_alloc.
  virtual void* raw_alloc_host(size_t bytes) { return raw_alloc(bytes); }
  virtual void raw_free_host(void* p, size_t bytes) { raw_free(p, bytes); }
  // The backend that computes on host memory: this one on the CPU and meta backends, a CPU
  // backend on CUDA (the host optimizer of --offload runs there).
  virtual Backend& host() { return *this; }

  // dst <- src, same dtype and element count; either may live on the host or on this device.
  virtual void copy(Tensor dst, Tensor src) = 0;

  // The CUDA stream behind `stream` (a cudaStream_t), for transports that issue work on it
  // (NCCL); nullptr on backends without streams. The device it computes on; -1 on the host.
  virtual void* native_stream(StreamKind) { return nullptr; }
  // Whether GEMMs with bf16 operands (and round_inputs_to) run much faster here than f32 ones: the
  // model then hands the gathered bf16 parameters to them (ParamSet::gemm) instead of f32 copies.
  virtual bool low_precision_gemm() const { return false; }
  virtual int device_index() const { return -1; }
  // The device's memory as the driver reports it, and what this backend's allocator has reserved
  // from it (the Pool's blocks live there). Their difference is what lives outside the pool: the
  // CUDA context, cuBLAS's workspace, NCCL's buffers (and, when ranks share a GPU, the others'
  // memory). All zero on backends without a device.
  struct DeviceMemory {
    uint64_t free = 0, total = 0, reserved = 0;
    uint64_t outside_pool() const { return total - free > reserved ? total - free - reserved : 0; }
  };
  virtual DeviceMemory device_memory() const { return {}; }
  // Named ranges for a profiler's timeline (NVTX on CUDA, so Nsight Systems shows units and
  // collectives); no-ops elsewhere. Use Backend::Range.
  virtual void range_push(const char*) {}
  virtual void range_pop() {}
  class Range {
   public:
    Range(Backend& be, const char* name) : be_(be) { be_.range_push(name); }
    ~Range() { be_.range_pop(); }
    Range(const Range&) = delete;
    Range& operator=(const Range&) = delete;

   private:
    Backend& be_;
  };

  virtual std::unique_ptr<Event> record(StreamKind stream) = 0;
  virtual void wait(StreamKind stream, const Event& event) = 0;  // stream waits on event
  virtual void synchronize() = 0;                                // host waits for all streams

  // Operations, grouped by family. A model family that needs a new operation (rmsnorm, rope,
  // swiglu, ...) adds it to its group, named by what it computes, with one implementation per
  // backend (cpu/, cuda/, meta/) tested against the CPU's.

  // ---- matrix products ----
  virtual void gemm(const GemmDesc& d, const void* a, const void* b, void* c) = 0;

  // ---- element-wise ----
  virtual void fill(Tensor x, float value) = 0;          // any dtype
  virtual void cast(Tensor dst, Tensor src) = 0;         // dst <- src, any dtypes, same numel (as copy)
  virtual void axpy(float alpha, Tensor x, Tensor y) = 0;  // y += alpha * x
  virtual void scale(Tensor x, float alpha) = 0;           // x *= alpha
  virtual void add(Tensor a, Tensor b, Tensor out) = 0;    // out = a + b (out may alias a or b)
  virtual void mul(Tensor a, Tensor b, Tensor out) = 0;    // out = a * b
  // x (N, OC) += bias (OC) on every row
  virtual void add_bias(Tensor x, Tensor bias) = 0;

  // ---- reductions ----
  // out[0] (+)= sum(x) / sum(x^2) / max|x|; accumulate adds to (or maxes with) what out holds.
  virtual void sum(Tensor x, Tensor out, bool accumulate) = 0;
  virtual void sum_squares(Tensor x, Tensor out, bool accumulate) = 0;
  virtual void max_abs(Tensor x, Tensor out, bool accumulate) = 0;
  // out[c] (+)= sum_r x[r, c] for x of shape (rows, cols): bias gradients.
  virtual void sum_rows(Tensor x, Tensor out, bool accumulate) = 0;

  // The layers' operations below are f32. Shapes: B batch, T time, C channels, H heads, V vocab,
  // N rows. Token ids are int32 in host memory on every backend (the CUDA backend copies them to
  // the device itself; the caller may reuse them once the call returns). "accumulate" gradients
  // add to what the buffer holds.

  // ---- embeddings: token and learned position ----
  // out (B*T, C) = wte[tokens] + wpe[t]; an empty wpe (no data: a family without learned
  // positions) adds nothing, and embedding_backward then leaves dwpe alone.
  virtual void embedding_forward(Tensor out, const int32_t* tokens, int64_t B, int64_t T, Tensor wte, Tensor wpe) = 0;
  // dwte[tokens] += dout, dwpe[t] += dout (accumulate)
  virtual void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int64_t B,
                                  int64_t T) = 0;

  // The vocabulary-parallel embedding (--tp): wte holds rows [v0, v0 + rows) of the whole token
  // embedding; out (B*T, C) = wte[token - v0] for tokens in that range and 0 for the others, plus
  // wpe[t] when wpe is not empty. Backward accumulates dwte[token - v0] += dout for tokens in
  // range only, and dwpe[t] += dout (when not empty). Tokens outside are other ranks' rows.
  virtual void embedding_forward_shard(Tensor out, const int32_t* tokens, int64_t B, int64_t T, Tensor wte, Tensor wpe,
                                       int64_t v0) = 0;
  virtual void embedding_backward_shard(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int64_t B,
                                        int64_t T, int64_t v0) = 0;

  // ---- normalisation ----
  // LayerNorm over the last dimension: inp, out (N, C); mean, rstd (N) saved for backward;
  // rstd = 1 / sqrt(variance + eps).
  virtual void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias,
                                 float eps) = 0;
  // dinp, dweight, dbias accumulate
  virtual void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                                  Tensor mean, Tensor rstd) = 0;

  // RMSNorm over the last dimension, in f32 (HF's LlamaRMSNorm): out = inp * rstd * weight with
  // rstd (N) = 1 / sqrt(mean(inp^2) + eps), saved for backward.
  virtual void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps) = 0;
  // dinp and dweight accumulate
  virtual void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd) = 0;

  // ---- positions ----
  // Rotary position embedding in place, in HF's convention (rotate_half): x is (B, T, W), and in
  // every row the first `heads` heads of head_dim channels (W >= heads * head_dim) rotate pairs
  // (i, i + head_dim/2) by the angle (pos0 + t) * inv_freq[i], with the angle and its cos and sin
  // computed in f32. inverse rotates by minus the angle: a rotation's gradient, so backward is
  // rope(dx, ..., inverse = true).
  virtual void rope(Tensor x, int64_t heads, int64_t head_dim, const RopeFreqs& freqs, int64_t pos0, bool inverse) = 0;

  // ---- activations ----
  // GELU, tanh approximation; backward: dinp = gelu'(inp) * dout (overwrites dinp)
  virtual void gelu_forward(Tensor out, Tensor inp) = 0;
  virtual void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) = 0;
  // SwiGLU (Llama's MLP): gate_up (N, 2F) holds [gate | up] in each row; out (N, F) =
  // silu(gate) * up. Backward overwrites dgate_up (N, 2F) from dout (N, F) and the saved gate_up.
  virtual void swiglu_forward(Tensor out, Tensor gate_up) = 0;
  virtual void swiglu_backward(Tensor dgate_up, Tensor gate_up, Tensor dout) = 0;

  // ---- attention ----
  // Causal self-attention with grouped-query heads, scores scaled by 1/sqrt(hd): qkv (B, T,
  // (H + 2 KV) hd) is laid out [q (H heads) | k (KV heads) | v (KV heads)] in each row, and query
  // head h reads K/V head h / (H / KV). KV == H is multi-head attention over GPT-2's [q | k | v]
  // of 3C. out (B, T, H hd); att (B, H, T, T) softmax probabilities (zero above the diagonal),
  // saved for backward.
  virtual void attention_forward(Tensor out, Tensor att, Tensor qkv, int64_t H, int64_t KV) = 0;
  // dqkv (like qkv) is overwritten; scratch holds attention_scratch_elems(T, H) floats.
  virtual void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor att, int64_t H, int64_t KV,
                                  Tensor scratch) = 0;

  // Attention over a KV cache (incremental decoding: sample). A sequence's keys and values live in
  // k_cache and v_cache, (B, S, KV hd) each, row p holding position p's K/V heads, so each new
  // position computes only its own row of attention_forward's. kv_cache_write copies the k and v
  // heads of qkv (B, T, (H + 2 KV) hd), positions [pos0, pos0 + T), into rows [pos0, pos0 + T).
  virtual void kv_cache_write(Tensor k_cache, Tensor v_cache, Tensor qkv, int64_t H, int64_t KV, int64_t pos0) = 0;
  // out (B, T, H hd): the queries of qkv, at positions pos0 + t, attend over cache rows [0, pos0 +
  // t] (written before: causal within the new positions), as attention_forward's rows pos0 + t do
  // over a whole sequence. No probabilities are kept: there is no backward.
  virtual void attention_cached(Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t H, int64_t KV,
                                int64_t pos0) = 0;

  // ---- losses ----
  // losses (N) = -log softmax(logits)[target]; when dlogits is not empty it receives
  // (softmax - onehot(target)) * dloss_scale (it may alias logits).
  virtual void cross_entropy(Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets,
                             float dloss_scale) = 0;

  // The vocabulary-parallel cross-entropy (--tp, Megatron's): logits (N, Vl) are columns [v0, v0 +
  // Vl) of the whole (N, V) logits, the first `valid` of them real (the rest vocabulary padding,
  // never counted). Between the three steps the caller reduces over the tensor-parallel group:
  // the row maxima (max), then the sums and the target logits (sum); the B*T logits are never
  // gathered. targets are int32 in host memory (as for cross_entropy), every one in [0, V).
  // mx (N) = the maximum of each row's valid columns (-inf with none).
  virtual void vocab_ce_max(Tensor mx, Tensor logits, int64_t valid) = 0;
  // sumexp (N) = the sum of exp(logit - mx) over each row's valid columns (with the reduced mx);
  // tlogit (N) = the target's logit where the target is in [v0, v0 + valid), else 0.
  virtual void vocab_ce_sums(Tensor sumexp, Tensor tlogit, Tensor logits, const int32_t* targets, int64_t v0,
                             int64_t valid, Tensor mx) = 0;
  // With the reduced mx, sumexp and tlogit: losses (N) = log(sumexp) + mx - tlogit; when dlogits
  // is not empty it receives (exp(logit - mx) / sumexp - onehot(target)) * dloss_scale in the valid
  // columns and 0 in the padding (it may alias logits).
  virtual void vocab_ce_finish(Tensor losses, Tensor dlogits, Tensor logits, const int32_t* targets, int64_t v0,
                               int64_t valid, Tensor mx, Tensor sumexp, Tensor tlogit, float dloss_scale) = 0;

  // ---- optimizers over flat f32 buffers (any shard of them) ----
  virtual void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWArgs& a) = 0;
  virtual void sgd_update(Tensor param, Tensor grad, Tensor momentum, const SgdArgs& a) = 0;
};

// Floats of scratch attention_backward needs: one batch entry's attention gradient (H, T, T).
inline int64_t attention_scratch_elems(int64_t T, int64_t H) { return H * T * T; }

std::unique_ptr<Backend> make_backend(Device device, const BackendConfig& cfg);
std::unique_ptr<Backend> make_cpu_backend(const BackendConfig& cfg);
// on_gemm, when set, sees every product the meta backend is asked for: a step's GEMMs as the
// model issues them (step_gemms in src/train/predict.hpp), for benchmarks' sgemm ceilings.
using GemmObserver = std::function<void(const GemmDesc&)>;
std::unique_ptr<Backend> make_meta_backend(GemmObserver on_gemm = {});
// Throws InputError when shardlab was built without CUDA or no device is visible.
std::unique_ptr<Backend> make_cuda_backend(const BackendConfig& cfg);
bool cuda_compiled();
int cuda_device_count();  // 0 without CUDA or without a device; never throws
Device parse_device(const std::string& s);
int default_cpu_threads(int local_ranks);  // max(1, usable cores / local_ranks)
// Runs f once on each thread of the CPU backend's OpenMP pool, the calling thread among them.
void on_every_cpu_thread(const std::function<void()>& f);

// Shape checks shared by the implementations.
void check_same_numel(const Tensor& a, const Tensor& b, const char* op);
void check_f32(const Tensor& t, const char* op);
void check_gemm(const GemmDesc& d);
int64_t bias_rows(const Tensor& x, const Tensor& bias);  // x is (rows, bias.numel())
// Validate a layer operation's tensors (in the groups' order above); each returns the sizes its
// kernel needs.
int64_t embedding_shape(const Tensor& out, const Tensor& wte, const Tensor& wpe, int64_t B, int64_t T);  // C
int64_t embedding_backward_shape(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, int64_t B,
                                 int64_t T);  // C
// The vocabulary-parallel embedding's (a shard's first row v0 >= 0, then as above).
int64_t embedding_shard_shape(const Tensor& out, const Tensor& wte, const Tensor& wpe, int64_t B, int64_t T,
                              int64_t v0);  // C
int64_t embedding_backward_shard_shape(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, int64_t B,
                                       int64_t T, int64_t v0);  // C
// Ids of the whole vocabulary seen by one shard of it: only their sign can be checked there (the
// upper bound is the whole vocabulary's, which a shard's operation is not told).
void check_shard_ids(const int32_t* ids, int64_t n, const char* what);
std::array<int64_t, 2> layernorm_shape(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                       const Tensor& weight, const Tensor& bias, const char* op);  // {N, C}
std::array<int64_t, 2> layernorm_backward_shape(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                                const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                                const Tensor& mean, const Tensor& rstd);  // {N, C}
std::array<int64_t, 2> rmsnorm_shape(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                                     const char* op);  // {N, C}
std::array<int64_t, 2> rmsnorm_backward_shape(const Tensor& dinp, const Tensor& dweight, const Tensor& dout,
                                              const Tensor& inp, const Tensor& weight, const Tensor& rstd);  // {N, C}
// {B, T, W}
std::array<int64_t, 3> rope_shape(const Tensor& x, int64_t heads, int64_t head_dim, const RopeFreqs& freqs);
std::array<int64_t, 2> swiglu_shape(const Tensor& out, const Tensor& gate_up, const char* op);  // {N, F}
// Validates attention tensors and returns {B, T, C} with C = H hd, the output's channels.
std::array<int64_t, 3> attention_shape(const Tensor& qkv, const Tensor& out, const Tensor& att, int64_t H, int64_t KV,
                                       const char* op);
void check_attention_backward(const Tensor& dqkv, const Tensor& qkv, const Tensor& scratch, int64_t T, int64_t H);
// Validates the cached attention's tensors (kv_cache_write: out empty) and returns {B, T, C, S}:
// C = H hd, the output's channels; S the cache's rows, at least pos0 + T.
std::array<int64_t, 4> attention_cached_shape(const Tensor& out, const Tensor& qkv, const Tensor& k_cache,
                                              const Tensor& v_cache, int64_t H, int64_t KV, int64_t pos0,
                                              const char* op);
std::array<int64_t, 2> cross_entropy_shape(const Tensor& losses, const Tensor& dlogits, const Tensor& logits);  // {N, V}
// The vocabulary-parallel loss's rows and columns, {N, Vl}, from mx (N) and logits (N, Vl); valid <= Vl.
// vocab_ce_shape checks vocab_ce_max's tensors; the others their step's (every per-row one N long,
// dlogits like logits when not empty, v0 >= 0).
std::array<int64_t, 2> vocab_ce_shape(const Tensor& mx, const Tensor& logits, int64_t valid);
std::array<int64_t, 2> vocab_ce_sums_shape(const Tensor& sumexp, const Tensor& tlogit, const Tensor& logits,
                                           const Tensor& mx, int64_t v0, int64_t valid);
std::array<int64_t, 2> vocab_ce_finish_shape(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                             const Tensor& mx, const Tensor& sumexp, const Tensor& tlogit, int64_t v0,
                                             int64_t valid);

}  // namespace shardlab
