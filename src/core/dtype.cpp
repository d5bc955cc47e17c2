#include "src/core/dtype.hpp"

#include <bit>
#include <cstring>
#include <string>

#include "src/core/check.hpp"

namespace shardlab {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  SHARD_CHECK(false, "unknown dtype {}", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  if (s == "f32" || s == "float32" || s == "fp32") return DType::f32;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "f16" || s == "float16" || s == "fp16") return DType::f16;
  throw InputError(fmt::format("unknown dtype '{}': expected f32, bf16 or f16", s));
}

// Round to nearest even (add 0x7fff plus the lowest kept bit, then truncate); a NaN stays a NaN,
// made quiet. Without branches, so convert's loop over it vectorises.
uint16_t f32_to_bf16_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

uint16_t f32_to_f16_bits(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is an f16 subnormal (or zero): value = m * 2^-24 with m an integer to round.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    uint32_t exp = abs >> 23;                                     // biased f32 exponent, 102..112
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;                // 24-bit significand
    uint32_t shift = 126 - exp;                                   // 14..24
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal range: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  uint32_t v = abs - (112u << 23);
  uint32_t lsb = (v >> 13) & 1u;
  v += 0xfffu + lsb;
  return static_cast<uint16_t>(sign | (v >> 13));
}

float f16_bits_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else {
    // Subnormal: value = mant * 2^-24, exact in f32.
    float v = static_cast<float>(mant) * 0x1p-24f;
    u = sign | std::bit_cast<uint32_t>(v);
  }
  return std::bit_cast<float>(u);
}

namespace {
float load(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return f16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.f;
}
void store(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = v; break;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(v); break;
    case DType::f16: static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(v); break;
  }
}
}  // namespace

void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n) {
  if (src_type == dst_type) {
    if (src != dst) std::memmove(dst, src, n * dtype_size(src_type));
    return;
  }
  // The two conversions bf16 training runs in bulk, as loops the compiler vectorises: the scalar
  // conversions inlined, without a switch per element.
  if (src_type == DType::f32 && dst_type == DType::bf16) {
    const float* s = static_cast<const float*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16_bits(s[i]);
    return;
  }
  if (src_type == DType::bf16 && dst_type == DType::f32) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* d = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = bf16_bits_to_f32(s[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i) store(dst, dst_type, i, load(src, src_type, i));
}

}  // namespace shardlab
