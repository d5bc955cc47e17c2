// The CPU backend's vocabulary-parallel operations (--tp): a (N, V) logits matrix and a (V, C)
// token embedding split into T padded vocabulary shards, each shard's operation run alone and the
// tensor-parallel group's reductions done here by hand, against the whole-vocabulary operations
// (cross_entropy, embedding_forward/backward) and double-precision loops. Padding holds values
// that would change a result if it were ever read. And the meta backend's shape checks of them.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "src/backend/backend.hpp"
#include "src/model/spec.hpp"
#include "tests/test_util.hpp"
#include "src/backend/ops/embedding.hpp"
#include "src/backend/ops/loss.hpp"

using namespace shardlab;
using shardlab::test::random_vector;

namespace {

using Ids = std::vector<int32_t>;

Tensor t1(std::vector<float>& v) { return Tensor::flat(v.data(), DType::f32, static_cast<int64_t>(v.size())); }
Tensor t2(std::vector<float>& v, int64_t rows, int64_t cols) { return Tensor(v.data(), DType::f32, {rows, cols}); }
std::unique_ptr<Backend> cpu() { return make_cpu_backend(BackendConfig{2}); }

// Larger than any real logit: a padding column counted in a max or a sum changes the loss.
constexpr float kPaddingLogit = 30.f;

// Columns [v.begin, v.begin + v.valid) of the (N, V) matrix, then padding up to v.rows columns.
std::vector<float> column_shard(const std::vector<float>& whole, int64_t N, int64_t V, const VocabShard& v) {
  std::vector<float> part(static_cast<size_t>(N * v.rows), kPaddingLogit);
  for (int64_t i = 0; i < N; ++i)
    std::copy_n(whole.begin() + i * V + v.begin, v.valid, part.begin() + i * v.rows);
  return part;
}

// Every element within abs + rel * |ref|; reports the count, the max error and the first mismatches.
template <class Ref>
void expect_close(const std::vector<float>& got, const std::vector<Ref>& ref, double rel, double abs,
                  const std::string& what) {
  REQUIRE(got.size() == ref.size());
  size_t bad = 0;
  double max_err = 0;
  std::ostringstream first;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(ref[i]));
    max_err = std::max(max_err, err);
    if (!(err <= abs + rel * std::fabs(double(ref[i])))) {
      if (bad < 5) first << " [" << i << "] got " << got[i] << " ref " << ref[i] << ";";
      ++bad;
    }
  }
  INFO(what << ": " << bad << " of " << ref.size() << " outside tolerance, max abs error " << max_err << first.str());
  CHECK(bad == 0);
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct VocabLoss {
  std::vector<float> losses;   // (N), rank 0's (every rank's must be the same bits)
  std::vector<float> dlogits;  // (N, V), each rank's valid columns put back in place
};

