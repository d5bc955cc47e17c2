// dtype.hpp — the element types shardlab stores (f32, bf16, f16) and exact conversions between
// them. Narrowing conversions round to nearest, ties to even, as CUDA's __float2bfloat16_rn and
// __float2half_rn do, so a CPU run and a GPU run round the same way.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shardlab {

enum class DType : uint8_t { f32, bf16, f16 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses "f32" | "bf16" | "f16" (also "float32", "bfloat16", "float16"); throws InputError otherwise.
DType parse_dtype(std::string_view s);

// Bit-level conversions. NaN stays NaN (quiet), overflow goes to infinity, f16 keeps subnormals.
uint16_t f32_to_bf16_bits(float x);
// Widening is exact and a hot loop's work (kernels reading bf16): inline.
inline float bf16_bits_to_f32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }
uint16_t f32_to_f16_bits(float x);
float f16_bits_to_f32(uint16_t h);

// Storage types: 2 bytes, no arithmetic; convert to float to compute.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float x) : bits(f32_to_bf16_bits(x)) {}
  static bf16 from_bits(uint16_t b) { bf16 v; v.bits = b; return v; }
  explicit operator float() const { return bf16_bits_to_f32(bits); }
};
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float x) : bits(f32_to_f16_bits(x)) {}
  static f16 from_bits(uint16_t b) { f16 v; v.bits = b; return v; }
  explicit operator float() const { return f16_bits_to_f32(bits); }
};
static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2);

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <class T> inline constexpr DType dtype_of_v = dtype_of<std::remove_cv_t<T>>::value;

// Bulk conversions between host buffers of any two dtypes (n elements).
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

}  // namespace shardlab
