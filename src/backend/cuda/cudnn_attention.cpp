// cudnn_attention.cpp — cuDNN's fused attention (ops/cudnn_attention.hpp) through cudnn-frontend's
// graph API: one SDPA graph per shape and direction, built on first use (heuristics mode A) and
// kept with the backend's cuDNN handle, which runs on the compute stream. Compiled wherever the
// CUDA backend is; without cuDNN (SHARDLAB_WITH_CUDNN 0) the calls refuse.
//
// The operands stay where the family put them: q, k and v are strided views of the bf16 [q | k | v]
// rows (dims (B, heads, T, hd), strides (batch, hd, row, 1)), the output and the gradients likewise
// in their own buffers, the statistics (B, H, T, 1) f32: the lse the fused family saves. Written
// without a GPU to run it on: every call is checked, and the [cuda] test compares it with the CPU.
#include "src/backend/ops/cudnn_attention.hpp"

#include <cstdlib>

#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

#ifndef SHARDLAB_WITH_CUDNN
#define SHARDLAB_WITH_CUDNN 0
#endif
#if SHARDLAB_WITH_CUDNN
#include <cudnn_frontend.h>

#include <map>
#include <tuple>
#include <unordered_map>
#endif

namespace shardlab {
bool cudnn_attention_built() { return SHARDLAB_WITH_CUDNN != 0; }
}  // namespace shardlab

namespace shardlab::cuda {

#if SHARDLAB_WITH_CUDNN
namespace fe = cudnn_frontend;

#define CUDNN_CHECK(call)                                                                          \
  do {                                                                                             \
    cudnnStatus_t st_ = (call);                                                                    \
    if (st_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                                                  \
      ::shardlab::check_failed(                                                                    \
          #call, __FILE__, __LINE__,                                                               \
          ::fmt::format("cuDNN status {} ({})", static_cast<int>(st_), cudnnGetErrorString(st_))); \
  } while (0)

#define CUDNN_FE_CHECK(call)                                                                             \
  do {                                                                                                   \
    fe::error_t e_ = (call);                                                                             \
    if (e_.is_bad()) [[unlikely]]                                                                        \
      ::shardlab::check_failed(#call, __FILE__, __LINE__,                                                \
                               ::fmt::format("cudnn-frontend error {}: {}", static_cast<int>(e_.get_code()), \
                                             e_.get_message()));                                         \
  } while (0)

namespace {

// The graphs' tensors, by uid.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct GraphKey {
  int64_t B, T, H, KV, hd;
  float scale;
  bool backward;
  bool operator<(const GraphKey& o) const {
    return std::tie(B, T, H, KV, hd, scale, backward) < std::tie(o.B, o.T, o.H, o.KV, o.hd, o.scale, o.backward);
  }
};

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;  // bytes
};

struct State {
  cudnnHandle_t handle{};
  std::map<GraphKey, Built> graphs;
  bool warned_nondeterministic = false;
  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    graphs.clear();
    if (handle != nullptr) cudnnDestroy(handle);
  }
};

State& state_of(CudaBackend& cb) {
  std::shared_ptr<void>& slot = cb.cudnn_state();
  if (!slot) {
    auto st = std::make_shared<State>();
    CUDNN_CHECK(cudnnCreate(&st->handle));
    CUDNN_CHECK(cudnnSetStream(st->handle, cb.compute_stream()));
    slot = st;
  }
  return *static_cast<State*>(slot.get());
}

