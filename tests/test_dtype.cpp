#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "src/core/check.hpp"
#include "src/core/dtype.hpp"
#include "src/core/rng.hpp"

using namespace shardlab;

namespace {
uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// The value a bf16 bit pattern stands for when rounding; infinity counts as 2^128, the next
// power of two past the largest finite value, as IEEE 754's overflow rule has it.
double bf16_rounding_value(uint16_t b) {
  if ((b & 0x7f80) == 0x7f80) return (b & 0x8000) ? -0x1p128 : 0x1p128;
  return from_bits(static_cast<uint32_t>(b) << 16);
}

// Independent reference: the nearest bf16 by comparing both neighbours in double, ties to even.
uint16_t bf16_reference(float x) {
  if (std::isnan(x)) return 0x7fc0;
  uint32_t u = bits_of(x);
  uint16_t lo = static_cast<uint16_t>(u >> 16);
  uint16_t hi = static_cast<uint16_t>(lo + 1);
  double dl = std::fabs(bf16_rounding_value(lo) - x);
  double dh = std::fabs(bf16_rounding_value(hi) - x);
  if ((u & 0xffffu) == 0) return lo;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}
}  // namespace

TEST_CASE("dtype sizes, names and parsing", "[dtype]") {
  CHECK(dtype_size(DType::f32) == 4);
  CHECK(dtype_size(DType::bf16) == 2);
  CHECK(dtype_size(DType::f16) == 2);
  CHECK(parse_dtype("bf16") == DType::bf16);
  CHECK(parse_dtype("float16") == DType::f16);
  CHECK(std::string(dtype_name(DType::f32)) == "f32");
  CHECK_THROWS_WITH(parse_dtype("int8"), Catch::Contains("unknown dtype 'int8'"));
}

TEST_CASE("bf16 rounds to nearest even", "[dtype]") {
  CHECK(f32_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(f32_to_bf16_bits(from_bits(0x3f808000u)) == 0x3f80);  // tie, even below
  CHECK(f32_to_bf16_bits(from_bits(0x3f818000u)) == 0x3f82);  // tie, even above
  CHECK(f32_to_bf16_bits(from_bits(0x3f808001u)) == 0x3f81);  // just above the tie
  CHECK(f32_to_bf16_bits(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(f32_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);  // overflows to inf
  CHECK(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low bits must not become infinity.
  CHECK(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(from_bits(0x7f800001u)))));
  CHECK(f32_to_bf16_bits(-0.0f) == 0x8000);

  Rng rng(7, "bf16 sweep");
  int mismatches = 0;
  for (uint64_t i = 0; i < 200000; ++i) {
    uint32_t u = rng.bits(i)[0];
    float x = from_bits(u);
    if (std::isnan(x) || std::isinf(x)) continue;
    if (f32_to_bf16_bits(x) != bf16_reference(x)) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("f16 conversions agree with the compiler's _Float16", "[dtype]") {
  // Every f16 value survives f16 -> f32 -> f16 exactly.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_bits_to_f32(static_cast<uint16_t>(h));
    _Float16 ref;
    uint16_t hb = static_cast<uint16_t>(h);
    std::memcpy(&ref, &hb, 2);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(static_cast<float>(ref)));
      continue;
    }
    REQUIRE(f == static_cast<float>(ref));
    REQUIRE(f32_to_f16_bits(f) == h);
  }
  // Random f32 bit patterns over the whole range, and a dense sweep of the subnormal/overflow edges.
  Rng rng(9, "f16 sweep");
  int mismatches = 0;
  auto check_one = [&](float x) {
    if (std::isnan(x)) return;
    _Float16 ref = static_cast<_Float16>(x);
    uint16_t rb;
    std::memcpy(&rb, &ref, 2);
    if (f32_to_f16_bits(x) != rb) ++mismatches;
  };
  for (uint64_t i = 0; i < 200000; ++i) check_one(from_bits(rng.bits(i)[0]));
  for (uint32_t u = 0x32f00000u; u < 0x38900000u; u += 0x401u) check_one(from_bits(u));  // around 2^-25 .. 2^-14
  for (uint32_t u = 0x477f0000u; u < 0x47810000u; u += 0x11u) check_one(from_bits(u));   // around 65504 .. 65536
  CHECK(mismatches == 0);
  CHECK(f32_to_f16_bits(65520.0f) == 0x7c00);   // the tie above 65504 rounds to infinity
  CHECK(f32_to_f16_bits(65519.99f) == 0x7bff);
  CHECK(f32_to_f16_bits(0x1p-25f) == 0x0000);   // tie at half the smallest subnormal: even (zero)
  CHECK(f32_to_f16_bits(0x1.8p-24f) == 0x0002); // tie between subnormals 1 and 2: even
}

TEST_CASE("bulk convert matches the scalar conversions", "[dtype]") {
  std::vector<float> src = {0.1f, -2.5f, 1e-6f, 3e5f, 65504.f};
  std::vector<uint16_t> b(src.size()), h(src.size());
  convert(src.data(), DType::f32, b.data(), DType::bf16, src.size());
  convert(src.data(), DType::f32, h.data(), DType::f16, src.size());
  std::vector<float> back(src.size());
  convert(b.data(), DType::bf16, back.data(), DType::f32, src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    CHECK(b[i] == f32_to_bf16_bits(src[i]));
    CHECK(h[i] == f32_to_f16_bits(src[i]));
    CHECK(back[i] == bf16_bits_to_f32(b[i]));
  }
  std::vector<uint16_t> h2(src.size());
  convert(b.data(), DType::bf16, h2.data(), DType::f16, src.size());  // bf16 -> f16 goes through f32
  for (size_t i = 0; i < src.size(); ++i) CHECK(h2[i] == f32_to_f16_bits(bf16_bits_to_f32(b[i])));
}

// The bulk f32 <-> bf16 loops (written to vectorise) against the scalar functions over bit
// patterns spread across all of f32: NaNs (signalling and quiet, both signs), infinities,
// subnormals, the ties between two bf16 values and the carries into the exponent.
TEST_CASE("bulk f32 <-> bf16 gives the scalar conversions' bits for every kind of f32", "[dtype]") {
  std::vector<uint32_t> bits;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 65521) bits.push_back(static_cast<uint32_t>(u));
  for (uint32_t u : {0x7f800000u, 0xff800000u, 0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fffffffu, 0x00000001u,
                     0x80000001u, 0x3f808000u, 0x3f818000u, 0x3f7fffffu, 0x7f7fffffu, 0x7f7f8000u, 0x00008000u})
    bits.push_back(u);
  std::vector<uint16_t> narrowed(bits.size());
  std::vector<uint32_t> widened(bits.size());
  convert(bits.data(), DType::f32, narrowed.data(), DType::bf16, bits.size());
  convert(narrowed.data(), DType::bf16, widened.data(), DType::f32, bits.size());
  size_t wrong = 0;
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint16_t want = f32_to_bf16_bits(std::bit_cast<float>(bits[i]));
    wrong += narrowed[i] != want || widened[i] != std::bit_cast<uint32_t>(bf16_bits_to_f32(want));
  }
  CHECK(bits.size() > 65000);
  CHECK(wrong == 0);
}