// Megatron's vocabulary-parallel loss over T ranks, the group's all-reduces done here in rank
// order: max of the maxima, then float sums of sumexp and of the target logits. dlogits of every
// shard is checked to be exactly 0 in the padding. in_place: dlogits written over the logits.
VocabLoss vocab_parallel_loss(Backend& be, const std::vector<float>& logits, const Ids& targets, int64_t N, int64_t V,
                              int T, float scale, bool in_place) {
  std::vector<VocabShard> shards;
  std::vector<std::vector<float>> parts;
  for (int r = 0; r < T; ++r) {
    shards.push_back(vocab_shard(V, T, r));
    parts.push_back(column_shard(logits, N, V, shards.back()));
  }
  const int64_t Vl = shards[0].rows;
  std::vector<float> mx(N, -std::numeric_limits<float>::infinity()), sumexp(N, 0.f), tlogit(N, 0.f);
  for (int r = 0; r < T; ++r) {
    std::vector<float> m(N);
    ops::vocab_ce_max(be, t1(m), t2(parts[r], N, Vl), shards[r].valid);
    for (int64_t i = 0; i < N; ++i) mx[i] = std::max(mx[i], m[i]);
  }
  for (int r = 0; r < T; ++r) {
    std::vector<float> s(N), z(N);
    ops::vocab_ce_sums(be, t1(s), t1(z), t2(parts[r], N, Vl), targets.data(), shards[r].begin, shards[r].valid, t1(mx));
    for (int64_t i = 0; i < N; ++i) sumexp[i] += s[i], tlogit[i] += z[i];
  }
  VocabLoss out{std::vector<float>(N), std::vector<float>(N * V)};
  for (int r = 0; r < T; ++r) {
    std::vector<float> losses(N), separate(N * Vl, -5.f);
    std::vector<float>& d = in_place ? parts[r] : separate;
    ops::vocab_ce_finish(be, t1(losses), t2(d, N, Vl), t2(parts[r], N, Vl), targets.data(), shards[r].begin,
                         shards[r].valid, t1(mx), t1(sumexp), t1(tlogit), scale);
    INFO("rank " << r << " of " << T << ": valid columns " << shards[r].valid << " of " << Vl);
    if (r == 0) out.losses = losses;
    CHECK(bit_equal(losses, out.losses));  // the same reduced inputs on every rank
    int64_t nonzero_padding = 0;
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t j = shards[r].valid; j < Vl; ++j) nonzero_padding += d[i * Vl + j] != 0.f;
      std::copy_n(d.begin() + i * Vl, shards[r].valid, out.dlogits.begin() + i * V + shards[r].begin);
    }
    CHECK(nonzero_padding == 0);
  }
  return out;
}

// Targets at the shards' edges (first and last column of each shard, and the vocabulary's ends),
// then random ones.
Ids edge_targets(int64_t N, int64_t V, int T) {
  Ids t;
  for (int r = 0; r < T; ++r) {
    const VocabShard v = vocab_shard(V, T, r);
    if (v.valid == 0) continue;
    t.push_back(static_cast<int32_t>(v.begin));
    t.push_back(static_cast<int32_t>(v.begin + v.valid - 1));
  }
  auto u = random_vector("vp targets", static_cast<size_t>(N), 0.f, static_cast<float>(V));
  for (size_t i = t.size(); i < u.size(); ++i) t.push_back(std::min(static_cast<int32_t>(V - 1), int32_t(u[i])));
  t.resize(static_cast<size_t>(N));
  return t;
}

}  // namespace

TEST_CASE("vocabulary-parallel cross-entropy over padded shards equals cross_entropy on the whole logits",
          "[kernels][tp]") {
  auto be = cpu();
  struct Case { int64_t N, V; int T; };
  // 50 over 3 (17 columns, 1 of padding), 9 over 4 (the last shard is all padding), 1003 over 2,
  // GPT-2's 50257 over 4 (12565 columns, 3 of padding), and a single shard.
  for (Case c : {Case{13, 50, 3}, Case{9, 9, 4}, Case{8, 1003, 2}, Case{8, 50257, 4}, Case{5, 50, 1}}) {
    const int64_t N = c.N, V = c.V;
    INFO("N=" << N << " V=" << V << " T=" << c.T);
    auto logits = random_vector("vp logits " + std::to_string(V), static_cast<size_t>(N * V), -6.f, 6.f);
    const Ids targets = edge_targets(N, V, c.T);
    const float scale = 1.f / static_cast<float>(N);
    std::vector<float> ref_losses(N), ref_dlogits(N * V);
    ops::cross_entropy(*be, t1(ref_losses), t2(ref_dlogits, N, V), t2(logits, N, V), targets.data(), scale);
    // The double-precision loss and gradient.
    std::vector<double> dbl_losses(N), dbl_dlogits(N * V);
    for (int64_t i = 0; i < N; ++i) {
      const float* z = logits.data() + i * V;
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(z[j]));
      for (int64_t j = 0; j < V; ++j) sum += std::exp(z[j] - mx);
      dbl_losses[i] = std::log(sum) + mx - z[targets[i]];
      for (int64_t j = 0; j < V; ++j) dbl_dlogits[i * V + j] = (std::exp(z[j] - mx) / sum - (j == targets[i])) * scale;
    }
    for (bool in_place : {false, true}) {
      INFO((in_place ? "dlogits over the logits" : "dlogits apart"));
      const VocabLoss got = vocab_parallel_loss(*be, logits, targets, N, V, c.T, scale, in_place);
      // cross_entropy's sum is one double; here T float partial sums are added in float.
      expect_close(got.losses, ref_losses, 1e-6, 0, "losses against cross_entropy");
      expect_close(got.dlogits, ref_dlogits, 1e-6, 1e-9, "dlogits against cross_entropy");
      // Both compute log(sum) + mx - z[y] in float: half an ulp of logits up to 6 is 2.4e-7 absolute.
      expect_close(got.losses, dbl_losses, 1e-6, 1e-6, "losses against double");
      expect_close(got.dlogits, dbl_dlogits, 1e-6, 1e-9, "dlogits against double");
    }
  }
}

