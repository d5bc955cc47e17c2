// ParallelDims and Mesh on one process: degrees resolved against the world, the rank order (tp
// innermost, pp outermost), each axis group's ranks and sizes, pipeline neighbours, and
// point-to-point send/recv on the sim communicator.
#include <catch2/catch.hpp>
#include <set>

#include "src/comm/mesh.hpp"
#include "src/comm/sim_comm.hpp"

using namespace shardlab;

TEST_CASE("parallel degrees resolve against the world and name every degree when they do not", "[comm][mesh]") {
  ParallelDims d = ParallelDims{}.resolved(8);
  CHECK(d == ParallelDims{1, 1, 8, 1});  // plain ZeRO/FSDP: every rank shards
  CHECK(ParallelDims{2, 0, 0, 2}.resolved(16) == ParallelDims{2, 1, 4, 2});
  CHECK(ParallelDims{1, 0, 2, 1}.resolved(4) == ParallelDims{1, 2, 2, 1});  // --dp-shard 2 alone: 2 replicas
  CHECK(ParallelDims{1, 2, 0, 1}.resolved(4) == ParallelDims{1, 2, 2, 1});
  CHECK(d.resolved(8) == d);
  CHECK_THROWS_WITH(ParallelDims({1, 0, 3, 1}).resolved(4),
                    Catch::Contains("--dp-shard 3 = 3 does not divide the world of 4 ranks"));
  CHECK_THROWS_WITH(ParallelDims({2, 2, 2, 2}).resolved(8),
                    Catch::Contains("--pp 2 x --dp-replicate 2 x --dp-shard 2 x --tp 2 = 16 ranks, but the world has 8"));
  CHECK_THROWS_WITH(ParallelDims({1, 0, 0, 3}).resolved(4), Catch::Contains("--tp 3"));
  CHECK_THROWS_WITH(ParallelDims({0, 0, 0, 1}).resolved(4), Catch::Contains("must be positive"));
}

TEST_CASE("ranks: tp innermost, then dp_shard, dp_replicate, pp outermost", "[comm][mesh]") {
  const ParallelDims d{2, 2, 3, 2};  // 24 ranks
  for (int r = 0; r < d.world(); ++r) CHECK(mesh_rank(d, mesh_coord(d, r)) == r);
  MeshCoord c = mesh_coord(d, 1);
  CHECK((c.tp == 1 && c.dp_shard == 0 && c.dp_replicate == 0 && c.pp == 0));
  c = mesh_coord(d, 2);
  CHECK((c.tp == 0 && c.dp_shard == 1));
  c = mesh_coord(d, 6);
  CHECK((c.dp_replicate == 1 && c.dp_shard == 0 && c.pp == 0));
  c = mesh_coord(d, 12);
  CHECK((c.pp == 1 && c.dp_replicate == 0));
  // Every group along an axis holds size(axis) ranks, and the groups along it partition the world.
  for (CommAxis a : {CommAxis::tp, CommAxis::dp_shard, CommAxis::dp_replicate, CommAxis::dp, CommAxis::pp}) {
    std::set<std::pair<int, int>> seen;  // (first member's rank, rank in group)
    for (int r = 0; r < d.world(); ++r) {
      MeshCoord m = mesh_coord(d, r);
      MeshCoord first = m;
      if (a == CommAxis::tp) first.tp = 0;
      if (a == CommAxis::dp_shard || a == CommAxis::dp) first.dp_shard = 0;
      if (a == CommAxis::dp_replicate || a == CommAxis::dp) first.dp_replicate = 0;
      if (a == CommAxis::pp) first.pp = 0;
      const int k = m.rank_in(a, d);
      CHECK((k >= 0 && k < d.size(a)));
      CHECK(seen.insert({mesh_rank(d, first), k}).second);
    }
    CHECK(seen.size() == static_cast<size_t>(d.world()));
  }
}

