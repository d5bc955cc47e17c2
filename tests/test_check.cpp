#include <catch2/catch.hpp>

#include "src/core/check.hpp"

using namespace shardlab;

TEST_CASE("SHARD_CHECK reports the statement, file:line, rank and values", "[check]") {
  set_process_identity(2, 4, "cpu");
  int shards = 3, elements = 1000;
  try {
    SHARD_CHECK(elements % shards == 0, "cannot shard {} elements over {} ranks without padding", elements, shards);
    FAIL("SHARD_CHECK did not throw");
  } catch (const InternalError& e) {
    std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("test_check.cpp:"));
    CHECK_THAT(msg, Catch::Contains("rank 2/4 cpu"));
    CHECK_THAT(msg, Catch::Contains("elements % shards == 0"));
    CHECK_THAT(msg, Catch::Contains("cannot shard 1000 elements over 3 ranks without padding"));
  }
  set_process_identity(-1, 0, "cpu");
}

TEST_CASE("SHARD_REQUIRE throws an input error with the message", "[check]") {
  int steps = -3;
  auto validate = [](int n) { SHARD_REQUIRE(n > 0, "--steps {}: expected a positive count", n); };
  CHECK_THROWS_MATCHES(validate(steps), InputError, Catch::Message("--steps -3: expected a positive count"));
  CHECK_NOTHROW(validate(1));
}
