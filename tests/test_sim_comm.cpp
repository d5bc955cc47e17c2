#include <catch2/catch.hpp>
#include <numeric>

#include "src/comm/sim_comm.hpp"

using namespace shardlab;

TEST_CASE("sim communicator: right sizes, replica values, real-world byte counts", "[comm][sim]") {
  auto be = make_cpu_backend(BackendConfig{});
  Pool pool(*be);
  const int N = 4, r = 2;
  auto comm = make_sim_communicator(r, N, pool);
  CHECK(comm->rank() == r);
  CHECK(comm->world_size() == N);

  std::vector<float> shard(250);
  std::iota(shard.begin(), shard.end(), 1.f);
  std::vector<float> full(1000, -1.f);
  comm->all_gather<float>(shard, full).wait();
  for (int c = 0; c < N; ++c)
    for (size_t i = 0; i < 250; ++i) REQUIRE(full[c * 250 + i] == shard[i]);

  std::vector<float> out(250);
  comm->reduce_scatter<float>(full, out).wait();
  for (size_t i = 0; i < 250; ++i) REQUIRE(out[i] == N * full[r * 250 + i]);

  std::vector<bf16> h(10, bf16(1.5f));
  comm->all_reduce<bf16>(h).wait();
  for (auto v : h) CHECK(static_cast<float>(v) == 6.0f);
  std::vector<float> m = {3.f};
  comm->all_reduce<float>(m, ReduceOp::max).wait();
  CHECK(m[0] == 3.f);

  // Bus bytes as a real world of 4 would count them.
  const auto& st = comm->stats();
  CHECK(st.total[static_cast<int>(CommOp::all_gather)].bytes == 3.0 / 4 * 4000);
  CHECK(st.total[static_cast<int>(CommOp::reduce_scatter)].bytes == 3.0 / 4 * 4000);
  CHECK(st.total[static_cast<int>(CommOp::all_reduce)].bytes == 2 * 3.0 / 4 * 20 + 2 * 3.0 / 4 * 4);
  CHECK(st.total[static_cast<int>(CommOp::all_reduce)].calls == 2);
  double step = comm->stats().step_bytes();
  comm->stats().end_step();
  CHECK(comm->stats().steps == 1);
  CHECK(comm->stats().last_step_bytes == step);
  CHECK(comm->stats().step_bytes() == 0);
  CHECK(pool.in_use() == 0);  // the bf16 widening buffer went back

  std::vector<float> wrong(999);
  CHECK_THROWS_WITH(comm->all_gather<float>(shard, wrong),
                    Catch::Contains("recv has 999 elements, expected world 4 x send 250 = 1000"));
  CHECK_THROWS_WITH(comm->broadcast<float>(shard, 4), Catch::Contains("root 4 outside world of 4"));
}

TEST_CASE("sim communicator: a world of one moves nothing", "[comm][sim]") {
  auto be = make_cpu_backend(BackendConfig{});
  Pool pool(*be);
  auto comm = make_sim_communicator(0, 1, pool);
  std::vector<float> v(100, 2.f);
  comm->all_reduce<float>(v).wait();
  comm->broadcast<float>(v, 0).wait();
  CHECK(v[0] == 2.f);
  CHECK(comm->stats().total_bytes() == 0);
  CHECK_THROWS_AS(make_sim_communicator(4, 4, pool), InputError);
}

TEST_CASE("bus factors are nccl-tests'", "[comm]") {
  CHECK(bus_factor(CommOp::all_reduce, 4) == 1.5);
  CHECK(bus_factor(CommOp::all_gather, 4) == 0.75);
  CHECK(bus_factor(CommOp::reduce_scatter, 2) == 0.5);
  CHECK(bus_factor(CommOp::broadcast, 8) == 1.0);
  CHECK(bus_bytes(CommOp::all_reduce, 1000, 1) == 0.0);
}
