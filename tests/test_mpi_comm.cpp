// Every collective of the mpi (and staged) communicator against an expectation each rank computes locally
// (it knows every rank's inputs: they are a function of rank and index), for f32, bf16 and f16,
// counts that do not divide evenly, every root, two collectives in flight at once, and a rank
// that arrives late.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <thread>

#include "src/comm/mpi_comm.hpp"
#include "tests/mpi_test_env.hpp"
#include "tests/test_util.hpp"

using namespace shardlab;
using shardlab::test::g_mpi;

namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

// Rank r's input element i, already representable in dtype t (so every rank agrees on it).
float input(int r, int64_t i, DType t) {
  float v = Rng(99, "mpi input " + std::to_string(r)).uniform(static_cast<uint64_t>(i)) * 4.f - 2.f;
  return test::round_to(v, t);
}

struct Buf {
  std::vector<uint8_t> bytes;
  Tensor t;
  Buf(DType dt, int64_t n) : bytes(static_cast<size_t>(n) * dtype_size(dt) + 1) {
    t = Tensor::flat(bytes.data(), dt, n);
  }
  void set(int r, int64_t first = 0) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = input(r, first + static_cast<int64_t>(i), t.dtype());
    convert(v.data(), DType::f32, t.data(), t.dtype(), v.size());
  }
  std::vector<float> get() const {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    convert(t.data(), t.dtype(), v.data(), DType::f32, v.size());
    return v;
  }
};

double exact_sum(int world, int64_t i, DType t) {
  double s = 0;
  for (int r = 0; r < world; ++r) s += input(r, i, t);
  return s;
}

// A reduced value must be the exact sum rounded once to the dtype: within half an ulp of it, plus
// the f32 accumulation error of the widened sum (world * 2^-24 relative). Summing in bf16 or f16
// (rounding at every step) would break this bound.
bool close_to_sum(float got, double exact, DType t, int world) {
  double tol = 0.5 * test::ulp(exact, t) + world * std::ldexp(std::fabs(exact), -24) + 1e-30;
  if (t == DType::f32) tol = world * std::ldexp(std::fabs(exact) + 4.0, -23);
  return std::fabs(got - exact) <= tol;
}

struct Setup {
  std::unique_ptr<Backend> be = make_cpu_backend(BackendConfig{});
  Pool pool{*be};
  // mpi, or staged ($SHARDLAB_TEST_COMM): on the cpu backend every buffer is the backend's, so the
  // staged transport copies each one through its host stage and back, as it does on a GPU.
  std::unique_ptr<Communicator> comm = test::test_communicator(pool);
  int rank = comm->rank(), world = comm->world_size();
};

}  // namespace

TEST_CASE("all_reduce sums and maxes every dtype", "[mpi]") {
  Setup s;
  for (DType t : kTypes)
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(1001), int64_t(40000)}) {
      Buf b(t, n), m(t, n);
      b.set(s.rank);
      m.set(s.rank);
      s.comm->all_reduce(b.t).wait();
      s.comm->all_reduce(m.t, ReduceOp::max).wait();
      auto got = b.get(), gotmax = m.get();
      int bad = 0, badmax = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (!close_to_sum(got[i], exact_sum(s.world, i, t), t, s.world)) ++bad;
        float mx = -1e30f;
        for (int r = 0; r < s.world; ++r) mx = std::max(mx, input(r, i, t));
        if (gotmax[i] != mx) ++badmax;
      }
      INFO(dtype_name(t) << " n=" << n);
      CHECK(bad == 0);
      CHECK(badmax == 0);
    }
  CHECK(s.pool.in_use() == 0);  // widening buffers are returned once the work completes
}

TEST_CASE("reduce_scatter gives rank r the reduced chunk r", "[mpi]") {
  Setup s;
  for (DType t : kTypes)
    for (int64_t chunk : {int64_t(1), int64_t(333), int64_t(5000)}) {
      Buf send(t, chunk * s.world), recv(t, chunk);
      send.set(s.rank);
      s.comm->reduce_scatter(send.t, recv.t).wait();
      auto got = recv.get();
      int bad = 0;
      for (int64_t i = 0; i < chunk; ++i)
        if (!close_to_sum(got[i], exact_sum(s.world, s.rank * chunk + i, t), t, s.world)) ++bad;
      INFO(dtype_name(t) << " chunk=" << chunk);
      CHECK(bad == 0);
    }
}

TEST_CASE("all_gather concatenates every rank's chunk bit for bit", "[mpi]") {
  Setup s;
  for (DType t : kTypes)
    for (int64_t chunk : {int64_t(1), int64_t(777)}) {
      Buf send(t, chunk), recv(t, chunk * s.world);
      send.set(s.rank, s.rank * chunk);  // rank r holds elements [r*chunk, (r+1)*chunk) of a whole
      s.comm->all_gather(send.t, recv.t).wait();
      auto got = recv.get();
      int bad = 0;
      for (int64_t i = 0; i < chunk * s.world; ++i)
        if (got[i] != input(static_cast<int>(i / chunk), i, t)) ++bad;
      CHECK(bad == 0);
    }
}

