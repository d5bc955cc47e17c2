#include "src/model/tp.hpp"

#include <algorithm>

#include "src/comm/communicator.hpp"
#include "src/core/check.hpp"

namespace shardlab {

int64_t tp_local_rows(const TpContext& tp, int64_t N) {
  if (!tp.sequence_parallel()) return N;
  if (N % tp.config.degree != 0)
    throw InputError(fmt::format("--sequence-parallel splits the micro-batch's {} token rows (batch x sequence) over "
                                 "--tp {}, which does not divide them",
                                 N, tp.config.degree));
  return N / tp.config.degree;
}

namespace {
Communicator& group(UnitContext& c) {
  SHARD_CHECK(c.tp.comm != nullptr && c.tp.comm->world_size() == c.tp.config.degree &&
                  c.tp.comm->rank() == c.tp.config.rank,
              "tensor-parallel rank {} of {} has no matching communicator", c.tp.config.rank, c.tp.config.degree);
  return *c.tp.comm;
}
}  // namespace

int64_t tp_unit_rows(const UnitContext& c, const TpConfig& built) {
  SHARD_CHECK(c.tp.config == built,
              "a unit built for tp rank {} of {} (sequence parallel: {}) runs as rank {} of {} ({})", built.rank,
              built.degree, built.sequence_parallel, c.tp.config.rank, c.tp.config.degree,
              c.tp.config.sequence_parallel);
  return tp_local_rows(c.tp, c.batch.B * c.batch.T);
}

Block tp_whole_rows(UnitContext& c, const std::string& what) {
  if (!c.tp.sequence_parallel()) return {};
  return c.pool.alloc(DType::f32, c.batch.B * c.batch.T * c.spec.dim, Category::workspace, what);
}

Tensor tp_whole_or(const Block& whole, const UnitContext& c, Tensor rows) {
  return whole ? whole.view(DType::f32, {c.batch.B * c.batch.T, c.spec.dim}) : rows;
}

namespace {

// --activation-dtype bf16: the regions' activations and their gradients cross the group in bf16, as
// Megatron's do (half the bytes; the sums of partial sums rounded as the collective rounds them).
// The tensors on either side stay f32: each collective is staged through bf16 copies
// (comm_buffer), rounded from the f32 source and widened into the f32 destination.
bool narrow_comm(const UnitContext& c) { return c.spec.activation_dtype != DType::f32; }

Tensor staged(UnitContext& c, const Tensor& like, Block& held, const char* what) {
  held = c.pool.alloc(c.spec.activation_dtype, like.numel(), Category::comm_buffer, what);
  return held.flat(c.spec.activation_dtype);
}

Tensor narrowed(UnitContext& c, const Tensor& x, Block& held, const char* what) {
  Tensor t = staged(c, x, held, what);
  c.be.cast(t, x);
  return t;
}

// in gathered from every rank's rows into out.
void gather_rows(UnitContext& c, Tensor in, Tensor out) {
  if (!narrow_comm(c)) return group(c).all_gather(in, out).wait();
  Block a, b;
  const Tensor from = narrowed(c, in, a, "tp gather rows (bf16)"), to = staged(c, out, b, "tp gathered rows (bf16)");
  group(c).all_gather(from, to).wait();
  a.reset();
  c.be.cast(out, to);
}

// partial (N, C) summed over the group into out: this rank's rows (SP, reduce-scatter) or all of
// them (all-reduce; out may be partial itself).
void sum_rows_over_group(UnitContext& c, Tensor partial, Tensor out) {
  const bool scatter = c.tp.sequence_parallel();
  if (!narrow_comm(c)) {
    if (scatter) return group(c).reduce_scatter(partial, out).wait();
    group(c).all_reduce(partial).wait();
    if (out.data() != partial.data()) c.be.copy(out, partial);
    return;
  }
  Block a, b;
  const Tensor sums = narrowed(c, partial, a, "tp partial sums (bf16)");
  if (!scatter) {
    group(c).all_reduce(sums).wait();
    return c.be.cast(out, sums);
  }
  const Tensor mine = staged(c, out, b, "tp summed rows (bf16)");
  group(c).reduce_scatter(sums, mine).wait();
  a.reset();
  c.be.cast(out, mine);
}

}  // namespace

Tensor tp_region_input(UnitContext& c, Tensor local, Tensor full) {
  if (!c.tp.sequence_parallel()) return local;
  SHARD_CHECK(full.numel() == local.numel() * c.tp.config.degree, "region input: local {} full {} at tp {}",
              local.shape_str(), full.shape_str(), c.tp.config.degree);
  gather_rows(c, local, full);
  return full;
}

void tp_region_input_backward(UnitContext& c, Tensor dfull, Tensor dlocal) {
  if (c.tp.active()) return sum_rows_over_group(c, dfull, dlocal);
  if (dlocal.data() != dfull.data()) c.be.copy(dlocal, dfull);
}

void tp_region_output(UnitContext& c, Tensor partial, Tensor local) {
  if (c.tp.active()) return sum_rows_over_group(c, partial, local);
  if (local.data() != partial.data()) c.be.copy(local, partial);
}

void tp_sum(UnitContext& c, Tensor t) {
  if (c.tp.active()) group(c).all_reduce(t).wait();
}

void tp_max(UnitContext& c, Tensor t) {
  if (c.tp.active()) group(c).all_reduce(t, ReduceOp::max).wait();
}

Tensor tp_region_output_backward(UnitContext& c, Tensor dlocal, Tensor dfull) {
  if (!c.tp.sequence_parallel()) return dlocal;
  gather_rows(c, dlocal, dfull);
  return dfull;
}

TpPartialGrads::TpPartialGrads(UnitContext& c, const ParamSet& g, std::vector<std::string> names,
                               const std::string& what, bool by_heads)
    : c_(c), g_(g), names_(std::move(names)) {
  if (!(by_heads ? c.tp.active() : c.tp.sequence_parallel())) return;
  int64_t n = 0;
  for (const std::string& name : names_) n += g(name).numel();
  block_ = c.pool.alloc(DType::f32, n, Category::workspace, what + " partial gradients");
  Tensor flat = block_.flat(DType::f32);
  c.be.fill(flat, 0.f);
  int64_t at = 0;
  for (const std::string& name : names_) {
    const Tensor t = g(name);
    std::vector<int64_t> dims;
    for (int i = 0; i < t.ndim(); ++i) dims.push_back(t.dim(i));
    scratch_.set(name, flat.slice(at, t.numel()).reshape(dims));
    at += t.numel();
  }
}

Tensor TpPartialGrads::operator()(const std::string& name) const { return block_ ? scratch_(name) : g_(name); }

void TpPartialGrads::reduce() {
  if (!block_) return;
  group(c_).all_reduce(block_.flat(DType::f32)).wait();
  for (const std::string& name : names_) c_.be.axpy(1.f, scratch_(name), g_(name));
  block_.reset();
}

double tp_micro_step_bus_bytes(const std::vector<UnitLayout>& layout, const ModelSpec& spec, const TpConfig& tp,
                               int64_t B, int64_t T, Checkpointing checkpointing) {
  if (tp.degree == 1) return 0;
  SHARD_CHECK(layout.size() >= 2, "a layout of {} units", layout.size());
  const double f = (tp.degree - 1.0) / tp.degree, N = static_cast<double>(B * T);
  const double A = N * static_cast<double>(spec.dim) * static_cast<double>(dtype_size(spec.activation_dtype));
  // The replicated tensors whose gradients come from the rank's own rows (norms): a row-parallel
  // layer's bias (replicated, its weight split) sums the gathered output gradient instead, and a
  // mixture of experts' router (replicated, computed whole on every rank) sums nothing.
  auto replicated = [&](const UnitLayout& u) {
    double n = 0;
    for (const TensorDecl& t : u.tensors) {
      if (t.tp.split() || t.tp.whole) continue;
      const std::string weight = t.name.ends_with(".bias") ? t.name.substr(0, t.name.size() - 5) + ".weight" : "";
      const auto w = std::find_if(u.tensors.begin(), u.tensors.end(), [&](const TensorDecl& x) { return x.name == weight; });
      if (w == u.tensors.end() || !w->tp.split()) n += static_cast<double>(t.numel);
    }
    return n * sizeof(float);
  };
  const double layers = static_cast<double>(layout.size() - 2);
  const double recompute = checkpointing == Checkpointing::blocks ? 1 : 0;
  double bytes = 2 * f * 3 * N * sizeof(float);  // the loss
  // A mixture of experts: backward sums the N k routing weights' gradients over the group (each
  // rank's experts give a partial one), all N rows whatever SP.
  const double moe_weights =
      spec.moe.enabled() ? 2 * f * N * static_cast<double>(spec.moe.top_k) * sizeof(float) : 0.0;
  // Two regions per layer, attention and the MLP (a mixture of experts' too: its experts split as
  // the dense MLP, their partial sums reduced the same way).
  if (!tp.sequence_parallel) {
    bytes += 2 * f * A;                                   // embedding
    bytes += layers * 2 * (1 + 1 + recompute) * 2 * f * A;  // layers (all-reduces)
    // Qwen3's q/k norm weights: gradients summed over the heads the group splits.
    if (spec.qk_norm) bytes += layers * 2 * f * 2 * static_cast<double>(spec.head_size()) * sizeof(float);
    bytes += layers * moe_weights;
    bytes += 2 * f * A;                                   // head, backward
    return bytes;
  }
  bytes += 2 * f * A;  // embedding
  // Per layer and region: forward an all-gather and a reduce-scatter, backward two all-gathers and a
  // reduce-scatter, each forward again under recomputation.
  const double per_layer = 4 + 6 + 4 * recompute;
  for (size_t u = 1; u + 1 < layout.size(); ++u)
    bytes += per_layer * f * A + 2 * f * replicated(layout[u]) + moe_weights;
  bytes += 3 * f * A + 2 * f * replicated(layout.back());  // head
  return bytes;
}

std::vector<std::vector<float>> gather_tp_units(Communicator& tp, const std::vector<UnitLayout>& local,
                                                const std::vector<UnitLayout>& whole,
                                                const std::vector<std::vector<float>>& parts) {
  SHARD_CHECK(local.size() == whole.size() && parts.size() == local.size(), "{} parts of {} units ({} whole)",
              parts.size(), local.size(), whole.size());
  const int T = tp.world_size();
  std::vector<std::vector<float>> out;
  for (size_t u = 0; u < local.size(); ++u) {
    const UnitLayout &mine = local[u], &full = whole[u];
    SHARD_CHECK(mine.tp_degree == T && mine.tp_rank == tp.rank() && full.tp_degree == 1 &&
                    mine.tensors.size() == full.tensors.size() && static_cast<int64_t>(parts[u].size()) == mine.numel,
                "unit {}: tensor-parallel rank {} of {} with a part of {} elements, gathered over rank {} of {}",
                mine.name, mine.tp_rank, mine.tp_degree, parts[u].size(), tp.rank(), T);
    // Every rank's part has the same layout (padded alike), so the parts gather as equal chunks.
    std::vector<float> all(tp.rank() == 0 ? parts[u].size() * static_cast<size_t>(T) : 0);
    tp.gather(Tensor::of(std::span<const float>(parts[u])), Tensor::of(std::span<float>(all)), 0).wait();
    if (tp.rank() != 0) continue;
    std::vector<float>& values = out.emplace_back(static_cast<size_t>(full.numel));
    for (int r = 0; r < T; ++r) {
      const float* part = all.data() + static_cast<size_t>(r) * parts[u].size();
      for (size_t i = 0; i < mine.tensors.size(); ++i) {
        const TensorDecl &t = mine.tensors[i], &w = full.tensors[i];
        for (const TpRun& run : tp_runs(t, T, r))
          if (run.full >= 0) std::copy_n(part + t.offset + run.local, run.len, values.data() + w.offset + run.full);
      }
    }
  }
  return out;
}

}  // namespace shardlab