TEST_CASE("a simulated mesh hands out one communicator per axis with the rank's place in it", "[comm][mesh][sim]") {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  const ParallelDims d{2, 2, 2, 2};
  const int r = 13;  // pp 1, dp_replicate 1, dp_shard 0, tp 1
  auto world = make_sim_communicator(r, d.world(), pool);
  Mesh mesh(*world, d);
  CHECK(mesh.comm(CommAxis::tp).world_size() == 2);
  CHECK(mesh.comm(CommAxis::tp).rank() == 1);
  CHECK(mesh.comm(CommAxis::dp_shard).rank() == 0);
  CHECK(mesh.comm(CommAxis::dp_replicate).rank() == 1);
  CHECK(mesh.dp().world_size() == 4);
  CHECK(mesh.dp_rank() == 2);
  CHECK(mesh.comm(CommAxis::pp).rank() == 1);
  CHECK(mesh.pp_prev() == 0);
  CHECK(mesh.pp_next() == -1);
  // Traffic counts on its axis and in the world's per-axis counters.
  std::vector<float> g(64, 1.f);
  mesh.comm(CommAxis::tp).all_reduce<float>(g).wait();
  mesh.comm(CommAxis::dp_replicate).all_reduce<float>(g).wait();
  world->stats().end_step();
  const auto& bytes = mesh.last_step_bytes();
  CHECK(bytes[static_cast<int>(CommAxis::tp)] == Approx(2 * 0.5 * 256));
  CHECK(bytes[static_cast<int>(CommAxis::dp_replicate)] == Approx(2 * 0.5 * 256));
  CHECK(bytes[static_cast<int>(CommAxis::dp_shard)] == 0);
  CHECK(world->stats().last_step_bytes == Approx(2 * 256));
  // Plain data parallelism: the data-parallel group is the world itself.
  auto solo = make_sim_communicator(0, 4, pool);
  Mesh flat(*solo, ParallelDims{}.resolved(4));
  CHECK(&flat.dp() == solo.get());
  CHECK(flat.comm(CommAxis::dp_shard).world_size() == 4);
  CHECK(flat.comm(CommAxis::tp).world_size() == 1);
  CHECK(flat.pp_prev() == -1);
  CHECK(flat.pp_next() == -1);
}

TEST_CASE("sim send and recv: counted as what a real pair moves, fingerprints mirrored", "[comm][sim]") {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  auto comm = make_sim_communicator(1, 4, pool);
  comm->set_check(true);  // the mirrored fingerprint passes the pair check
  std::vector<float> a(100, 2.f);
  std::vector<bf16> h(50, bf16(1.f));
  comm->send(Tensor::of(std::span<float>(a)), 2).wait();
  comm->recv(Tensor::of(std::span<bf16>(h)), 0).wait();
  for (float v : a) REQUIRE(v == 2.f);  // a receive leaves the buffer as it is
  const auto& st = comm->stats();
  CHECK(st.total[static_cast<int>(CommOp::send)].bytes == 400);
  CHECK(st.total[static_cast<int>(CommOp::recv)].bytes == 100);
  CHECK(st.total[static_cast<int>(CommOp::recv)].wire_bytes == 100);  // not a reduction: not widened
  CHECK_THROWS_WITH(comm->send(Tensor::of(std::span<float>(a)), 1), Catch::Contains("peer 1 from rank 1"));
  CHECK_THROWS_WITH(comm->recv(Tensor::of(std::span<float>(a)), 4), Catch::Contains("peer 4"));
  CHECK(std::string(comm_op_name(CommOp::send)) == "send");
  CHECK(bus_factor(CommOp::recv, 4) == 1.0);
}

TEST_CASE("ZeRO++'s node split: every rank refuses a layout where any shard group spans nodes unevenly",
          "[comm][mesh][sim]") {
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  // 12 ranks, 4 replicas of shard groups of 3, 4 ranks per node: {0,1,2} and {9,10,11} sit in one
  // node each, {3,4,5} and {6,7,8} straddle two unevenly. Every rank stops before splitting.
  ParallelDims d;
  d.dp_replicate = 4, d.dp_shard = 3;
  for (int r : {0, 4, 11}) {
    auto world = make_sim_communicator(r, 12, pool);
    CHECK_THROWS_WITH(Mesh(*world, d.resolved(12), 4, true), Catch::Contains("equal share on every node"));
  }
  // Groups of 4 over nodes of 2: 2 per node; rank 5 is place 1 on its group's second node.
  d.dp_shard = 4, d.dp_replicate = 3;
  auto world = make_sim_communicator(5, 12, pool);
  Mesh mesh(*world, d.resolved(12), 2, true);
  CHECK(mesh.size(CommAxis::dp_shard_node) == 2);
  CHECK(mesh.rank(CommAxis::dp_shard_node) == 1);
  CHECK(mesh.size(CommAxis::dp_shard_cross) == 2);
  CHECK(mesh.rank(CommAxis::dp_shard_cross) == 0);
  CHECK(mesh.crosses_nodes(CommAxis::dp_shard));
  CHECK_FALSE(mesh.crosses_nodes(CommAxis::dp_shard_node));
}
