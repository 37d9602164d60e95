// Pooling with dilation and with padding up to kernel - 1: a direct reference over the padded
// input, gradient checks in f64 (max and average, count_include_pad on and off, ceil mode, NCHW
// and NHWC), and the errors for dilation < 1, padding >= kernel and windows wholly in padding.
#include "gradcheck.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cutrain/ops/pool2d.hpp"

namespace cutrain_test_pool2d_dilation {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {
// Distinct values in [-1, 1), so that max windows have a unique maximum.
Tensor<double> distinct_random(const Shape& s, Rng& rng, Layout l) {
  const auto n = static_cast<std::size_t>(s.numel());
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 2.0 * (static_cast<double>(i) + 0.5) / static_cast<double>(n) - 1.0;
  for (std::size_t i = n; i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
  return Tensor<double>::from_vector(v, s, {.layout = l});
}

// y by its definition: taps (i s - pad + a d, j s - pad + b d); padding is -inf for max, 0 for
// average; the average divides by the taps inside the padded input (count_include_pad) or the
// input.
std::vector<double> reference(const Tensor<double>& x, const Pool2dParams& p) {
  const Shape ys = pool2d_output_shape(x.shape(), p);
  const std::int64_t H = x.dim(2), W = x.dim(3);
  std::vector<double> y;
  for (std::int64_t n = 0; n < ys[0]; ++n)
    for (std::int64_t c = 0; c < ys[1]; ++c)
      for (std::int64_t i = 0; i < ys[2]; ++i)
        for (std::int64_t j = 0; j < ys[3]; ++j) {
          double best = -std::numeric_limits<double>::infinity(), sum = 0;
          std::int64_t inside = 0, padded = 0;
          for (std::int64_t a = 0; a < p.kernel_h; ++a)
            for (std::int64_t b = 0; b < p.kernel_w; ++b) {
              const std::int64_t r = i * p.effective_stride_h() - p.pad_top + a * p.dilation_h;
              const std::int64_t q = j * p.effective_stride_w() - p.pad_left + b * p.dilation_w;
              if (r < H + p.pad_bottom && q < W + p.pad_right) ++padded;
              if (r < 0 || r >= H || q < 0 || q >= W) continue;
              ++inside;
              best = std::max(best, x(n, c, r, q));
              sum += x(n, c, r, q);
            }
          REQUIRE(inside > 0);
          y.push_back(p.mode == PoolMode::max ? best
                                              : sum / static_cast<double>(p.count_include_pad ? padded : inside));
        }
  return y;
}

void check_pool(const std::string& name, const Shape& s, const Pool2dParams& p, Layout l, Rng& rng) {
  auto x = p.mode == PoolMode::max ? distinct_random(s, rng, l) : random(s, rng, l);
  auto y = ops::pool2d_forward(x, p);
  INFO(name << " " << s << " " << p << " " << l);
  REQUIRE(y.shape() == pool2d_output_shape(s, p));
  require_close(y, reference(x, p), 1e-12);
  auto r = random(y.shape(), rng, l);
  auto dx = ops::pool2d_backward(x, y, r, p);
  CHECK(dx.layout() == l);
  gradcheck(detail::cat(name, " ", s, " ", p, " ", l), x, [&] { return ops::pool2d_forward(x, p); }, dx, r);
}

Pool2dParams with(Pool2dParams p, int dh, int dw) {
  p.dilation_h = dh;
  p.dilation_w = dw;
  return p;
}
}  // namespace

TEST_CASE("pool2d dilation: output shape uses the dilated extent") {
  // 7 wide, kernel 3 dilation 2: extent 5, stride 1 -> 3 outputs; pad 2 -> 7
  CHECK(pool2d_output_shape({1, 1, 7, 7}, with(Pool2dParams::max(3, 1), 2, 2)) == Shape{1, 1, 3, 3});
  CHECK(pool2d_output_shape({1, 1, 7, 7}, Pool2dParams::max(3, 1, 2, 2)) == Shape{1, 1, 7, 7});
  CHECK(pool2d_output_shape({1, 1, 8, 6}, with(Pool2dParams::max(2, 2, 1), 3, 1)) == Shape{1, 1, 4, 4});  // (10 - 4) / 2 + 1, (8 - 2) / 2 + 1
}

TEST_CASE("gradcheck: pool2d with dilation 2 and padding kernel - 1, max and average") {
  Rng rng(3030);
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    check_pool("max k3 s1 p2 d2", {2, 3, 7, 8}, Pool2dParams::max(3, 1, 2, 2), l, rng);
    check_pool("max k2 s2 p1 d2", {1, 2, 6, 7}, Pool2dParams::max(2, 2, 1, 2), l, rng);
    check_pool("max k3 s2 p2 d1", {2, 2, 7, 6}, Pool2dParams::max(3, 2, 2), l, rng);  // padding = kernel - 1
    check_pool("max k2 s1 p1 d1", {1, 2, 5, 5}, Pool2dParams::max(2, 1, 1), l, rng);
    Pool2dParams asym{.kernel_h = 3, .kernel_w = 2, .stride_h = 2, .stride_w = 1, .pad_top = 2, .pad_bottom = 1,
                      .pad_left = 1, .pad_right = 0, .ceil_mode = true, .dilation_h = 2, .dilation_w = 3};
    check_pool("max asymmetric dilated ceil", {1, 2, 9, 8}, asym, l, rng);
    for (bool include : {true, false}) {
      const std::string tag = include ? " count_include_pad" : " exclude_pad";
      check_pool("avg k3 s1 p2 d2" + tag, {2, 2, 7, 6}, with(Pool2dParams::average(3, 1, 2, include), 2, 2), l, rng);
      check_pool("avg k3 s2 p2 d1" + tag, {1, 3, 7, 7}, Pool2dParams::average(3, 2, 2, include), l, rng);
      Pool2dParams a = asym;
      a.mode = PoolMode::average;
      a.count_include_pad = include;
      check_pool("avg asymmetric dilated ceil" + tag, {1, 2, 9, 8}, a, l, rng);
    }
  }
}

TEST_CASE("pool2d dilation: hand-computed k2 d2 s1 on 1x1x3x3") {
  // x = 1..9 row-major. Padding 0: one window, taps (0,0) (0,2) (2,0) (2,2) = 1 3 7 9.
  std::vector<double> v(9);
  for (int i = 0; i < 9; ++i) v[static_cast<std::size_t>(i)] = i + 1;
  auto x = Tensor<double>::from_vector(v, {1, 1, 3, 3});
  require_close(ops::pool2d_forward(x, Pool2dParams::max(2, 1, 0, 2)), {9});
  require_close(ops::pool2d_forward(x, with(Pool2dParams::average(2, 1), 2, 2)), {5});
  // Padding 1: 3x3 outputs, output (i, j) taps rows {i - 1, i + 1} and columns {j - 1, j + 1}.
  require_close(ops::pool2d_forward(x, Pool2dParams::max(2, 1, 1, 2)), {5, 6, 5, 8, 9, 8, 5, 6, 5});
  // count_include_pad: every tap lies in the padded [-1, 4): divide by 4; excluded: by the real ones
  require_close(ops::pool2d_forward(x, with(Pool2dParams::average(2, 1, 1, true), 2, 2)),
                {5.0 / 4, 10.0 / 4, 5.0 / 4, 10.0 / 4, 20.0 / 4, 10.0 / 4, 5.0 / 4, 10.0 / 4, 5.0 / 4});
  require_close(ops::pool2d_forward(x, with(Pool2dParams::average(2, 1, 1, false), 2, 2)),
                {5, 5, 5, 5, 5, 5, 5, 5, 5});
}

TEST_CASE("pool2d dilation and padding: bad parameters name the op, the shapes and the reason") {
  auto x = Tensor<double>::zeros({1, 2, 5, 5});
  auto expect = [&](const Pool2dParams& p, const std::vector<std::string>& needles) {
    try {
      (void)ops::pool2d_forward(x, p);
      FAIL("no throw for " << p);
    } catch (const InvalidArgument& e) {
      const std::string w = e.what();
      for (const auto& n : needles) {
        INFO("want " << n << " in " << w);
        CHECK(w.find(n) != std::string::npos);
      }
    }
  };
  expect(with(Pool2dParams::max(2), 0, 1), {"pool2d_forward", "dilation must be at least 1", "0x1", "[1,2,5,5]"});
  expect(with(Pool2dParams::max(2), 2, -1), {"pool2d_forward", "dilation", "2x-1"});
  expect(Pool2dParams::max(2, 1, 2), {"pool2d_forward", "smaller than the kernel", "pad_top 2", "kernel_h 2", "[1,2,5,5]"});
  expect(Pool2dParams{.kernel_w = 3, .pad_right = 3}, {"pool2d_forward", "smaller than the kernel", "pad_right 3"});
  // k2 d4 p1 stride 1 on 5: output row 0's taps are rows -1 and 3 (fine); in 2 rows of input,
  // row 0's taps -1 and 3 both miss [0, 2): a window with no input element.
  auto x2 = Tensor<double>::zeros({1, 1, 2, 5});
  try {
    (void)ops::pool2d_forward(x2, Pool2dParams{.kernel_h = 2, .kernel_w = 1, .stride_h = 1, .stride_w = 1,
                                               .pad_top = 1, .pad_bottom = 1, .dilation_h = 4});
  } catch (const InvalidArgument&) {
    // the kernel's extent (5) exceeds the padded input (4): no output at all
  }
  auto x3 = Tensor<double>::zeros({1, 1, 2, 5});
  try {
    (void)ops::pool2d_forward(x3, Pool2dParams{.kernel_h = 2, .kernel_w = 1, .stride_h = 1, .stride_w = 1,
                                               .pad_top = 1, .pad_bottom = 1, .dilation_h = 3});
    FAIL("no throw for an all-padding window");
  } catch (const InvalidArgument& e) {
    // extent 4 on a padded 4: one output row, taps -1 and 2, both outside [0, 2)
    const std::string w = e.what();
    CHECK(w.find("pool2d_forward") != std::string::npos);
    CHECK(w.find("output row 0") != std::string::npos);
    CHECK(w.find("all lie in the padding") != std::string::npos);
    CHECK(w.find("[1,1,2,5]") != std::string::npos);
  }
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_backward(x, x, x, with(Pool2dParams::max(2), 1, 0)), InvalidArgument,
                            "pool2d_backward");
}

