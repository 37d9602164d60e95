// f16 and bf16 host conversions against known bit patterns (round to nearest even).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "cutrain/core/dtype.hpp"

namespace cutrain_test_dtype {  // one per file: the unity build compiles files together

using cutrain::bfloat16;
using cutrain::half;

TEST_CASE("dtype: f16 from f32 rounds to nearest even, known bit patterns") {
  CHECK(half(1.0f).bits == 0x3c00);
  CHECK(half(-2.0f).bits == 0xc000);
  CHECK(half(0.0f).bits == 0x0000);
  CHECK(half(-0.0f).bits == 0x8000);
  CHECK(half(65504.0f).bits == 0x7bff);                    // largest finite
  CHECK(half(65519.0f).bits == 0x7bff);                    // rounds down
  CHECK(half(65520.0f).bits == 0x7c00);                    // tie rounds to even: inf
  CHECK(half(1e10f).bits == 0x7c00);
  CHECK(half(std::numeric_limits<float>::infinity()).bits == 0x7c00);
  CHECK(half(-std::numeric_limits<float>::infinity()).bits == 0xfc00);
  CHECK((half(std::nanf("")).bits & 0x7c00) == 0x7c00);
  CHECK((half(std::nanf("")).bits & 0x03ff) != 0);
  CHECK(half(0.1f).bits == 0x2e66);
  CHECK(half(std::ldexp(1.0f, -14)).bits == 0x0400);       // smallest normal
  CHECK(half(std::ldexp(1.0f, -24)).bits == 0x0001);       // smallest subnormal
  CHECK(half(std::ldexp(1.0f, -25)).bits == 0x0000);       // tie between 0 and 2^-24: even is 0
  CHECK(half(std::ldexp(3.0f, -25)).bits == 0x0002);       // tie between 1 and 2 ulps: even is 2
  CHECK(half(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);      // tie: down to even
  CHECK(half(1.0f + 3 * std::ldexp(1.0f, -11)).bits == 0x3c02);  // tie: up to even
  CHECK(half(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)).bits == 0x3c01);  // above tie
}

TEST_CASE("dtype: f16 to f32 is exact") {
  CHECK(static_cast<float>(half::from_bits(0x3c00)) == 1.0f);
  CHECK(static_cast<float>(half::from_bits(0x7bff)) == 65504.0f);
  CHECK(static_cast<float>(half::from_bits(0x0001)) == std::ldexp(1.0f, -24));
  CHECK(static_cast<float>(half::from_bits(0x83ff)) == -std::ldexp(1023.0f, -24));
  CHECK(std::isinf(static_cast<float>(half::from_bits(0x7c00))));
  CHECK(std::isnan(static_cast<float>(half::from_bits(0x7e00))));
  for (unsigned b = 0; b < 0x7c00; ++b) {  // every finite positive half survives the round trip
    const half h = half::from_bits(static_cast<std::uint16_t>(b));
    REQUIRE(half(static_cast<float>(h)).bits == b);
  }
}

TEST_CASE("dtype: bf16 from f32 rounds to nearest even, known bit patterns") {
  CHECK(bfloat16(1.0f).bits == 0x3f80);
  CHECK(bfloat16(-1.0f).bits == 0xbf80);
  CHECK(bfloat16(3.140625f).bits == 0x4049);
  CHECK(bfloat16(0.1f).bits == 0x3dcd);
  CHECK(bfloat16(1.0f + std::ldexp(1.0f, -8)).bits == 0x3f80);      // tie: down to even
  CHECK(bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits == 0x3f82);  // tie: up to even
  CHECK(bfloat16(std::numeric_limits<float>::max()).bits == 0x7f80);  // rounds to inf
  CHECK(bfloat16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
  CHECK(std::isnan(static_cast<float>(bfloat16(std::nanf("")))));
  CHECK(static_cast<float>(bfloat16::from_bits(0x4049)) == 3.140625f);
}

}  // namespace cutrain_test_dtype
