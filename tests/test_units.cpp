#include <catch2/catch.hpp>

#include "src/core/check.hpp"
#include "src/core/units.hpp"

using namespace shardlab;

TEST_CASE("byte sizes parse as people write them", "[units]") {
  CHECK(parse_bytes("2GiB") == 2ull << 30);
  CHECK(parse_bytes("512MB") == 512'000'000ull);
  CHECK(parse_bytes("1.5 GiB") == 3ull << 29);
  CHECK(parse_bytes("64kib") == 65536);
  CHECK(parse_bytes("100") == 100);
  CHECK(parse_bytes("7B") == 7);
  CHECK(parse_bytes("1T") == 1'000'000'000'000ull);
  CHECK_THROWS_AS(parse_bytes("lots"), InputError);
  CHECK_THROWS_WITH(parse_bytes("2GB/s"), Catch::Contains("unknown unit 'gb/s'"));
  CHECK_THROWS_WITH(parse_bytes(""), Catch::Contains("cannot parse byte size"));
  CHECK_THROWS_AS(parse_bytes("1.2.3MB"), InputError);
}

TEST_CASE("byte sizes format with binary units", "[units]") {
  CHECK(format_bytes(17) == "17 B");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(2.0 * (1ull << 30)) == "2.00 GiB");
}