TEST_CASE("vocabulary-parallel cross-entropy without gradients leaves the logits alone", "[kernels][tp]") {
  auto be = cpu();
  const int64_t N = 4, Vl = 6, valid = 5, v0 = 6;  // rank 1 of 11 columns over 2 ranks
  auto logits = random_vector("vp nograd", N * Vl, -3.f, 3.f);
  for (int64_t i = 0; i < N; ++i) logits[i * Vl + valid] = kPaddingLogit;
  const std::vector<float> before = logits;
  const Ids targets = {0, 6, 10, 7};
  std::vector<float> mx(N), sumexp(N), tlogit(N), losses(N);
  ops::vocab_ce_max(*be, t1(mx), t2(logits, N, Vl), valid);
  ops::vocab_ce_sums(*be, t1(sumexp), t1(tlogit), t2(logits, N, Vl), targets.data(), v0, valid, t1(mx));
  ops::vocab_ce_finish(*be, t1(losses), Tensor(), t2(logits, N, Vl), targets.data(), v0, valid, t1(mx), t1(sumexp),
                       t1(tlogit), 1.f);
  CHECK(bit_equal(logits, before));
  for (int64_t i = 0; i < N; ++i) {
    const float* z = logits.data() + i * Vl;
    double m = -1e300, s = 0;
    for (int64_t j = 0; j < valid; ++j) m = std::max(m, double(z[j]));
    for (int64_t j = 0; j < valid; ++j) s += std::exp(z[j] - m);
    const int64_t y = targets[i] - v0;
    INFO("row " << i << " target " << targets[i]);
    CHECK(mx[i] == static_cast<float>(m));  // a max is exact
    CHECK(sumexp[i] == Approx(s).epsilon(1e-6));
    CHECK(tlogit[i] == (y >= 0 && y < valid ? z[y] : 0.f));  // target 0 is rank 0's: 0 here
    CHECK(losses[i] == Approx(std::log(s) + m - tlogit[i]).epsilon(1e-6));
  }
}

