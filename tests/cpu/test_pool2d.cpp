// Pooling: output shapes, hand-computed forward and backward values, gradient checks in both layouts
// (max, average with and without count_include_pad, ceil mode, padding, overlapping windows,
// global average), strided inputs, float against double, and bad input.
#include "gradcheck.hpp"

#include <limits>
#include <numeric>

#include "cutrain/ops/pool2d.hpp"

namespace cutrain_test_pool2d {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

// x[h][w] = 4h + w + 1 on a 1x1x4x4 input: 1..16 in row-major order.
Tensor<double> iota4x4(Layout l = Layout::nchw) {
  std::vector<double> v(16);
  std::iota(v.begin(), v.end(), 1.0);
  return Tensor<double>::from_vector(v, {1, 1, 4, 4}, {.layout = l});
}

// Distinct values in [-1, 1) (a shuffled, scaled 0..n-1), so every max-pool window has a unique
// maximum that a finite-difference step of 1e-6 cannot displace.
Tensor<double> distinct_random(const Shape& s, Rng& rng, Layout l) {
  const auto n = static_cast<std::size_t>(s.numel());
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 2.0 * (static_cast<double>(i) + 0.5) / static_cast<double>(n) - 1.0;
  for (std::size_t i = n; i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
  return Tensor<double>::from_vector(v, s, {.layout = l});
}

void check_pool_grad(const std::string& name, const Shape& s, const Pool2dParams& p, Layout layout, Rng& rng) {
  auto x = p.mode == PoolMode::max ? distinct_random(s, rng, layout) : random(s, rng, layout);
  auto y = ops::pool2d_forward(x, p);
  REQUIRE(y.shape() == pool2d_output_shape(s, p));
  auto r = random(y.shape(), rng, layout);
  auto dx = ops::pool2d_backward(x, y, r, p);
  CHECK(dx.layout() == layout);
  CHECK(y.layout() == layout);
  gradcheck(detail::cat(name, " ", s, " ", p, " ", layout), x, [&] { return ops::pool2d_forward(x, p); }, dx, r);
}

}  // namespace

TEST_CASE("pool2d: output shapes, floor and ceil mode") {
  // floor((5 + 2 - 3) / 2) + 1 = 3
  CHECK(pool2d_output_shape({2, 3, 5, 5}, Pool2dParams::max(3, 2, 1)) == Shape{2, 3, 3, 3});
  // stride 0 means the kernel: floor((7 - 2) / 2) + 1 = 3
  CHECK(pool2d_output_shape({1, 1, 7, 6}, Pool2dParams::max(2)) == Shape{1, 1, 3, 3});
  // ceil mode: ceil((7 - 2) / 2) + 1 = 4; the last window starts at 6 < 7, so it stays
  auto p = Pool2dParams::max(2);
  p.ceil_mode = true;
  CHECK(pool2d_output_shape({1, 1, 7, 6}, p) == Shape{1, 1, 4, 3});
  // ceil mode, H = 3, k2 s2 p1: ceil((3 + 2 - 2) / 2) + 1 = 3, but window 3 would start at padded
  // row 4 >= 3 + 1 (wholly in the bottom padding), so it is dropped: 2, as PyTorch.
  auto q = Pool2dParams::max(2, 2, 1);
  q.ceil_mode = true;
  CHECK(pool2d_output_shape({1, 1, 3, 3}, q) == Shape{1, 1, 2, 2});
  // no padding, stride > kernel: H = 3, k1 s3: ceil(2 / 3) + 1 = 2, window 2 starts at 3 >= 3: 1
  Pool2dParams r{.kernel_h = 1, .kernel_w = 1, .stride_h = 3, .stride_w = 3, .ceil_mode = true};
  CHECK(pool2d_output_shape({1, 1, 3, 3}, r) == Shape{1, 1, 1, 1});
  // asymmetric padding: H: (4 + 1 + 0 - 3) / 1 + 1 = 3; W: (5 + 0 + 1 - 2) / 2 + 1 = 3
  Pool2dParams a{.kernel_h = 3, .kernel_w = 2, .stride_h = 1, .stride_w = 2, .pad_top = 1, .pad_right = 1};
  CHECK(pool2d_output_shape({1, 2, 4, 5}, a) == Shape{1, 2, 3, 3});
  CHECK(detail::cat(PoolMode::average) == "average");
}

TEST_CASE("pool2d: hand-computed max with ties, forward and backward") {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    // windows (2x2, stride 2): {1,5,3,-1} -> 5; {2,0,4,4} -> 4 (tie: the first, row 1 col 2);
    // {0,7,8,1} -> 8; {-2,6,3,5} -> 6
    auto x = Tensor<double>::from_vector({1, 5, 2, 0,  //
                                          3, -1, 4, 4,  //
                                          0, 7, -2, 6,  //
                                          8, 1, 3, 5},
                                         {1, 1, 4, 4}, {.layout = l});
    const auto p = Pool2dParams::max(2);
    auto y = ops::pool2d_forward(x, p);
    require_close(y, {5, 4, 8, 6});
    auto dy = Tensor<double>::from_vector({1, 2, 3, 4}, {1, 1, 2, 2}, {.layout = l});
    require_close(ops::pool2d_backward(x, y, dy, p), {0, 1, 0, 0,  //
                       0, 0, 2, 0,  //
                       0, 0, 0, 4,  //
                       3, 0, 0, 0});
  }
}

