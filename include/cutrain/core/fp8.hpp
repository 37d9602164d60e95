// FP8 e4m3 (the "fn" form NVIDIA's tensor cores take: 4 exponent bits with bias 7, 3 mantissa
// bits, no infinities, NaN = S.1111.111, largest finite 448) on the host, and the calibrators
// that pick a tensor's scale from real data. The GPU's quantize kernel
// (cuda/kernels/quantize.cuh) rounds exactly as e4m3_from_float does; the deploy engine's 8-bit
// mode (docs/deploy.md) stores x / scale in e4m3 and multiplies scale back in after the
// convolution.
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <span>
#include <string_view>
#include <vector>

#include "cutrain/core/error.hpp"

namespace cutrain::inline CUTRAIN_ABI {

inline constexpr float e4m3_max = 448.0f;

// f rounded to the nearest e4m3 value (ties to even), saturated to +-448; NaN stays NaN.
inline std::uint8_t e4m3_from_float(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  if (std::isnan(f)) return sign | 0x7f;
  const float a = std::fabs(f);
  if (a >= e4m3_max) return sign | 0x7e;
  if (a < 0.015625f) {  // below 2^-6: subnormal, in steps of 2^-9 (a * 512 is exact)
    return sign | static_cast<std::uint8_t>(std::nearbyint(a * 512.0f));  // 8 reads as 2^-6, the first normal
  }
  const std::uint32_t b = std::bit_cast<std::uint32_t>(a);
  const std::uint32_t r = b + 0x7ffffu + ((b >> 20) & 1u);  // to 3 mantissa bits, ties to even
  const int e = static_cast<int>(r >> 23) - 127 + 7;
  const auto code = static_cast<std::uint32_t>(e << 3) | ((r >> 20) & 7u);
  return sign | static_cast<std::uint8_t>(std::min<std::uint32_t>(code, 0x7e));
}

inline float float_from_e4m3(std::uint8_t c) {
  const float s = (c & 0x80) ? -1.0f : 1.0f;
  const int e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::nanf("");
  if (e == 0) return s * std::ldexp(static_cast<float>(m), -9);
  return s * std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
}

// How a calibrator turns the absolute values a tensor took on calibration data into its range:
// max, the largest (nothing clips); percentile, the value below which `percentile` percent of
// them lie (outliers clip to it, the rest keep more precision).
enum class Calibrator { max, percentile };

inline std::string_view to_string(Calibrator c) { return c == Calibrator::max ? "max" : "percentile"; }
inline std::ostream& operator<<(std::ostream& os, Calibrator c) { return os << to_string(c); }

// The scale that maps the calibrated range onto e4m3's: range / 448 (1 for an all-zero range).
// abs_values: |x| over the calibration data (reordered).
inline float e4m3_scale(std::span<float> abs_values, Calibrator c, double percentile = 99.99) {
  constexpr std::string_view op = "e4m3_scale";
  CUTRAIN_REQUIRE(!abs_values.empty(), InvalidArgument, op, "no calibration values");
  CUTRAIN_REQUIRE(c == Calibrator::max || (percentile > 0 && percentile <= 100), InvalidArgument, op,
                  "percentile must be in (0, 100], got ", percentile);
  for (const float v : abs_values)
    CUTRAIN_REQUIRE(std::isfinite(v) && v >= 0, InvalidArgument, op, "a calibration value is ", v,
                    " (the model's activations hold a NaN, an infinity or a negative |x|)");
  float range = 0;
  if (c == Calibrator::max || percentile == 100) {
    range = *std::max_element(abs_values.begin(), abs_values.end());
  } else {
    const auto n = static_cast<double>(abs_values.size());  // the ceil(p n)-th smallest
    const auto k = static_cast<std::size_t>(std::clamp(std::ceil(percentile / 100.0 * n) - 1, 0.0, n - 1));
    std::nth_element(abs_values.begin(), abs_values.begin() + static_cast<std::ptrdiff_t>(k), abs_values.end());
    range = abs_values[k];
  }
  return range > 0 ? range / e4m3_max : 1.0f;
}

}  // namespace cutrain::inline CUTRAIN_ABI