TEST_CASE("vocabulary-parallel embedding shards sum to the whole embedding, and their gradients are its rows",
          "[kernels][tp]") {
  auto be = cpu();
  const int64_t B = 2, T = 7, C = 5, BT = B * T, maxT = T + 2;
  for (int64_t V : {int64_t{11}, int64_t{9}}) {
    for (bool positions : {true, false}) {
      const int TP = V == 11 ? 3 : 4;  // 11 over 3: 4 rows, 1 of padding; 9 over 4: the last shard all padding
      INFO("V=" << V << " over " << TP << (positions ? ", with wpe" : ", without wpe"));
      auto wte = random_vector("vp wte", V * C), wpe = random_vector("vp wpe", maxT * C);
      auto dout = random_vector("vp dout", BT * C);
      auto dwte0 = random_vector("vp dwte0", V * C), dwpe0 = random_vector("vp dwpe0", maxT * C);
      Ids tokens(BT);
      for (int64_t i = 0; i < BT; ++i) tokens[i] = static_cast<int32_t>((i * 4 + i / 3) % V);  // repeats, every shard
      tokens[3] = 0, tokens[4] = static_cast<int32_t>(V - 1);
      std::vector<float> ref(BT * C), ref_dwte = dwte0, ref_dwpe = dwpe0;
      Tensor no_wpe;
      ops::embedding_forward(*be, t2(ref, BT, C), tokens.data(), B, T, t2(wte, V, C),
                             positions ? t2(wpe, maxT, C) : no_wpe);
      ops::embedding_backward(*be, t2(ref_dwte, V, C), positions ? t2(ref_dwpe, maxT, C) : no_wpe, t2(dout, BT, C),
                              tokens.data(), B, T);

      std::vector<float> sum(BT * C, 0.f), dwpe = dwpe0;
      for (int r = 0; r < TP; ++r) {
        const VocabShard v = vocab_shard(V, TP, r);
        INFO("rank " << r << " rows [" << v.begin << ", " << v.begin + v.rows << "), " << v.valid << " valid");
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> part(v.rows * C, nan), dpart(v.rows * C, 7.f), out(BT * C, -1.f);  // padding rows
        std::copy_n(wte.begin() + v.begin * C, v.valid * C, part.begin());
        std::copy_n(dwte0.begin() + v.begin * C, v.valid * C, dpart.begin());
        // Positions are added (and their gradient taken) by one rank, as a unit would.
        const bool mine = positions && r == 0;
        ops::embedding_forward_shard(*be, t2(out, BT, C), tokens.data(), B, T, t2(part, v.rows, C),
                                     mine ? t2(wpe, maxT, C) : no_wpe, v.begin);
        ops::embedding_backward_shard(*be, t2(dpart, v.rows, C), mine ? t2(dwpe, maxT, C) : no_wpe, t2(dout, BT, C),
                                      tokens.data(), B, T, v.begin);
        for (int64_t bt = 0; bt < BT; ++bt) {
          const bool here = tokens[bt] >= v.begin && tokens[bt] < v.begin + v.valid;
          for (int64_t c = 0; c < C; ++c) {
            const float want = (here ? wte[tokens[bt] * C + c] : 0.f) + (mine ? wpe[(bt % T) * C + c] : 0.f);
            CHECK(out[bt * C + c] == want);  // one add at most: exact
            sum[bt * C + c] += out[bt * C + c];
          }
        }
        // The shard's valid rows are the whole gradient's rows, bit for bit (the same additions in
        // the same order); its padding rows are never touched.
        CHECK(std::equal(dpart.begin(), dpart.begin() + v.valid * C, ref_dwte.begin() + v.begin * C));
        CHECK(std::all_of(dpart.begin() + v.valid * C, dpart.end(), [](float x) { return x == 7.f; }));
      }
      CHECK(sum == ref);  // x + 0 is x: the sum over shards is the whole embedding exactly
      if (positions) CHECK(dwpe == ref_dwpe);
      else CHECK(dwpe == dwpe0);
      // And the whole gradient against a double loop.
      std::vector<double> want(dwte0.begin(), dwte0.end());
      for (int64_t bt = 0; bt < BT; ++bt)
        for (int64_t c = 0; c < C; ++c) want[tokens[bt] * C + c] += dout[bt * C + c];
      expect_close(ref_dwte, want, 0, 1e-6, "dwte against double");
    }
  }
}