TEST_CASE("pool2d: hand-computed k3 s2 p1 on 3x3, max and average") {
  // x = 1..9 in a 3x3 grid. Padded windows start at -1 and 1, so their valid parts are rows/cols
  // {0,1} and {1,2}: sums 1+2+4+5 = 12, 2+3+5+6 = 16, 4+5+7+8 = 24, 5+6+8+9 = 28.
  auto x = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  require_close(ops::pool2d_forward(x, Pool2dParams::max(3, 2, 1)), {5, 6, 8, 9});
  // count_include_pad: every window is 3x3 inside the padded 5x5 input, divisor 9
  require_close(ops::pool2d_forward(x, Pool2dParams::average(3, 2, 1, true)), {12 / 9., 16 / 9., 24 / 9., 28 / 9.});
  // without it: 4 valid elements per window
  require_close(ops::pool2d_forward(x, Pool2dParams::average(3, 2, 1, false)), {3, 4, 6, 7});
  // backward of the exclude-pad average with dy = 1, 2, 3, 4: each output shares dy/4 with its 4
  // inputs; x(1,1) is in all four windows: (1+2+3+4)/4 = 2.5
  auto p = Pool2dParams::average(3, 2, 1, false);
  auto y = ops::pool2d_forward(x, p);
  auto dy = Tensor<double>::from_vector({1, 2, 3, 4}, {1, 1, 2, 2});
  require_close(ops::pool2d_backward(x, y, dy, p), {0.25, 0.75, 0.5,  //
                                                    1.0, 2.5, 1.5,     //
                                                    0.75, 1.75, 1.0});
}

TEST_CASE("pool2d: hand-computed ceil mode on 4x4") {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    auto x = iota4x4(l);  // x[h][w] = 4h + w + 1
    {  // k3 s2, no padding
      // ceil((4 - 3) / 2) + 1 = 2 windows per side: rows/cols {0,1,2} and {2,3} (the window starting
      // at 2 overhangs by one). Sums: 1+2+3+5+6+7+9+10+11 = 54; 3+4+7+8+11+12 = 45; 9+10+11+13+14+15 = 72;
      // 11+12+15+16 = 54. The overhang is not counted even with count_include_pad: 9, 6, 6, 4.
      auto p = Pool2dParams::max(3, 2);
      p.ceil_mode = true;
      require_close(ops::pool2d_forward(x, p), {11, 12, 15, 16});
      auto a = Pool2dParams::average(3, 2);
      a.ceil_mode = true;
      require_close(ops::pool2d_forward(x, a), {54 / 9., 45 / 6., 72 / 6., 54 / 4.});
    }
    {  // k3 s2 p1
      // ceil((4 + 2 - 3) / 2) + 1 = 3 windows per side, starting at -1, 1, 3: valid rows/cols {0,1},
      // {1,2,3}, {3}. Inside the padded input [-1, 5) they span 3, 3 and 2 (the last window's row 5
      // is overhang, not padding). Window sums (x[h][w] = 4h + w + 1):
      //   14 30 12 / 57 99 36 / 27 45 16
      auto a = Pool2dParams::average(3, 2, 1, true);
      a.ceil_mode = true;
      // divisors 9 9 6 / 9 9 6 / 6 6 4
      require_close(ops::pool2d_forward(x, a), {14 / 9., 30 / 9., 2, 57 / 9., 11, 6, 4.5, 7.5, 4});
      a.count_include_pad = false;
      // divisors = valid counts 4 6 2 / 6 9 3 / 2 3 1
      require_close(ops::pool2d_forward(x, a), {3.5, 5, 6, 9.5, 11, 12, 13.5, 15, 16});
      auto m = Pool2dParams::max(3, 2, 1);
      m.ceil_mode = true;
      require_close(ops::pool2d_forward(x, m), {6, 8, 8, 14, 16, 16, 14, 16, 16});
    }
  }
}

