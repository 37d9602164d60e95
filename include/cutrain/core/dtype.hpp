// Element types and their traits: f64, f32, f16 and bf16 (host-side conversions with
// round-to-nearest-even), plus the integer types used for labels, indices and masks (i32, i64, u8).
#pragma once

#include "cutrain/core/abi.hpp"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>

namespace cutrain::inline CUTRAIN_ABI {

enum class DType { f64, f32, f16, bf16, i32, u8, i64 };

inline std::string_view to_string(DType d) {
  switch (d) {
    case DType::f64: return "f64";
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
    case DType::i64: return "i64";
  }
  return "?";
}
inline std::ostream& operator<<(std::ostream& os, DType d) { return os << to_string(d); }

// The size in bytes of one element of d.
inline constexpr std::size_t dtype_size(DType d) {
  switch (d) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::u8: return 1;
  }
  return 1;
}

namespace detail {
inline std::uint16_t f32_to_f16_bits(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  std::uint16_t out;
  if (u >= 0x47800000u) {                         // |f| >= 65536, inf or nan
    out = u > 0x7f800000u ? 0x7e00u : 0x7c00u;  // nan stays a (quiet) nan
  } else if (u < 0x38800000u) {                   // below 2^-14: f16 subnormal or zero
    // Adding 0.5 aligns the 10 subnormal mantissa bits at the bottom of the float; the FPU's
    // own round-to-nearest-even does the rounding.
    const float magic = 0.5f;
    const float sum = std::bit_cast<float>(u) + magic;
    out = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(sum) - std::bit_cast<std::uint32_t>(magic));
  } else {
    const std::uint32_t odd = (u >> 13) & 1u;
    u += 0xc8000000u /* rebias exponent by (15 - 127) */ + 0x0fffu + odd;
    out = static_cast<std::uint16_t>(u >> 13);  // a carry into the exponent gives inf, as it should
  }
  return static_cast<std::uint16_t>(out | sign);
}

inline float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float mag = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -mag : mag;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline std::uint16_t f32_to_bf16_bits(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

inline float bf16_bits_to_f32(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}
}  // namespace detail

// IEEE half precision, stored as its bits; arithmetic happens in float.
struct half {
  std::uint16_t bits = 0;
  half() = default;
  explicit half(float f) : bits(detail::f32_to_f16_bits(f)) {}
  explicit half(double d) : half(static_cast<float>(d)) {}
  static half from_bits(std::uint16_t b) { half h; h.bits = b; return h; }
  explicit operator float() const { return detail::f16_bits_to_f32(bits); }
  explicit operator double() const { return static_cast<float>(*this); }
  friend bool operator==(half a, half b) { return static_cast<float>(a) == static_cast<float>(b); }
};

// bfloat16: the top 16 bits of a float, rounded to nearest even.
struct bfloat16 {
  std::uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float f) : bits(detail::f32_to_bf16_bits(f)) {}
  explicit bfloat16(double d) : bfloat16(static_cast<float>(d)) {}
  static bfloat16 from_bits(std::uint16_t b) { bfloat16 h; h.bits = b; return h; }
  explicit operator float() const { return detail::bf16_bits_to_f32(bits); }
  explicit operator double() const { return static_cast<float>(*this); }
  friend bool operator==(bfloat16 a, bfloat16 b) { return static_cast<float>(a) == static_cast<float>(b); }
};

inline std::ostream& operator<<(std::ostream& os, half h) { return os << static_cast<float>(h); }
inline std::ostream& operator<<(std::ostream& os, bfloat16 h) { return os << static_cast<float>(h); }

template <class T> struct dtype_traits;
template <> struct dtype_traits<double> { static constexpr DType dtype = DType::f64; static constexpr bool floating = true; using accum = double; };
template <> struct dtype_traits<float> { static constexpr DType dtype = DType::f32; static constexpr bool floating = true; using accum = float; };
template <> struct dtype_traits<half> { static constexpr DType dtype = DType::f16; static constexpr bool floating = true; using accum = float; };
template <> struct dtype_traits<bfloat16> { static constexpr DType dtype = DType::bf16; static constexpr bool floating = true; using accum = float; };
template <> struct dtype_traits<std::int32_t> { static constexpr DType dtype = DType::i32; static constexpr bool floating = false; using accum = std::int64_t; };
template <> struct dtype_traits<std::int64_t> { static constexpr DType dtype = DType::i64; static constexpr bool floating = false; using accum = std::int64_t; };
template <> struct dtype_traits<std::uint8_t> { static constexpr DType dtype = DType::u8; static constexpr bool floating = false; using accum = std::int64_t; };

template <class T> inline constexpr DType dtype_of = dtype_traits<T>::dtype;

// Element types the CPU backend computes in (f16/bf16 are storage types on the host).
template <class T> concept CpuFloat = std::same_as<T, float> || std::same_as<T, double>;

}  // namespace cutrain::inline CUTRAIN_ABI