// A (B, heads, T, hd) view of rows `ld` elements apart, `batch` apart between sequences.
fe::graph::Tensor_attributes view(const char* name, Uid uid, int64_t B, int64_t heads, int64_t T, int64_t hd,
                                  int64_t ld, int64_t batch) {
  return fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({B, heads, T, hd}).set_stride(
      {batch, hd, ld, 1});
}
std::vector<int64_t> stats_dim(const FlashShape& s) { return {s.B, s.H, s.Tq, 1}; }
std::vector<int64_t> stats_stride(const FlashShape& s) { return {s.H * s.Tq, s.Tq, 1, 1}; }

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Graph> forward_graph(const FlashShape& s) {
  auto g = new_graph();
  auto q = g->tensor(view("Q", kQ, s.B, s.H, s.Tq, s.hd, s.q_ld, s.q_b));
  auto k = g->tensor(view("K", kK, s.B, s.KV, s.Tk, s.hd, s.k_ld, s.k_b));
  auto v = g->tensor(view("V", kV, s.B, s.KV, s.Tk, s.hd, s.v_ld, s.v_b));
  auto options = fe::graph::SDPA_attributes()
                     .set_name("shardlab attention forward")
                     .set_generate_stats(true)
                     .set_causal_mask(true)
                     .set_attn_scale(s.scale);
  auto [o, stats] = g->sdpa(q, k, v, options);
  o->set_output(true).set_uid(kO).set_dim({s.B, s.H, s.Tq, s.hd}).set_stride({s.o_b, s.hd, s.o_ld, 1});
  stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dim(s)).set_stride(
      stats_stride(s));
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const FlashShape& s, bool deterministic) {
  auto g = new_graph();
  auto q = g->tensor(view("Q", kQ, s.B, s.H, s.Tq, s.hd, s.q_ld, s.q_b));
  auto k = g->tensor(view("K", kK, s.B, s.KV, s.Tk, s.hd, s.k_ld, s.k_b));
  auto v = g->tensor(view("V", kV, s.B, s.KV, s.Tk, s.hd, s.v_ld, s.v_b));
  auto o = g->tensor(view("O", kO, s.B, s.H, s.Tq, s.hd, s.o_ld, s.o_b));
  auto dout = g->tensor(view("dO", kDO, s.B, s.H, s.Tq, s.hd, s.o_ld, s.o_b));
  auto stats = g->tensor(fe::graph::Tensor_attributes()
                             .set_name("Stats")
                             .set_uid(kStats)
                             .set_data_type(fe::DataType_t::FLOAT)
                             .set_dim(stats_dim(s))
                             .set_stride(stats_stride(s)));
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("shardlab attention backward")
                     .set_causal_mask(true)
                     .set_attn_scale(s.scale)
                     .set_deterministic_algorithm(deterministic);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, options);
  // dq, dk and dv land in a bf16 buffer laid out as qkv.
  dq->set_output(true).set_uid(kDQ).set_dim({s.B, s.H, s.Tq, s.hd}).set_stride({s.q_b, s.hd, s.q_ld, 1});
  dk->set_output(true).set_uid(kDK).set_dim({s.B, s.KV, s.Tk, s.hd}).set_stride({s.k_b, s.hd, s.k_ld, 1});
  dv->set_output(true).set_uid(kDV).set_dim({s.B, s.KV, s.Tk, s.hd}).set_stride({s.v_b, s.hd, s.v_ld, 1});
  return g;
}

// The graph built through build_plans, with its workspace; false with why where cuDNN offers no
// engine for it. cuDNN reports that at any stage (validate refuses shapes and versions, the
// heuristics find no engine, a pinned engine fails to finalise, sdpa() itself throws), so every
// failure here is "not offered"; a failure to run a built graph is an internal error (run()).
bool build(Built& b, const FlashShape& s, bool backward, bool deterministic, cudnnHandle_t handle, std::string& why) {
  try {
    b.graph = backward ? backward_graph(s, deterministic) : forward_graph(s);
    auto failed = [&why](fe::error_t e) {
      if (e.is_good()) return false;
      why = e.get_message();
      return true;
    };
    // In order; the first that fails says why.
    if (failed(b.graph->validate()) || failed(b.graph->build_operation_graph(handle)) ||
        failed(b.graph->create_execution_plans({fe::HeurMode_t::A})) || failed(b.graph->check_support(handle)) ||
        failed(b.graph->build_plans(handle)) || failed(b.graph->get_workspace_size(b.workspace)))
      return false;
  } catch (const std::exception& e) {
    why = e.what();
    return false;
  }
  return true;
}

