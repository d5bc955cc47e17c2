// The Mesh over real ranks (mpi, or staged with $SHARDLAB_TEST_COMM): for every way to lay out the
// world as pp x dp_replicate x dp_shard x tp, each axis communicator reduces exactly the ranks the
// grid arithmetic puts in its group; and point-to-point send/recv, alone and in a ring, with
// --check-collectives naming a mismatched pair instead of hanging.
#include <catch2/catch.hpp>

#include "src/comm/mesh.hpp"
#include "tests/mpi_test_env.hpp"
#include "tests/test_util.hpp"

using namespace shardlab;
using shardlab::test::g_mpi;

namespace {
struct World {
  std::unique_ptr<Backend> be = make_cpu_backend(BackendConfig{1});
  Pool pool{*be};
  std::unique_ptr<Communicator> comm = test::test_communicator(pool);
  int rank = comm->rank(), world = comm->world_size();
};

std::vector<ParallelDims> layouts(int world) {
  std::vector<ParallelDims> out;
  for (int pp = 1; pp <= world; ++pp)
    for (int rep = 1; rep <= world; ++rep)
      for (int tp = 1; tp <= world; ++tp)
        for (int cp = 1; cp <= world; ++cp)
          for (int ep = 1; ep <= world; ++ep)
            if (world % (pp * rep * tp * cp * ep) == 0)
              out.push_back(ParallelDims{pp, rep, world / (pp * rep * tp * cp * ep), tp, cp, ep});
  return out;
}
}  // namespace

TEST_CASE("every axis communicator of the mesh spans the ranks of its grid line", "[mpi][mesh]") {
  World w;
  for (const ParallelDims& d : layouts(w.world)) {
    Mesh mesh(*w.comm, d);
    for (CommAxis a : {CommAxis::tp, CommAxis::dp_shard, CommAxis::dp_replicate, CommAxis::dp, CommAxis::pp,
                       CommAxis::cp, CommAxis::dp_shard_cp, CommAxis::dp_cp, CommAxis::ep, CommAxis::edp_cp}) {
      if (a == CommAxis::cp && d.cp == 1) continue;  // no cp group at cp 1
      if (a == CommAxis::ep && d.ep == 1) continue;  // nor an ep group at ep 1
      Communicator& c = mesh.comm(a);
      INFO(d.describe() << " axis " << comm_axis_name(a));
      REQUIRE(c.world_size() == d.size(a));
      CHECK(c.rank() == mesh.rank(a));
      // The sum of the members' world ranks, against the sum the grid says it should be.
      std::vector<float> v = {static_cast<float>(w.rank)};
      c.all_reduce<float>(v).wait();
      double expect = 0;
      for (int r = 0; r < w.world; ++r) {
        const MeshCoord m = mesh_coord(d, r), me = mesh.coord();
        bool same = true;  // every coordinate the group does not vary along is this rank's
        for (int g = 0; g < kNumGridAxes; ++g)
          if (const auto axis = static_cast<GridAxis>(g); !spans(a, axis)) same &= m.at(axis) == me.at(axis);
        if (same) expect += r;
      }
      CHECK(v[0] == expect);
    }
    // Pipeline neighbours are the adjacent stages of this rank's pp group.
    CHECK(mesh.pp_prev() == (mesh.coord().pp > 0 ? mesh.coord().pp - 1 : -1));
    CHECK(mesh.pp_next() == (mesh.coord().pp + 1 < d.pp ? mesh.coord().pp + 1 : -1));
  }
}

TEST_CASE("send and recv: a ring in both dtypes, in order, counted on both sides", "[mpi][mesh]") {
  World w;
  if (w.world < 2) return;
  w.comm->set_check(true);  // a ring of sends posted before the receives must not deadlock
  const int next = (w.rank + 1) % w.world, prev = (w.rank + w.world - 1) % w.world;
  for (DType t : {DType::f32, DType::bf16}) {
    const int64_t n = 1001;
    std::vector<float> mine(n), first(n), second(n);
    for (int64_t i = 0; i < n; ++i) mine[i] = test::round_to(static_cast<float>(w.rank * 10000 + i) / 7.f, t);
    std::vector<uint8_t> a(n * dtype_size(t)), b(n * dtype_size(t)), in1(n * dtype_size(t)), in2(n * dtype_size(t));
    convert(mine.data(), DType::f32, a.data(), t, n);
    std::vector<float> twice(mine);
    for (float& x : twice) x = test::round_to(2 * x, t);
    convert(twice.data(), DType::f32, b.data(), t, n);
    Work s1 = w.comm->send(Tensor::flat(a.data(), t, n), next);
    Work s2 = w.comm->send(Tensor::flat(b.data(), t, n), next);
    Work r1 = w.comm->recv(Tensor::flat(in1.data(), t, n), prev);
    Work r2 = w.comm->recv(Tensor::flat(in2.data(), t, n), prev);
    r2.wait();
    r1.wait();
    s1.wait();
    s2.wait();
    convert(in1.data(), t, first.data(), DType::f32, n);
    convert(in2.data(), t, second.data(), DType::f32, n);
    for (int64_t i = 0; i < n; ++i) {
      const float x = test::round_to(static_cast<float>(prev * 10000 + i) / 7.f, t);
      REQUIRE(first[i] == x);
      REQUIRE(second[i] == test::round_to(2 * x, t));
    }
  }
  const auto& st = w.comm->stats();
  CHECK(st.total[static_cast<int>(CommOp::send)].calls == 4);
  CHECK(st.total[static_cast<int>(CommOp::recv)].bytes == Approx(2 * 1001 * (4 + 2)));
}

TEST_CASE("--check-collectives names a send and a receive that do not match", "[mpi][mesh]") {
  World w;
  if (w.world < 2) return;
  w.comm->set_check(true);
  std::vector<float> buf(16, 1.f);
  std::string msg;
  if (w.rank == 0) {
    w.comm->send(Tensor::flat(buf.data(), DType::f32, 8), 1).wait();
  } else if (w.rank == 1) {
    try {
      w.comm->recv(Tensor::flat(buf.data(), DType::f32, 9), 0).wait();
    } catch (const InternalError& e) {
      msg = e.what();
    }
    CHECK_THAT(msg, Catch::Contains("point-to-point #0 from rank 0 to rank 1 differs"));
    CHECK_THAT(msg, Catch::Contains("rank 0 issues send of 8 f32 to rank 1 at tests/test_mesh_mpi.cpp:"));
    CHECK_THAT(msg, Catch::Contains("rank 1 issues recv of 9 f32 from rank 0 at tests/test_mesh_mpi.cpp:"));
  }
  // Rank 0's data send is still unmatched: rank 1 takes it as it was sent, so nothing is left over.
  w.comm->set_check(false);
  if (w.rank == 1) w.comm->recv(Tensor::flat(buf.data(), DType::f32, 8), 0).wait();
  w.comm->barrier().wait();
}