TEST_CASE("vocabulary-parallel operations reject negative ids; the meta backend checks their shapes",
          "[kernels][tp]") {
  auto be = cpu();
  const int64_t N = 3, Vl = 4, C = 2;
  std::vector<float> logits(N * Vl, 0.f), mx(N), s(N), z(N), losses(N), wte(Vl * C, 0.f), out(N * C);
  const Ids bad = {1, -2, 0};
  CHECK_THROWS_WITH(ops::vocab_ce_sums(*be, t1(s), t1(z), t2(logits, N, Vl), bad.data(), 4, Vl, t1(mx)),
                    Catch::Contains("target id -2 at position 1 is negative"));
  CHECK_THROWS_WITH(ops::vocab_ce_finish(*be, t1(losses), Tensor(), t2(logits, N, Vl), bad.data(), 4, Vl, t1(mx), t1(s),
                                         t1(z), 1.f),
                    Catch::Contains("target id -2 at position 1 is negative"));
  CHECK_THROWS_WITH(ops::embedding_forward_shard(*be, t2(out, N, C), bad.data(), 1, N, t2(wte, Vl, C), Tensor(), 4),
                    Catch::Contains("token id -2 at position 1 is negative"));
  CHECK_THROWS_WITH(ops::embedding_backward_shard(*be, t2(wte, Vl, C), Tensor(), t2(out, N, C), bad.data(), 1, N, 4),
                    Catch::Contains("token id -2 at position 1 is negative"));
  CHECK_THROWS_WITH(ops::vocab_ce_max(*be, t1(mx), t2(logits, N, Vl), Vl + 1), Catch::Contains("vocab_ce_max"));

  auto meta = make_meta_backend();
  // Addresses the meta backend hands out: any touch would fault.
  auto fake = [&](std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return Tensor(meta->raw_alloc(static_cast<size_t>(n) * 4), DType::f32, shape, Device::meta);
  };
  const int64_t B = 2, T = 3, V = 5, D = 4;
  Tensor lg = fake({B * T, V}), row = fake({B * T}), other = fake({B * T + 1});
  Tensor e = fake({V, D}), p = fake({T, D}), x = fake({B * T, D});
  const Ids ids(B * T, 0);
  CHECK_NOTHROW(ops::vocab_ce_max(*meta, row, lg, V - 1));
  CHECK_NOTHROW(ops::vocab_ce_sums(*meta, row, row, lg, ids.data(), 5, V - 1, row));
  CHECK_NOTHROW(ops::vocab_ce_finish(*meta, row, lg, lg, ids.data(), 5, V - 1, row, row, row, 1.f));
  CHECK_NOTHROW(ops::vocab_ce_finish(*meta, row, Tensor(), lg, ids.data(), 5, V - 1, row, row, row, 1.f));
  CHECK_THROWS_WITH(ops::vocab_ce_max(*meta, row, lg, V + 1), Catch::Contains("vocab_ce_max"));
  CHECK_THROWS_WITH(ops::vocab_ce_sums(*meta, other, row, lg, ids.data(), 5, V, row), Catch::Contains("vocab_ce_sums"));
  CHECK_THROWS_WITH(ops::vocab_ce_sums(*meta, row, row, lg, ids.data(), -1, V, row), Catch::Contains("vocab_ce_sums"));
  CHECK_THROWS_WITH(ops::vocab_ce_finish(*meta, row, fake({B * T, V + 1}), lg, ids.data(), 5, V, row, row, row, 1.f),
                    Catch::Contains("vocab_ce_finish"));
  CHECK_THROWS_WITH(ops::vocab_ce_finish(*meta, row, lg, lg, ids.data(), 5, V, row, other, row, 1.f),
                    Catch::Contains("vocab_ce_finish"));
  CHECK_NOTHROW(ops::embedding_forward_shard(*meta, x, ids.data(), B, T, e, p, 5));
  CHECK_NOTHROW(ops::embedding_backward_shard(*meta, e, Tensor(), x, ids.data(), B, T, 5));
  CHECK_THROWS_WITH(ops::embedding_forward_shard(*meta, fake({B * T, D + 1}), ids.data(), B, T, e, p, 5),
                    Catch::Contains("embedding_forward_shard"));
  CHECK_THROWS_WITH(ops::embedding_forward_shard(*meta, x, ids.data(), B, T, e, p, -5),
                    Catch::Contains("embedding_forward_shard"));
  CHECK_THROWS_WITH(ops::embedding_backward_shard(*meta, e, fake({T, D + 1}), x, ids.data(), B, T, 5),
                    Catch::Contains("embedding_backward_shard"));
}
