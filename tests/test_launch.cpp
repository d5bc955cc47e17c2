#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include "src/core/check.hpp"
#include "tools/launch.hpp"

using namespace shardlab;

TEST_CASE("--nproc is taken out of the arguments", "[launch]") {
  std::vector<std::string> a = {"bench-collectives", "--nproc", "4", "--iters", "2"};
  CHECK(take_nproc(a) == 4);
  CHECK(a == std::vector<std::string>{"bench-collectives", "--iters", "2"});
  std::vector<std::string> b = {"info", "--nproc=3"};
  CHECK(take_nproc(b) == 3);
  CHECK(b == std::vector<std::string>{"info"});
  std::vector<std::string> c = {"info"};
  CHECK(take_nproc(c) == 0);
  std::vector<std::string> d = {"info", "--nproc"};
  CHECK_THROWS_WITH(take_nproc(d), Catch::Contains("--nproc needs a value"));
  std::vector<std::string> e = {"info", "--nproc", "0"};
  CHECK_THROWS_WITH(take_nproc(e), Catch::Contains("--nproc '0': expected a positive number of ranks"));
  std::vector<std::string> f = {"info", "--nproc", "2x"};
  CHECK_THROWS_AS(take_nproc(f), InputError);
}

TEST_CASE("the mpirun command line suits a small machine", "[launch]") {
  auto cmd = mpirun_command(4, "/opt/shardlab", {"info", "--threads", "1"});
  auto has = [&](const std::string& s) { return std::find(cmd.begin(), cmd.end(), s) != cmd.end(); };
  CHECK(cmd[1] == "-np");
  CHECK(cmd[2] == "4");
  CHECK(has("--oversubscribe"));
  CHECK(has("--bind-to"));
  CHECK(!has("--quiet"));  // it would hide Open MPI's report of a rank killed by a signal
  auto in = std::find(cmd.begin(), cmd.end(), "--stdin");  // mpirun, in its own process group, reads no terminal
  REQUIRE(in + 1 < cmd.end());
  CHECK(in[1] == "none");
  CHECK(has("--allow-run-as-root") == (geteuid() == 0));
  auto exe = std::find(cmd.begin(), cmd.end(), "/opt/shardlab");
  REQUIRE(exe != cmd.end());
  CHECK(std::vector<std::string>(exe + 1, cmd.end()) == std::vector<std::string>{"info", "--threads", "1"});
}