const Built& graph_for(CudaBackend& cb, State& st, const FlashShape& s, bool backward) {
  const GraphKey key{s.B, s.Tq, s.H, s.KV, s.hd, s.scale, backward};
  auto it = st.graphs.find(key);
  if (it != st.graphs.end()) return it->second;
  const std::string shape = fmt::format("B {} T {} heads {} (K/V {}) of {}", s.B, s.Tq, s.H, s.KV, s.hd);
  Built b;
  std::string why;
  bool ok = build(b, s, backward, backward, st.handle, why);
  // The deterministic backward, where cuDNN offers it at an O(T) workspace: before cuDNN 9.25 it
  // keeps the whole (T, T) dP in its workspace (hundreds of MB for GPT-2, GB for long sequences),
  // which is what fused attention avoids. Else the fastest, whose dq sums in no fixed order.
  const int64_t linear = 4 * (4 * s.B * s.H * s.Tq * s.hd + s.B * s.H * s.Tq);
  if (backward && (!ok || b.workspace > linear)) {
    const std::string det = ok ? fmt::format("it would take a workspace of {} bytes", b.workspace) : why;
    Built fast;
    std::string why2;
    if (build(fast, s, true, false, st.handle, why2)) {
      b = std::move(fast);
      ok = true;
      if (!st.warned_nondeterministic)
        fmt::print(stderr, "shardlab: cuDNN's deterministic attention backward is left out for {} ({}): its "
                   "gradients may differ in the last bits from run to run\n", shape, det);
      st.warned_nondeterministic = true;
    } else if (!ok) {
      why = why2;
    }
  }
  if (!ok)
    throw InputError(fmt::format("--attention cudnn: cuDNN {} has no {} engine for {} on device {} ({}); use "
                                 "--attention flash", cudnnGetVersion(), backward ? "backward" : "forward", shape,
                                 cb.device_index(), why));
  SHARD_CHECK(b.workspace >= 0, "cuDNN attention: workspace of {} bytes for {}", b.workspace, shape);
  return st.graphs.emplace(key, std::move(b)).first->second;
}

using Pack = std::unordered_map<int64_t, void*>;

void run(CudaBackend& cb, State& st, const Built& b, Pack& pack) {
  void* workspace = b.workspace > 0 ? cb.cudnn_workspace(static_cast<size_t>(b.workspace)) : nullptr;
  CUDNN_FE_CHECK(b.graph->execute(st.handle, pack, workspace));
  CUDA_CHECK(cudaGetLastError());
}

void* at(const void* base, int64_t elems) {  // bf16 elements in
  return const_cast<char*>(static_cast<const char*>(base)) + 2 * elems;
}

// The q, k and v (or dq, dk and dv) heads of a bf16 [q | k | v] buffer, where s's strides read them.
void put_heads(Pack& pack, const void* base, Uid q, Uid k, Uid v, const FlashShape& s) {
  pack[q] = at(base, 0);
  pack[k] = at(base, s.H * s.hd);
  pack[v] = at(base, (s.H + s.KV) * s.hd);
}

}  // namespace

void cudnn_attention_forward(Backend& be, void* out, float* lse, const void* qkv, const FlashShape& s) {
  CudaBackend& cb = CudaBackend::of(be);
  State& st = state_of(cb);
  const Built& b = graph_for(cb, st, s, false);
  Pack pack{{kO, out}, {kStats, lse}};
  put_heads(pack, qkv, kQ, kK, kV, s);
  run(cb, st, b, pack);
}

void cudnn_attention_backward(Backend& be, void* dqkv, const void* dout, const void* qkv, const void* out,
                              const float* lse, const FlashShape& s) {
  CudaBackend& cb = CudaBackend::of(be);
  State& st = state_of(cb);
  const Built& b = graph_for(cb, st, s, true);
  Pack pack{{kO, at(out, 0)}, {kDO, at(dout, 0)}, {kStats, const_cast<float*>(lse)}};
  put_heads(pack, qkv, kQ, kK, kV, s);
  put_heads(pack, dqkv, kDQ, kDK, kDV, s);
  run(cb, st, b, pack);
}

#else  // no cuDNN in this build

namespace {
[[noreturn]] void not_built() {  // ops::cudnn_attention_* refuse first (cudnn_attention_refusal)
  SHARD_CHECK(false, "cuDNN attention called in a build without cuDNN");
  std::abort();
}
}  // namespace

void cudnn_attention_forward(Backend&, void*, float*, const void*, const FlashShape&) { not_built(); }
void cudnn_attention_backward(Backend&, void*, const void*, const void*, const void*, const float*,
                              const FlashShape&) {
  not_built();
}

#endif

}  // namespace shardlab::cuda