TEST_CASE("global_avg_pool: hand-computed forward and backward") {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    // n0: c0 (1+2+3+4)/4 = 2.5, c1 (-1+0+5+8)/4 = 3; n1: c0 (0+0+0+2)/4 = 0.5, c1 (-4-4-4-4)/4 = -4
    auto x = Tensor<double>::from_vector({1, 2, 3, 4, -1, 0, 5, 8, 0, 0, 0, 2, -4, -4, -4, -4}, {2, 2, 2, 2},
                                         {.layout = l});
    auto y = ops::global_avg_pool_forward(x);
    REQUIRE(y.shape() == Shape{2, 2, 1, 1});
    require_close(y, {2.5, 3, 0.5, -4});
    auto dy = Tensor<double>::from_vector({4, -8, 2, 1}, {2, 2, 1, 1});
    auto dx = ops::global_avg_pool_backward(dy, x.shape(), l);
    CHECK(dx.layout() == l);
    require_close(dx, {1, 1, 1, 1, -2, -2, -2, -2, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25});
  }
}

TEST_CASE("pool2d: strided input and float against double") {
  Rng rng(11);
  auto big = random({2, 3, 7, 9}, rng);
  auto x = big.slice(3, 1, 8).slice(2, 0, 6);  // [2,3,6,7], strided
  REQUIRE(x.layout() == Layout::strided);
  auto xc = x.clone();
  for (const auto& p : {Pool2dParams::max(3, 2, 1), Pool2dParams::average(3, 2, 1, false)}) {
    require_close(ops::pool2d_forward(x, p), ops::pool2d_forward(xc, p).to_vector(), 1e-15);
    auto y = ops::pool2d_forward(xc, p);
    auto dy = random(y.shape(), rng);
    require_close(ops::pool2d_backward(x, y, dy, p), ops::pool2d_backward(xc, y, dy, p).to_vector(), 1e-15);
  }
  require_close(ops::global_avg_pool_forward(x), ops::global_avg_pool_forward(xc).to_vector(), 1e-15);

  const auto xv = xc.to_vector();
  auto xf = Tensor<float>::from_vector(std::vector<float>(xv.begin(), xv.end()), xc.shape(), {.layout = Layout::nhwc});
  for (auto p : {Pool2dParams::max(3, 2, 1), Pool2dParams::average(2, 1, 1, true)}) {
    p.ceil_mode = true;
    require_close(ops::pool2d_forward(xf, p), ops::pool2d_forward(xc, p).to_vector(), 1e-6);
    auto yf = ops::pool2d_forward(xf, p);
    auto dyf = Tensor<float>::full(yf.shape(), 0.5f);
    auto dyd = Tensor<double>::full(yf.shape(), 0.5);
    require_close(ops::pool2d_backward(xf, yf, dyf, p),
                  ops::pool2d_backward(xc, ops::pool2d_forward(xc, p), dyd, p).to_vector(), 1e-6);
  }
  require_close(ops::global_avg_pool_forward(xf), ops::global_avg_pool_forward(xc).to_vector(), 1e-6);
}

