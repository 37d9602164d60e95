// FP8 e4m3 on the host (core/fp8.hpp): every code decodes to its value and encodes back; random
// floats round to the nearest code, ties to even, saturating at 448; the calibrators' scales;
// quantize_e4m3's refusal of an engine cuDNN's e4m3 convolutions cannot run.
#include "bad_input.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cutrain/core/fp8.hpp"
#include "cutrain/core/random.hpp"
#include "cutrain/deploy/engine_fp8.hpp"
#include "cutrain/nn.hpp"

namespace cutrain_test_fp8 {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

TEST_CASE("e4m3: codes decode to their values and encode back", "[fp8]") {
  CHECK(float_from_e4m3(0x7e) == 448.0f);
  CHECK(float_from_e4m3(0xfe) == -448.0f);
  CHECK(float_from_e4m3(0x01) == std::ldexp(1.0f, -9));
  CHECK(float_from_e4m3(0x08) == std::ldexp(1.0f, -6));
  CHECK(float_from_e4m3(0x38) == 1.0f);
  CHECK(float_from_e4m3(0x3c) == 1.5f);
  CHECK(std::isnan(float_from_e4m3(0x7f)));
  CHECK(std::isnan(float_from_e4m3(0xff)));
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    INFO("code " << c);
    CHECK(e4m3_from_float(float_from_e4m3(static_cast<std::uint8_t>(c))) == c);
    if (c > 0 && c < 0x7e) CHECK(float_from_e4m3(static_cast<std::uint8_t>(c + 1)) > float_from_e4m3(static_cast<std::uint8_t>(c)));
  }
  CHECK(e4m3_from_float(std::numeric_limits<float>::quiet_NaN()) == 0x7f);
  CHECK(e4m3_from_float(1e30f) == 0x7e);
  CHECK(e4m3_from_float(-std::numeric_limits<float>::infinity()) == 0xfe);
  CHECK(e4m3_from_float(1e-30f) == 0x00);
}

TEST_CASE("e4m3: floats round to the nearest code, ties to even", "[fp8]") {
  std::vector<float> finite;  // the non-negative codes' values, in order
  for (int c = 0; c <= 0x7e; ++c) finite.push_back(float_from_e4m3(static_cast<std::uint8_t>(c)));
  Rng rng(81);
  int ties = 0;
  for (int t = 0; t < 20000; ++t) {
    float f = static_cast<float>(std::ldexp(rng.uniform(), static_cast<int>(rng.uniform() * 20) - 11));
    if (t % 4 == 0) {  // a midpoint between two codes
      const auto c = static_cast<std::size_t>(rng.uniform() * 125);
      f = (finite[c] + finite[c + 1]) / 2;
    }
    if (f >= 448.0f) continue;
    std::size_t best = 0;
    for (std::size_t c = 1; c < finite.size(); ++c) {
      const float d = std::fabs(finite[c] - f), b = std::fabs(finite[best] - f);
      if (d < b || (d == b && c % 2 == 0)) best = c;  // an even code's mantissa is even
    }
    ties += std::fabs(finite[best] - f) == std::fabs(finite[best ^ 1] - f) && best != (best ^ 1);
    INFO(f);
    REQUIRE(e4m3_from_float(f) == best);
    REQUIRE(e4m3_from_float(-f) == (best | 0x80));
  }
  CHECK(ties > 1000);
  CHECK(e4m3_from_float(460.0f) == 0x7e);  // past 448 saturates: e4m3 has no infinity
}

TEST_CASE("e4m3: calibrators' scales", "[fp8]") {
  std::vector<float> v;
  for (int i = 1; i <= 10000; ++i) v.push_back(static_cast<float>(i));
  CHECK(e4m3_scale(v, Calibrator::max) == 10000.0f / 448.0f);
  CHECK(e4m3_scale(v, Calibrator::percentile, 99.0) == 9900.0f / 448.0f);
  CHECK(e4m3_scale(v, Calibrator::percentile, 100.0) == 10000.0f / 448.0f);
  CHECK(e4m3_scale(v, Calibrator::percentile, 0.005) == 1.0f / 448.0f);
  std::vector<float> zeros(5, 0.0f);
  CHECK(e4m3_scale(zeros, Calibrator::max) == 1.0f);
  std::vector<float> nan{1.0f, std::nanf("")}, none;
  run_cases({
      bad<InvalidArgument>("no values", "e4m3_scale", {"no calibration values"},
                           [&] { (void)e4m3_scale(none, Calibrator::max); }),
      bad<InvalidArgument>("a NaN", "e4m3_scale", {"a calibration value is nan"},
                           [&] { (void)e4m3_scale(nan, Calibrator::max); }),
      bad<InvalidArgument>("percentile 0", "e4m3_scale", {"percentile must be in (0, 100], got 0"},
                           [&] { (void)e4m3_scale(v, Calibrator::percentile, 0.0); }),
  });
}

TEST_CASE("quantize_e4m3 refuses an engine cuDNN's e4m3 convolutions cannot run", "[fp8][deploy][bad_input]") {
  Rng rng(82);
  nn::Sequential<float> net{nn::Conv2d<float>({.in = 3, .out = 8, .kernel = 3, .padding = 1}, rng), nn::ReLU{}};
  auto e = deploy::compile<float>(net, Shape{2, 3, 8, 8});
  std::vector<Tensor<float>> batches;
  batches.push_back(Tensor<float>::zeros(Shape{2, 3, 8, 8}));
  run_cases({
      bad<InvalidArgument>("a CPU engine", "deploy::quantize_e4m3",
                           {"a GPU engine in bf16 or f16 with the nhwc layout", "f32 on cpu"},
                           [&] { deploy::quantize_e4m3<float>(e, batches); }),
  });
  CHECK_FALSE(e.quantized());
}

}  // namespace cutrain_test_fp8