TEST_CASE("broadcast and reduce from every root", "[mpi]") {
  Setup s;
  for (DType t : kTypes)
    for (int root = 0; root < s.world; ++root) {
      const int64_t n = 513;
      Buf b(t, n), send(t, n), recv(t, n);
      b.set(s.rank);
      send.set(s.rank);
      s.comm->broadcast(b.t, root).wait();
      s.comm->reduce(send.t, recv.t, root).wait();
      auto got = b.get();
      int bad = 0;
      for (int64_t i = 0; i < n; ++i)
        if (got[i] != input(root, i, t)) ++bad;
      CHECK(bad == 0);
      if (s.rank == root) {
        auto red = recv.get();
        int badr = 0;
        for (int64_t i = 0; i < n; ++i)
          if (!close_to_sum(red[i], exact_sum(s.world, i, t), t, s.world)) ++badr;
        CHECK(badr == 0);
      }
    }
}

TEST_CASE("two collectives in flight, and a rank that arrives late", "[mpi]") {
  Setup s;
  const int64_t chunk = 20000;
  Buf gsend(DType::f32, chunk), grecv(DType::f32, chunk * s.world), ar(DType::bf16, 3 * chunk);
  gsend.set(s.rank, s.rank * chunk);
  ar.set(s.rank);
  if (s.rank == s.world - 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Work w1 = s.comm->all_gather(gsend.t, grecv.t);
  Work w2 = s.comm->all_reduce(ar.t);
  // mpi's bf16 -> f32 staging copy is in the rank's pool; the staged transport keeps its own.
  CHECK(s.pool.ledger().current(Category::comm_buffer) == (test::test_comm() == CommKind::mpi ? 3 * chunk * 4 : 0));
  w2.wait();
  w1.wait();
  CHECK(w1.done());
  auto g = grecv.get(), a = ar.get();
  int bad = 0;
  for (int64_t i = 0; i < chunk * s.world; ++i)
    if (g[i] != input(static_cast<int>(i / chunk), i, DType::f32)) ++bad;
  for (int64_t i = 0; i < 3 * chunk; ++i)
    if (!close_to_sum(a[i], exact_sum(s.world, i, DType::bf16), DType::bf16, s.world)) ++bad;
  CHECK(bad == 0);
  CHECK(s.pool.in_use() == 0);
  s.comm->barrier().wait();
}

TEST_CASE("byte counters follow the nccl-tests conventions", "[mpi]") {
  Setup s;
  const double N = s.world;
  Buf f(DType::f32, 1000), h(DType::bf16, 1000), recv(DType::f32, 1000 * s.world);
  f.set(s.rank);
  h.set(s.rank);
  s.comm->all_reduce(f.t).wait();
  s.comm->all_reduce(h.t).wait();
  s.comm->all_gather(f.t, recv.t).wait();
  const auto& st = s.comm->stats();
  const auto& ar = st.total[static_cast<int>(CommOp::all_reduce)];
  CHECK(ar.calls == 2);
  CHECK(ar.bytes == Approx(2 * (N - 1) / N * (4000 + 2000)));
  CHECK(ar.wire_bytes == Approx(2 * (N - 1) / N * (4000 + 4000)));  // bf16 travels as f32
  CHECK(st.total[static_cast<int>(CommOp::all_gather)].bytes == Approx((N - 1) / N * 4000 * N));
  CHECK(st.step_bytes() == Approx(st.total_bytes()));
}

TEST_CASE("the runtime knows its node-local rank", "[mpi]") {
  CHECK(g_mpi->local_size() >= 1);
  CHECK(g_mpi->local_rank() < g_mpi->local_size());
  CHECK(process_identity().find("rank " + std::to_string(g_mpi->rank())) == 0);
}

TEST_CASE("gather and scatter from every root, and in-place all_gather and reduce", "[mpi]") {
  Setup s;
  for (DType t : kTypes)
    for (int root = 0; root < s.world; ++root) {
      const int64_t chunk = 301;
      Buf send(t, chunk), all(t, chunk * s.world), got(t, chunk);
      send.set(s.rank, s.rank * chunk);
      all.set(root);  // the root's scatter source: elements of rank `root`'s stream
      s.comm->gather(send.t, all.t, root).wait();
      int bad = 0;
      if (s.rank == root) {
        auto g = all.get();
        for (int64_t i = 0; i < chunk * s.world; ++i)
          if (g[i] != input(static_cast<int>(i / chunk), i, t)) ++bad;
      }
      all.set(root);
      s.comm->scatter(all.t, got.t, root).wait();
      auto sc = got.get();
      for (int64_t i = 0; i < chunk; ++i)
        if (sc[i] != input(root, s.rank * chunk + i, t)) ++bad;
      CHECK(bad == 0);
    }
  // In place: each rank's chunk already sits at its offset of the gathered buffer.
  const int64_t chunk = 1000;
  Buf full(DType::f32, chunk * s.world);
  full.set(s.rank);
  Tensor mine = full.t.slice(s.rank * chunk, chunk);
  s.comm->all_gather(mine, full.t).wait();
  auto g = full.get();
  int bad = 0;
  for (int64_t i = 0; i < chunk * s.world; ++i)
    if (g[i] != input(static_cast<int>(i / chunk), i, DType::f32)) ++bad;
  Buf acc(DType::f32, chunk);
  acc.set(s.rank);
  s.comm->reduce(acc.t, acc.t, 0).wait();  // root reduces into its own buffer
  if (s.rank == 0) {
    auto a = acc.get();
    for (int64_t i = 0; i < chunk; ++i)
      if (!close_to_sum(a[i], exact_sum(s.world, i, DType::f32), DType::f32, s.world)) ++bad;
  }
  CHECK(bad == 0);
}

TEST_CASE("--check-collectives names the diverging rank and both call sites instead of hanging", "[mpi]") {
  Setup s;
  s.comm->set_check(true);
  Buf b(DType::f32, 64);
  b.set(s.rank);
  CHECK_NOTHROW(s.comm->all_reduce(b.t).wait());  // the same collective everywhere passes the check
  if (s.world < 2) return;
  // The last rank skips the all_reduce and goes on to the barrier.
  std::string msg;
  try {
    if (s.rank == s.world - 1) s.comm->barrier().wait();
    else s.comm->all_reduce(b.t).wait();
  } catch (const InternalError& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Catch::Contains("collective #1 differs across ranks"));
  CHECK_THAT(msg, Catch::Contains("rank 0 issues all_reduce of 64 f32 at tests/test_mpi_comm.cpp:"));
  CHECK_THAT(msg, Catch::Contains(fmt::format("rank {} issues barrier at tests/test_mpi_comm.cpp:", s.world - 1)));
}

// Rank s sends rank d (s + 2d) % 5 elements (none for some pairs), element i of that chunk being
// input(s, 1000 d + i): every rank knows what each peer sends it.
TEST_CASE("all_to_all_v moves chunks of every size bit for bit, counts what leaves the rank, and checks the counts",
          "[mpi]") {
  Setup s;
  const int N = s.world, me = s.rank;
  const auto n = [](int from, int to) { return static_cast<int64_t>((from + 2 * to) % 5); };
  for (DType dt : kTypes) {
    std::vector<int64_t> sc(N), rc(N);
    int64_t total_s = 0, total_r = 0;
    for (int j = 0; j < N; ++j) sc[j] = n(me, j), rc[j] = n(j, me), total_s += sc[j], total_r += rc[j];
    Buf send(dt, total_s), recv(dt, total_r);
    std::vector<float> v;
    for (int j = 0; j < N; ++j)
      for (int64_t i = 0; i < sc[j]; ++i) v.push_back(input(me, 1000 * j + i, dt));
    convert(v.data(), DType::f32, send.t.data(), dt, v.size());
    const double before = s.comm->stats().total[static_cast<int>(CommOp::all_to_all_v)].bytes;
    s.comm->all_to_all_v(send.t, sc, recv.t, rc).wait();
    const std::vector<float> got = recv.get();
    size_t at = 0;
    bool same = true;
    for (int j = 0; j < N; ++j)
      for (int64_t i = 0; i < rc[j]; ++i) same = same && got[at++] == input(j, 1000 * me + i, dt);
    INFO(dtype_name(dt) << " rank " << me);
    CHECK(same);
    const double leaves = static_cast<double>(total_s - sc[me]) * dtype_size(dt);
    CHECK(s.comm->stats().total[static_cast<int>(CommOp::all_to_all_v)].bytes - before == (N > 1 ? leaves : 0.0));
  }
  // What a rank knows alone is checked at once; counts that disagree across ranks under
  // --check-collectives, naming both sides.
  Buf a(DType::f32, 4), b(DType::f32, 4);
  std::vector<int64_t> bad(N, 0);
  bad[me] = 3;
  CHECK_THROWS_WITH(s.comm->all_to_all_v(a.t, bad, b.t, bad), Catch::Contains("send counts sum to 3 for a send buffer of 4"));
  if (N < 2) return;
  s.comm->set_check(true);
  std::vector<int64_t> sc(N, 0), rc(N, 0);
  sc[(me + 1) % N] = 4, rc[(me + N - 1) % N] = me == 0 ? 3 : 4;  // rank 0 expects 3 of rank N-1's 4
  Buf c(DType::f32, 4), d(DType::f32, rc[(me + N - 1) % N]);
  std::string msg;
  try {
    s.comm->all_to_all_v(c.t, sc, d.t, rc).wait();
  } catch (const InternalError& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Catch::Contains(fmt::format("rank {} sends rank 0 4 elements, which expects 3", N - 1)));  // every rank
}