TEST_CASE("gradcheck: pool2d_backward max, nchw and nhwc") {
  Rng rng(2024);
  Pool2dParams ceil_k3s2{.kernel_h = 3, .kernel_w = 3, .stride_h = 2, .stride_w = 2, .ceil_mode = true};
  Pool2dParams asym{.kernel_h = 3, .kernel_w = 2, .stride_h = 1, .stride_w = 2, .pad_top = 1, .pad_right = 1,
                    .ceil_mode = true};
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    check_pool_grad("max k2", {2, 3, 6, 8}, Pool2dParams::max(2), l, rng);
    check_pool_grad("max k3 s2 p1", {2, 3, 7, 5}, Pool2dParams::max(3, 2, 1), l, rng);
    check_pool_grad("max k3 s2 ceil", {1, 2, 6, 7}, ceil_k3s2, l, rng);
    check_pool_grad("max asymmetric", {1, 3, 5, 6}, asym, l, rng);
  }
}

TEST_CASE("gradcheck: pool2d_backward average, nchw and nhwc") {
  Rng rng(77);
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    for (bool include : {true, false}) {
      check_pool_grad("avg k3 s2 p1", {2, 3, 7, 5}, Pool2dParams::average(3, 2, 1, include), l, rng);
      auto c = Pool2dParams::average(3, 2, 1, include);
      c.ceil_mode = true;
      check_pool_grad("avg k3 s2 p1 ceil", {1, 2, 4, 6}, c, l, rng);
      Pool2dParams asym{.mode = PoolMode::average, .kernel_h = 2, .kernel_w = 3, .stride_h = 3, .stride_w = 1,
                        .pad_bottom = 1, .pad_left = 1, .count_include_pad = include, .ceil_mode = true};
      check_pool_grad("avg asymmetric", {1, 2, 7, 5}, asym, l, rng);
    }
    check_pool_grad("avg k2 s1", {1, 2, 5, 5}, Pool2dParams::average(2, 1), l, rng);
  }
}

TEST_CASE("gradcheck: global_avg_pool_backward, nchw and nhwc") {
  Rng rng(5);
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    for (const Shape& s : {Shape{2, 3, 5, 7}, Shape{1, 4, 3, 1}}) {
      auto x = random(s, rng, l);
      auto y = ops::global_avg_pool_forward(x);
      auto r = random(y.shape(), rng);
      auto dx = ops::global_avg_pool_backward(r, s, l);
      CHECK(dx.layout() == l);
      gradcheck(detail::cat("global_avg_pool ", s, " ", l), x, [&] { return ops::global_avg_pool_forward(x); }, dx, r);
    }
  }
}