TEST_CASE("pool2d: the empty-window check equals a walk over the windows, and does not walk 2^36 rows",
          "[pool2d][dilation]") {
  const auto walk = [](std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t dilation,
                       std::int64_t stride, std::int64_t pad) -> std::int64_t {
    for (std::int64_t i = 0; i < out; ++i) {
      bool hit = false;
      for (std::int64_t k = 0; k < kernel; ++k) {
        const std::int64_t t = i * stride - pad + k * dilation;
        hit = hit || (t >= 0 && t < in);
      }
      if (!hit) return i;
    }
    return -1;
  };
  int compared = 0;
  for (std::int64_t in = 1; in <= 12; ++in)
    for (std::int64_t kernel = 1; kernel <= 4; ++kernel)
      for (std::int64_t dilation = 2; dilation <= 5; ++dilation)
        for (std::int64_t stride = 1; stride <= 4; ++stride)
          for (std::int64_t pad = 0; pad < kernel; ++pad)
            for (const bool ceil : {false, true}) {
              const std::int64_t span = (kernel - 1) * dilation + 1;
              const std::int64_t out = cutrain::detail::pool_out_size(in, span, stride, pad, pad, ceil);
              if (out <= 0) continue;
              INFO("in " << in << " kernel " << kernel << " dilation " << dilation << " stride " << stride << " pad "
                         << pad << " ceil " << ceil);
              CHECK(cutrain::detail::pool_empty_window(in, out, kernel, dilation, stride, pad) ==
                    walk(in, out, kernel, dilation, stride, pad));
              ++compared;
            }
  CHECK(compared > 1000);
  // An expanded input of 2^36 rows, dilation 2: the shape is checked at once (no walk of minutes).
  const Shape big{1, 1, std::int64_t{1} << 36, 4};
  const Pool2dParams p{.kernel_h = 2, .kernel_w = 2, .stride_h = 1, .stride_w = 1, .dilation_h = 2};
  CHECK(pool2d_output_shape(big, p) == Shape{1, 1, (std::int64_t{1} << 36) - 2, 3});
  CHECK(cutrain::detail::pool_out_size(std::numeric_limits<std::int64_t>::max(), 3, 1, 2, 2, false) ==
        std::numeric_limits<std::int64_t>::max());
  // global_avg_pool_backward's dx of 2^80 elements: its size error, before any arithmetic wraps.
  try {
    (void)ops::global_avg_pool_backward(Tensor<double>::zeros({1, 1, 1, 1}), Shape{1, 1, std::int64_t{1} << 40, std::int64_t{1} << 40});
    FAIL("no throw for a dx of 2^80 elements");
  } catch (const InvalidArgument& e) {
    const std::string w = e.what();
    CHECK(w.find("global_avg_pool_backward") != std::string::npos);
    CHECK(w.find("too large") != std::string::npos);
  }
}

}  // namespace cutrain_test_pool2d_dilation
