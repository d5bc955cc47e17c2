// moe.cpp — the MoE MLP (moe.hpp): routing on the host, the experts as one GEMM pair each over
// their sorted rows, and the balancing statistics.
#include "src/model/blocks/moe.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "src/backend/ops/activation.hpp"
#include "src/backend/ops/moe.hpp"
#include "src/model/blocks/linear.hpp"
#include "src/model/parallel/ep.hpp"
#include "src/model/tp.hpp"

namespace shardlab {

MoeBalance::MoeBalance(const ModelSpec& spec)
    : counts(static_cast<size_t>(spec.moe.experts), 0.0),
      prob_sums(static_cast<size_t>(spec.moe.experts), 0.0),
      aux_coef_(spec.moe.aux_loss ? spec.moe.aux_coef : 0.0),  // reported either way; in the objective if asked
      layers_(static_cast<double>(spec.layers - spec.moe.dense_layers)) {  // the sparse layers
  if (spec.moe.sigmoid)  // the loads the correction bias follows (and the log reports)
    layer_counts.assign(static_cast<size_t>((spec.layers - spec.moe.dense_layers) * spec.moe.experts), 0.0);
}

// f32, as the communicator reduces: counts past 2^24 (rows = tokens x layers x ranks) round to
// float's 24 bits, about 1e-7 of the auxiliary loss.
std::vector<float> MoeBalance::pack() const {
  std::vector<float> p(counts.begin(), counts.end());
  p.insert(p.end(), prob_sums.begin(), prob_sums.end());
  p.push_back(static_cast<float>(rows));
  p.push_back(static_cast<float>(dropped));
  p.insert(p.end(), layer_counts.begin(), layer_counts.end());
  return p;
}

void MoeBalance::unpack(std::span<const float> p) {
  const size_t E = counts.size();
  SHARD_CHECK(p.size() == 2 * E + 2 + layer_counts.size(), "MoE statistics: {} values for {} experts", p.size(), E);
  for (size_t e = 0; e < E; ++e) counts[e] = p[e], prob_sums[e] = p[E + e];
  rows = p[2 * E], dropped = p[2 * E + 1];
  for (size_t i = 0; i < layer_counts.size(); ++i) layer_counts[i] = p[2 * E + 2 + i];
}

void MoeBalance::finish(float dlogit_scale) {
  if (rows <= 0) return;  // no MoE layer ran (a pipeline stage without one)
  // Every layer routes every token: the micro-step's tokens (all ranks') are rows / layers.
  const double weight = static_cast<double>(dlogit_scale) * (rows / layers_);
  const double E = static_cast<double>(counts.size());
  double dot = 0;
  for (size_t e = 0; e < counts.size(); ++e) dot += counts[e] * prob_sums[e];
  aux = E * dot / (rows * rows);
  prob_grad = static_cast<float>(aux_coef_ * weight * E / (rows * rows));
}

void MoeBalance::add_stats(std::vector<double>& totals) const {
  totals.resize(static_cast<size_t>(stats_size()), 0.0);
  totals[0] += dropped;
  for (size_t e = 0; e < counts.size(); ++e) totals[e + 1] += counts[e];
  for (size_t i = 0; i < layer_counts.size(); ++i) totals[1 + counts.size() + i] += layer_counts[i];
}

int64_t correction_bias_layer(const TensorDecl& t) {
  constexpr std::string_view head = "model.layers.";
  const std::string_view n = t.name;
  int64_t layer = -1;
  if (n.starts_with(head) && n.ends_with(kCorrectionBias)) {
    const std::string_view digits = n.substr(head.size(), n.size() - head.size() - kCorrectionBias.size() - 1);
    const auto digit = [](char ch) { return ch >= '0' && ch <= '9'; };
    if (!digits.empty() && digits.size() < 8 && std::all_of(digits.begin(), digits.end(), digit))
      layer = std::stoll(std::string(digits));
  }
  SHARD_CHECK(layer >= 0, "{} is not a layer's correction bias", t.name);
  return layer;
}

MoeRouting::MoeRouting(std::span<const double> stats, int64_t experts) {
  if (stats.empty()) return;
  const size_t E = static_cast<size_t>(experts);
  SHARD_CHECK(stats.size() >= 1 + E && (stats.size() - 1 - E) % E == 0, "MoE statistics: {} values for {} experts",
              stats.size(), experts);
  dropped = stats[0];
  counts.assign(stats.begin() + 1, stats.begin() + 1 + static_cast<std::ptrdiff_t>(E));
  layer_counts.assign(stats.begin() + 1 + static_cast<std::ptrdiff_t>(E), stats.end());
}

namespace {
// max / mean of n loads (none when they sum to 0).
std::optional<double> max_over_mean(const double* c, size_t n) {
  double mx = 0, sum = 0;
  for (size_t e = 0; e < n; ++e) mx = std::max(mx, c[e]), sum += c[e];
  if (sum <= 0) return std::nullopt;
  return mx / (sum / static_cast<double>(n));
}
}  // namespace

std::optional<double> MoeRouting::imbalance() const { return max_over_mean(counts.data(), counts.size()); }

std::optional<double> MoeRouting::worst_layer_imbalance() const {
  std::optional<double> worst;
  const size_t E = counts.size();
  for (size_t l = 0; E > 0 && l < layer_counts.size() / E; ++l)
    if (const auto r = max_over_mean(layer_counts.data() + l * E, E)) worst = std::max(worst.value_or(0.0), *r);
  return worst;
}

std::vector<float> MoeRouting::bias_steps(double rate) const {
  const size_t E = counts.size();
  std::vector<float> steps(layer_counts.size(), 0.f);
  const float up = static_cast<float>(rate);
  for (size_t l = 0; E > 0 && l < layer_counts.size() / E; ++l) {
    const double* c = layer_counts.data() + l * E;
    double sum = 0;
    for (size_t e = 0; e < E; ++e) sum += c[e];
    if (sum <= 0) continue;
    // load < mean <=> E load < sum: whole numbers compared exactly, no division's rounding.
    for (size_t e = 0; e < E; ++e) {
      const double scaled = c[e] * static_cast<double>(E);
      steps[l * E + e] = scaled < sum ? up : scaled > sum ? -up : 0.f;
    }
  }
  return steps;
}

namespace blocks {
namespace {

// The micro-step's balancing statistics, in training (null in evaluation and decoding).
MoeBalance* balance(const UnitContext& c) {
  if (!c.aux) return nullptr;
  auto* b = dynamic_cast<MoeBalance*>(c.aux);
  SHARD_CHECK(b != nullptr, "a MoE layer's auxiliary channel is not the MoE balance");
  return b;
}

// The routing of one layer's N tokens, on the host.
struct Routing {
  int64_t N = 0, k = 0, E = 0, kept = 0;
  std::vector<int32_t> choice;      // (N k): the expert of slot n k + j, j-th most probable first
  std::vector<float> weight;        // (N k): its weight in the combination
  std::vector<int32_t> pos;         // (N k): its row among the experts' sorted rows, -1 when dropped
  std::vector<int32_t> token_of;    // (N k): row r's token (the first `kept` rows are used)
  std::vector<int32_t> per_expert;  // (E): rows of each expert, in expert order
  // The int32 block: [pos | token_of | choice | per_expert].
  int64_t ints() const { return 3 * N * k + E; }
};

// Softmax of each row of logits (N, E), in place, in f32 as torch computes it.
void softmax_rows(std::vector<float>& x, int64_t N, int64_t E) {
  for (int64_t n = 0; n < N; ++n) {
    float* r = x.data() + n * E;
    const float mx = *std::max_element(r, r + E);
    float sum = 0.f;
    for (int64_t e = 0; e < E; ++e) sum += (r[e] = std::exp(r[e] - mx));
    for (int64_t e = 0; e < E; ++e) r[e] /= sum;
  }
}

// The slots an expert takes of N tokens' under --moe-capacity-factor, in training only (c.aux set):
// evaluation and decoding route dropless, so their results do not depend on the batch; 0: dropless.
int64_t capacity_of(const UnitContext& c, int64_t N) {
  const MoeSpec& m = c.spec.moe;
  return c.spec.moe_capacity_factor > 0 && c.aux ? moe_capacity(c.spec.moe_capacity_factor, N, m.top_k, m.experts) : 0;
}

// The k largest of s (E) into out, largest first (ties: the lower index); with groups > 1 only
// among the topk_groups groups whose two largest sum highest (ties: the lower group), as
// transformers' DeepSeek-V3 router chooses.
// Its buffers, reused token after token: experts' order, the masked scores, groups' scores and order.
struct TopKScratch {
  std::vector<int32_t> order, group_order;
  std::vector<float> masked, group;
  explicit TopKScratch(const MoeSpec& m)
      : order(static_cast<size_t>(m.experts)), group_order(static_cast<size_t>(m.groups)),
        group(static_cast<size_t>(m.groups)) {}
};
void top_k(const MoeSpec& m, const float* s, int32_t* out, TopKScratch& w) {
  const int64_t E = m.experts, k = m.top_k;
  const auto larger = [](const float* v) {
    return [v](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  };
  const float* from = s;
  std::vector<int32_t>& order = w.order;
  if (m.groups > 1) {
    const int64_t size = E / m.groups;
    std::vector<float>& group = w.group;
    std::vector<float>& masked = w.masked;
    for (int64_t g = 0; g < m.groups; ++g) {
      float best = -INFINITY, second = -INFINITY;
      for (int64_t e = g * size; e < (g + 1) * size; ++e) {
        if (s[e] > best) second = best, best = s[e];
        else if (s[e] > second) second = s[e];
      }
      group[g] = best + second;
    }
    std::vector<int32_t>& gorder = w.group_order;
    std::iota(gorder.begin(), gorder.end(), 0);
    std::partial_sort(gorder.begin(), gorder.begin() + m.topk_groups, gorder.end(), larger(group.data()));
    masked.assign(static_cast<size_t>(E), -INFINITY);
    for (int64_t j = 0; j < m.topk_groups; ++j)
      std::copy_n(s + gorder[j] * size, size, masked.begin() + gorder[j] * size);
    from = masked.data();
  }
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), larger(from));
  std::copy_n(order.begin(), k, out);
}

// Expert e's share of P slots under the meta backend's round robin (slot s to expert s mod E:
// balanced, as plan and profile assume).
int64_t round_robin_choices(int64_t P, int64_t E, int64_t e) { return P / E + (e < P % E); }

// probs: the router's softmax probabilities, or the sigmoid router's scores; bias its correction
// bias (E) or empty. On the meta backend (no values; probs empty) the round robin, of which only
// the counts are written (per_expert, kept): the rest would be copied to a device that keeps nothing.
Routing route(const UnitContext& c, const std::vector<float>& probs, const std::vector<float>& bias, int64_t N) {
  const MoeSpec& m = c.spec.moe;
  Routing r;
  r.N = N, r.k = m.top_k, r.E = m.experts;
  const int64_t k = r.k, E = r.E;
  const int64_t capped = capacity_of(c, N), cap = capped > 0 ? capped : N * k;  // dropless: every slot fits
  if (c.be.device() == Device::meta) {
    r.per_expert.resize(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      r.kept += (r.per_expert[e] = static_cast<int32_t>(std::min(round_robin_choices(N * k, E, e), cap)));
    return r;
  }
  r.choice.resize(static_cast<size_t>(N * k));
  r.weight.resize(static_cast<size_t>(N * k));
  TopKScratch scratch(m);
  std::vector<float> biased(bias.empty() ? 0 : static_cast<size_t>(E));
  const float scale = static_cast<float>(m.routed_scale), eps = m.sigmoid ? 1e-20f : 0.f;
  for (int64_t n = 0; n < N; ++n) {
    const float* p = probs.data() + n * E;
    for (size_t e = 0; e < biased.size(); ++e) biased[e] = p[e] + bias[e];
    top_k(m, biased.empty() ? p : biased.data(), r.choice.data() + n * k, scratch);
    float sum = 0.f;
    for (int64_t j = 0; j < k; ++j) sum += p[r.choice[n * k + j]];
    for (int64_t j = 0; j < k; ++j) {
      const float v = p[r.choice[n * k + j]];
      r.weight[n * k + j] = (m.norm_topk ? v / (sum + eps) : v) * scale;
    }
  }
  // Sorted by expert, tokens in order within one; past capacity dropped, in training only (c.aux
  // set): evaluation and decoding route dropless, so their results do not depend on the batch.
  r.per_expert.assign(static_cast<size_t>(E), 0);
  r.pos.assign(static_cast<size_t>(N * k), -1);
  r.token_of.assign(static_cast<size_t>(N * k), 0);
  std::vector<int32_t> taken(static_cast<size_t>(E), 0);
  for (int64_t s = 0; s < N * k; ++s)
    if (taken[r.choice[s]] < cap) ++taken[r.choice[s]];
  std::vector<int64_t> next(static_cast<size_t>(E), 0);
  for (int64_t e = 0, row = 0; e < E; ++e) next[e] = row, row += taken[e];
  std::fill(taken.begin(), taken.end(), 0);
  for (int64_t s = 0; s < N * k; ++s) {
    const int32_t e = r.choice[s];
    if (taken[e] >= cap) continue;
    ++taken[e];
    r.pos[s] = static_cast<int32_t>(next[e]);
    r.token_of[next[e]++] = static_cast<int32_t>(s / k);
    ++r.kept;
  }
  r.per_expert = taken;
  return r;
}

const int32_t* as_ints(Tensor t) { return static_cast<const int32_t*>(t.data()); }

// t's values on the host (the router's probabilities, their gradients). On the meta backend, which
// has none, the copy is only charged (a prediction's cost ledger counts the transfer and its
// synchronisation) and the vector is empty: a prediction routes without values (route()).
std::vector<float> to_host(Backend& be, Tensor t) {
  if (be.device() == Device::meta) {
    be.copy(Tensor::flat(nullptr, DType::f32, t.numel()), t);
    return {};
  }
  std::vector<float> h(static_cast<size_t>(t.numel()), 0.f);
  be.copy(Tensor::flat(h.data(), DType::f32, t.numel()), t);
  return h;
}

// dst <- h (to_host's counterpart: on meta only charged).
void from_host(Backend& be, Tensor dst, const std::vector<float>& h) {
  be.copy(dst, Tensor::flat(const_cast<float*>(h.data()), DType::f32, dst.numel()));
}

// router_backward's d(logits) (N, E) from the probabilities (N, E), d(weights) (N k) and the choice.
void router_dlogits(UnitContext& c, Tensor dl, Tensor probs_t, Tensor dw, const int32_t* choice, int64_t k) {
  const MoeSpec& m = c.spec.moe;
  const int64_t N = probs_t.dim(0), E = m.experts;
  const std::vector<float> probs = to_host(c.be, probs_t), dweight = to_host(c.be, dw);
  const bool meta = c.be.device() == Device::meta;  // no values: nothing to compute
  std::vector<float> dlogits(meta ? 0 : static_cast<size_t>(N * E), 0.f), dprob(static_cast<size_t>(E));
  const float scale = static_cast<float>(m.routed_scale), eps = m.sigmoid ? 1e-20f : 0.f;
  for (int64_t n = 0; n < N && !meta; ++n) {
    const float* p = probs.data() + n * E;
    const MoeBalance* b = balance(c);
    for (int64_t e = 0; e < E; ++e) dprob[e] = b ? b->prob_grad * static_cast<float>(b->counts[e]) : 0.f;
    float sum = 0.f, inner = 0.f;  // sum of the chosen probabilities; sum_j dweight_j weight_j
    for (int64_t j = 0; j < k; ++j) sum += p[choice[n * k + j]];
    sum += eps;
    for (int64_t j = 0; j < k; ++j) inner += dweight[n * k + j] * (p[choice[n * k + j]] / sum);  // route()'s weight
    for (int64_t j = 0; j < k; ++j) {
      const float dwj = dweight[n * k + j];
      dprob[choice[n * k + j]] += (m.norm_topk ? (dwj - inner) / sum : dwj) * scale;
    }
    if (m.sigmoid) {  // each score its own logit's: d(logit) = d(score) s (1 - s)
      for (int64_t e = 0; e < E; ++e) dlogits[n * E + e] = dprob[e] * p[e] * (1.f - p[e]);
      continue;
    }
    float dot = 0.f;
    for (int64_t e = 0; e < E; ++e) dot += p[e] * dprob[e];
    for (int64_t e = 0; e < E; ++e) dlogits[n * E + e] = p[e] * (dprob[e] - dot);
  }
  from_host(c.be, dl, dlogits);
}

// The router: d(weights) through the scale, the top-k normalisation and the softmax (or the
// sigmoid), plus the auxiliary loss's d/d(prob[n, e]) = prob_grad x counts_e, on the host (N x E:
// router_dlogits); then its two products: dx = d(logits) Wr, overwritten.
void router_backward(UnitContext& c, Saved& s, Tensor dx, Tensor x, const MoeWeights& w, const MoeWeights& g, Tensor dw,
                     const std::vector<int32_t>& ints, int64_t k) {
  const int64_t N = x.dim(0), E = c.spec.moe.experts, P = N * k;
  Block dl_block = c.pool.alloc(DType::f32, N * E, Category::workspace, "moe backward dlogits");
  Tensor dl = dl_block.view(DType::f32, {N, E});
  router_dlogits(c, dl, s("moe_probs"), dw, ints.empty() ? nullptr : ints.data() + 2 * P, k);  // none on meta
  linear_backward(c, dx, g.router, dl, x, w.router, N);  // dx = d(logits) Wr: overwritten
  if (c.tp.active() && c.tp.config.rank != 0) c.be.fill(dx, 0.f);  // the group's rank 0 adds it (moe.hpp)
}

}  // namespace

int64_t moe_capacity(double factor, int64_t tokens, int64_t k, int64_t experts) {
  return static_cast<int64_t>(std::ceil(factor * static_cast<double>(tokens * k) / static_cast<double>(experts)));
}

void moe_forward(UnitContext& c, Saved& s, Tensor x, Tensor out, const MoeWeights& w) {
  const MoeSpec& m = c.spec.moe;
  const int64_t N = x.dim(0), C = x.dim(1), E = m.experts, k = m.top_k, F = moe_local_width(c), P = N * k;
  SHARD_CHECK(P < (int64_t{1} << 31), "MoE: {} slots overflow the int32 routing", P);
  Tensor probs = s.add_f32(c.pool, "moe_probs", {N, E});
  linear_forward(c.be, probs, x, w.router, N);  // the logits, then their softmax (or sigmoid)
  const bool meta = c.be.device() == Device::meta;  // no values: the routing a round robin, nothing to score
  std::vector<float> hp = to_host(c.be, probs);
  if (m.sigmoid) {
    for (float& v : hp) v = 1.f / (1.f + std::exp(-v));
  } else if (!meta) {
    softmax_rows(hp, N, E);
  }
  const Routing r = route(c, hp, w.bias.ndim() > 0 ? to_host(c.be, w.bias) : std::vector<float>(), N);
  from_host(c.be, probs, hp);
  if (MoeBalance* bp = balance(c); bp && !c.recomputing) {
    MoeBalance& b = *bp;
    std::vector<double> chose(static_cast<size_t>(E), 0.0);  // each expert's top-k choices
    for (int32_t e : r.choice) chose[e] += 1;
    for (int64_t e = 0; e < E && meta; ++e) chose[e] = static_cast<double>(round_robin_choices(P, E, e));
    for (int64_t e = 0; e < E; ++e) b.counts[e] += chose[e];
    if (!b.layer_counts.empty() && w.sparse_layer >= 0)
      for (int64_t e = 0; e < E; ++e) b.layer_counts[static_cast<size_t>(w.sparse_layer * E + e)] += chose[e];
    for (int64_t n = 0; n < N && !meta; ++n) {
      // A sigmoid router's scores as shares of their sum (DeepSeek-V3's balance statistic): the
      // same k when the routing is uniform.
      float share = 1.f;
      if (m.sigmoid) share = 1.f / std::accumulate(hp.begin() + n * E, hp.begin() + (n + 1) * E, 0.f);
      for (int64_t e = 0; e < E; ++e) b.prob_sums[e] += hp[n * E + e] * share;
    }
    b.rows += static_cast<double>(N);
    b.dropped += static_cast<double>(P - r.kept);
  }
  // The routing in the backend's memory: int32 in an f32-sized block.
  Tensor route_t = s.add_f32(c.pool, "moe_route", {r.ints()});
  std::vector<int32_t> packed;  // (on meta none: only the copy's cost counts)
  for (const auto* v : {&r.pos, &r.token_of, &r.choice, &r.per_expert})
    if (!meta) packed.insert(packed.end(), v->begin(), v->end());
  c.be.copy(route_t, Tensor::flat(meta ? nullptr : packed.data(), DType::f32, r.ints()));
  Tensor weights = s.add_f32(c.pool, "moe_w", {P});
  c.be.copy(weights, Tensor::flat(meta ? nullptr : const_cast<float*>(r.weight.data()), DType::f32, P));
  if (c.expert_parallel()) {  // the experts are on the ep group's ranks (parallel/ep.hpp)
    Tensor y = s.add(c.pool, "moe_y", {P, C});
    Block xs_block = c.pool.alloc(DType::f32, P * C, Category::workspace, "moe tokens by expert");
    Tensor xs = xs_block.view(DType::f32, {P, C});
    ops::moe_gather(c.be, row_range(xs, 0, r.kept), x, as_ints(route_t) + P);
    ep_experts_forward(c, s, row_range(xs, 0, r.kept), row_range(y, 0, r.kept), r.per_expert, w, capacity_of(c, N));
    ops::moe_combine(c.be, out, row_range(y, 0, r.kept), as_ints(route_t), weights, k, false);
    return;
  }

  Tensor gate_up = s.add(c.pool, "moe_gate_up", {P, 2 * F}), act = s.add(c.pool, "moe_act", {P, F});
  Tensor y = s.add(c.pool, "moe_y", {P, C});
  Block xs_block = c.pool.alloc(DType::f32, P * C, Category::workspace, "moe tokens by expert");
  Tensor xs = xs_block.view(DType::f32, {P, C});
  ops::moe_gather(c.be, row_range(xs, 0, r.kept), x, as_ints(route_t) + P);
  const auto routed = [&](int64_t e) { return int64_t{r.per_expert[e]}; };
  for_each_expert(E, routed, [&](int64_t e, int64_t r0, int64_t n) {
    linear_forward(c.be, row_range(gate_up, r0, n), row_range(xs, r0, n), w.gate_up[e], n);
  });
  if (r.kept > 0) ops::swiglu_forward(c.be, row_range(act, 0, r.kept), row_range(gate_up, 0, r.kept));
  for_each_expert(E, routed, [&](int64_t e, int64_t r0, int64_t n) {
    linear_forward(c.be, row_range(y, r0, n), row_range(act, r0, n), w.down[e], n);
  });
  ops::moe_combine(c.be, out, row_range(y, 0, r.kept), as_ints(route_t), weights, k, false);
}

void moe_backward(UnitContext& c, Saved& s, Tensor dx, Tensor dout, Tensor x, const MoeWeights& w,
                  const MoeWeights& g) {
  const MoeSpec& m = c.spec.moe;
  const int64_t N = x.dim(0), C = x.dim(1), E = m.experts, k = m.top_k, F = moe_local_width(c), P = N * k;
  const int64_t shape[] = {N, C};
  dx = dx.reshape(shape), dout = dout.reshape(shape);
  Tensor route_t = s("moe_route");
  const bool meta = c.be.device() == Device::meta;
  std::vector<int32_t> ints(meta ? 0 : static_cast<size_t>(3 * P + E), 0);  // on meta only the copy's cost
  c.be.copy(Tensor::flat(meta ? nullptr : ints.data(), DType::f32, 3 * P + E), route_t);
  // On meta no values came back: the rows of forward's round robin (route), each expert's at most
  // its capacity under --moe-capacity-factor.
  const int64_t capped = capacity_of(c, N), cap = capped > 0 ? capped : P;
  const auto expert_rows = [&](int64_t e) {
    return meta ? std::min(round_robin_choices(P, E, e), cap) : int64_t{ints[static_cast<size_t>(3 * P + e)]};
  };
  int64_t kept = 0;
  for (int64_t e = 0; e < E; ++e) kept += expert_rows(e);

  // The combination's backward: d(y) of every kept row, d(weight) of every slot.
  Block dy_block = c.pool.alloc(DType::f32, P * C, Category::workspace, "moe backward dy");
  Block dw_block = c.pool.alloc(DType::f32, P, Category::workspace, "moe backward dweights");
  Tensor dy = dy_block.view(DType::f32, {P, C}), dw = dw_block.flat(DType::f32);
  ops::moe_combine_backward(c.be, row_range(dy, 0, kept), dw, dout, row_range(s("moe_y"), 0, kept), as_ints(route_t),
                            s("moe_w"), k);
  tp_sum(c, dw);  // under --tp y, and so d(weights), are this rank's experts' slices' part
  if (c.expert_parallel()) {
    std::vector<int32_t> counts(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) counts[e] = static_cast<int32_t>(expert_rows(e));
    Block dxs_block = c.pool.alloc(DType::f32, P * C, Category::workspace, "moe backward dtokens by expert");
    Tensor dxs = dxs_block.view(DType::f32, {P, C});
    ep_experts_backward(c, s, row_range(dy, 0, kept), row_range(dxs, 0, kept), counts, w, g, capacity_of(c, N));
    dy_block.reset();
    router_backward(c, s, dx, x, w, g, dw, ints, k);
    ops::moe_combine(c.be, dx, row_range(dxs, 0, kept), as_ints(route_t), Tensor(), k, true);
    return;
  }
  // Down, then SwiGLU, then gate/up, expert by expert.
  Block dact_block = c.pool.alloc(DType::f32, P * F, Category::workspace, "moe backward dact");
  Tensor dact = dact_block.view(DType::f32, {P, F}), act = s("moe_act"), gate_up = s("moe_gate_up");
  for_each_expert(E, expert_rows, [&](int64_t e, int64_t r0, int64_t n) {
    linear_backward(c, row_range(dact, r0, n), g.down[e], row_range(dy, r0, n), row_range(act, r0, n), w.down[e], n);
  });
  dy_block.reset();
  Block dgu_block = c.pool.alloc(DType::f32, P * 2 * F, Category::workspace, "moe backward dgate_up");
  Tensor dgate_up = dgu_block.view(DType::f32, {P, 2 * F});
  if (kept > 0)
    ops::swiglu_backward(c.be, row_range(dgate_up, 0, kept), row_range(gate_up, 0, kept), row_range(dact, 0, kept));
  dact_block.reset();
  Block xs_block = c.pool.alloc(DType::f32, P * C, Category::workspace, "moe backward tokens by expert");
  Block dxs_block = c.pool.alloc(DType::f32, P * C, Category::workspace, "moe backward dtokens by expert");
  Tensor xs = xs_block.view(DType::f32, {P, C}), dxs = dxs_block.view(DType::f32, {P, C});
  ops::moe_gather(c.be, row_range(xs, 0, kept), x, as_ints(route_t) + P);
  for_each_expert(E, expert_rows, [&](int64_t e, int64_t r0, int64_t n) {
    linear_backward(c, row_range(dxs, r0, n), g.gate_up[e], row_range(dgate_up, r0, n), row_range(xs, r0, n),
                    w.gate_up[e], n);
  });

  router_backward(c, s, dx, x, w, g, dw, ints, k);
  ops::moe_combine(c.be, dx, row_range(dxs, 0, kept), as_ints(route_t), Tensor(), k, true);
}

}  // namespace blocks
}  // namespace shardlab