TEST_CASE("pool2d: bad input") {
  Rng rng(9);
  auto x = random({1, 2, 4, 4}, rng);
  auto x3 = random({2, 4, 4}, rng);
  auto xz = Tensor<double>::zeros({1, 0, 4, 4});
  const auto p = Pool2dParams::max(2);
  auto y = ops::pool2d_forward(x, p);  // [1,2,2,2]
  auto wrong = random({1, 2, 3, 2}, rng);

  // pool2d_forward
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_forward(Tensor<double>{}, p), InvalidArgument, "pool2d_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_forward(x3, p), InvalidArgument, "pool2d_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_forward(xz, p), InvalidArgument, "pool2d_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_forward(x, Pool2dParams::max(0)), InvalidArgument, "pool2d_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_forward(x, Pool2dParams{.kernel_w = -1}), InvalidArgument, "pool2d_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_forward(x, Pool2dParams::max(2, -1)), InvalidArgument, "pool2d_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_forward(x, Pool2dParams{.pad_left = -1}), InvalidArgument, "pool2d_forward");
  // padding of the whole kernel or more: k2 p2, and asymmetric k3 pad_bottom 3
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_forward(x, Pool2dParams::max(2, 2, 2)), InvalidArgument, "pool2d_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_forward(x, Pool2dParams{.kernel_h = 3, .pad_bottom = 3}), InvalidArgument,
                            "pool2d_forward");
  try {
    (void)ops::pool2d_forward(x, Pool2dParams::max(3, 1, 3));
    FAIL("no exception");
  } catch (const InvalidArgument& e) {
    CHECK(std::string(e.what()).find("smaller than the kernel") != std::string::npos);
  }
  // kernel larger than the padded input: output size 0
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_forward(x, Pool2dParams::average(5)), InvalidArgument, "pool2d_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_forward(x, Pool2dParams{.kernel_h = 2147483647}), InvalidArgument,
                            "pool2d_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_forward(x, Pool2dParams{.mode = static_cast<PoolMode>(7)}), InvalidArgument,
                            "pool2d_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_forward(Tensor<half>::zeros({1, 1, 4, 4}), p), NotImplemented,
                            "pool2d_forward");
  CUTRAIN_REQUIRE_THROWS_OP(pool2d_output_shape({4, 4}, p), InvalidArgument, "pool2d_output_shape");

  // pool2d_backward
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_backward(x, y, wrong, p), InvalidArgument, "pool2d_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_backward(x, wrong, y, p), InvalidArgument, "pool2d_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_backward(x, Tensor<double>{}, y, p), InvalidArgument, "pool2d_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_backward(x3, y, y, p), InvalidArgument, "pool2d_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_backward(x, y, y, Pool2dParams::max(2, 0, 3)), InvalidArgument,
                            "pool2d_backward");
  auto xh = Tensor<half>::zeros({1, 2, 4, 4});
  auto yh = Tensor<half>::zeros({1, 2, 2, 2});
  CUTRAIN_REQUIRE_THROWS_OP(ops::pool2d_backward(xh, yh, yh, p), NotImplemented, "pool2d_backward");

  // global average pooling
  CUTRAIN_REQUIRE_THROWS_OP(ops::global_avg_pool_forward(random({3, 4}, rng)), InvalidArgument,
                            "global_avg_pool_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::global_avg_pool_forward(xz), InvalidArgument, "global_avg_pool_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::global_avg_pool_forward(Tensor<half>::zeros({1, 1, 2, 2})), NotImplemented,
                            "global_avg_pool_forward");
  auto g = ops::global_avg_pool_forward(x);  // [1,2,1,1]
  CUTRAIN_REQUIRE_THROWS_OP(ops::global_avg_pool_backward(g, Shape{1, 2, 4}), InvalidArgument,
                            "global_avg_pool_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::global_avg_pool_backward(g, Shape{1, 3, 4, 4}), InvalidArgument,
                            "global_avg_pool_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::global_avg_pool_backward(g, Shape{1, 2, 0, 4}), InvalidArgument,
                            "global_avg_pool_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::global_avg_pool_backward(g, Shape{1, 2, -4, 4}), InvalidArgument,
                            "global_avg_pool_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::global_avg_pool_backward(g, x.shape(), Layout::strided), InvalidArgument,
                            "global_avg_pool_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::global_avg_pool_backward(Tensor<half>::zeros({1, 2, 1, 1}), x.shape()),
                            NotImplemented, "global_avg_pool_backward");
}

TEST_CASE("max pool: a window holding a NaN gives NaN, the others their max (f64)", "[pool]") {
  Rng rng(77);
  auto x = Tensor<double>::uniform(Shape{2, 3, 7, 6}, rng, -1, 1);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  x.flat(5) = nan;
  x.flat(2 * 42 + 17) = nan;
  x.flat(5 * 42 + 41) = nan;
  for (const auto& p : {Pool2dParams::max(2), Pool2dParams::max(3, 2), Pool2dParams::max(2, 1, 0, 2)}) {
    const auto y = ops::pool2d_forward(x, p);
    const std::int64_t ks = p.kernel_h, st = p.effective_stride_h(), d = p.dilation_h;
    for (std::int64_t pl = 0; pl < 6; ++pl)
      for (std::int64_t i = 0; i < y.dim(2); ++i)
        for (std::int64_t j = 0; j < y.dim(3); ++j) {
          double m = -1e300;
          bool has_nan = false;
          for (std::int64_t a = 0; a < ks; ++a)
            for (std::int64_t b = 0; b < ks; ++b) {
              const double v = x.flat(pl * 42 + (i * st + a * d) * 6 + j * st + b * d);
              has_nan |= std::isnan(v);
              m = std::max(m, v);
            }
          const double got = y.flat((pl * y.dim(2) + i) * y.dim(3) + j);
          INFO("kernel " << ks << " stride " << st << " dilation " << d << " plane " << pl << " at " << i << "," << j);
          if (has_nan) CHECK(std::isnan(got));
          else CHECK(got == m);
        }
  }
}

}  // namespace cutrain_test_pool2d
