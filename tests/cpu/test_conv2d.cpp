// conv2d: hand-computed forward values, gradient checks of the three backward functions over
// a table of geometries in both layouts, float against double, strided inputs, and bad input.
#include "direct_conv.hpp"
#include "gradcheck.hpp"

#include <limits>

#include "cutrain/ops/conv2d.hpp"

namespace cutrain_test_conv2d {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

struct ConvCase {
  const char* name;
  Shape x, w;
  Conv2dParams p;
};

// Every geometry the gradient checks cover; each runs in nchw and in nhwc.
const ConvCase conv_cases[] = {
    {"odd 7x5 input, 3x3 pad 1", {2, 3, 7, 5}, {4, 3, 3, 3}, Conv2dParams::make(1, 1)},
    {"stride 2", {2, 3, 7, 6}, {4, 3, 3, 3}, Conv2dParams::make(2, 1)},
    {"asymmetric padding t1 b0 l2 r1", {2, 2, 5, 6}, {3, 2, 3, 2},
     {.pad_top = 1, .pad_bottom = 0, .pad_left = 2, .pad_right = 1}},
    {"dilation 2", {2, 2, 7, 7}, {3, 2, 3, 3}, Conv2dParams::make(1, 2, 2)},
    {"groups 2", {2, 4, 5, 5}, {6, 2, 3, 3}, Conv2dParams::make(1, 1, 1, 2)},
    {"depthwise", {2, 3, 6, 5}, {3, 1, 3, 3}, Conv2dParams::make(1, 1, 1, 3)},
    {"batch 1", {1, 3, 4, 4}, {2, 3, 2, 2}, Conv2dParams::make(1, 0)},
    {"1x1 kernel", {2, 3, 4, 5}, {5, 3, 1, 1}, Conv2dParams::make(1, 0)},
    {"1x1 kernel, stride 2, pad 1", {2, 3, 5, 5}, {4, 3, 1, 1}, Conv2dParams::make(2, 1)},
    {"stride 2x3, dilation 1x2, uneven padding", {2, 2, 9, 8}, {2, 2, 2, 3},
     {.stride_h = 2, .stride_w = 3, .pad_top = 0, .pad_bottom = 2, .pad_left = 1, .pad_right = 0, .dilation_h = 1,
      .dilation_w = 2}},
    {"stride 3 skips pixels, one channel", {2, 1, 8, 8}, {2, 1, 2, 2}, Conv2dParams::make(3, 0)},
    {"kernel as large as the padded input", {1, 2, 3, 3}, {2, 2, 5, 5}, Conv2dParams::make(1, 1)},
    {"groups 2 with 4 outputs per group, stride 2", {1, 6, 6, 7}, {8, 3, 3, 3}, Conv2dParams::make(2, 1, 1, 2)},
};

// The layout a fresh tensor of this shape reports (a one-channel nhwc tensor also reads as nchw).
Layout reported(const Shape& s, Layout l) { return Tensor<double>(s, {.layout = l}).layout(); }

template <class To, class From>
Tensor<To> cast(const Tensor<From>& t, Layout l) {
  const auto v = t.to_vector();
  return Tensor<To>::from_vector(std::vector<To>(v.begin(), v.end()), t.shape(), {.layout = l});
}

// Random data for one case: x, w and r (the projection of y) in `layout`, bias row-major.
struct ConvData {
  Tensor<double> x, w, b, r;
  ConvData(const ConvCase& c, Layout layout, std::uint64_t seed) {
    Rng rng(seed);
    x = random(c.x, rng, layout);
    w = random(c.w, rng, layout);
    b = random({c.w[0]}, rng);
    r = random(conv2d_output_shape(c.x, c.w, c.p), rng, layout);
  }
};


}  // namespace

TEST_CASE("conv2d_forward: hand-computed 1x1x3x3 input, 2x2 kernel") {
  // x = [[1 2 3] [4 5 6] [7 8 9]], w = [[1 2] [3 4]]
  auto x = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  auto w = Tensor<double>::from_vector({1, 2, 3, 4}, {1, 1, 2, 2});
  // y00 = 1*1 + 2*2 + 3*4 + 4*5 = 37, y01 = 1*2 + 2*3 + 3*5 + 4*6 = 47,
  // y10 = 1*4 + 2*5 + 3*7 + 4*8 = 67, y11 = 1*5 + 2*6 + 3*8 + 4*9 = 77
  auto y = ops::conv2d_forward(x, w, Conv2dParams::make(1, 0));
  CHECK(y.shape() == Shape{1, 1, 2, 2});
  require_close(y, {37, 47, 67, 77});
  // with bias 0.5 every output moves by 0.5
  auto b = Tensor<double>::from_vector({0.5}, {1});
  require_close(ops::conv2d_forward(x, w, b, Conv2dParams::make(1, 0)), {37.5, 47.5, 67.5, 77.5});
}

TEST_CASE("conv2d_forward: hand-computed stride 2 with padding 1") {
  auto x = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  auto w = Tensor<double>::from_vector({1, 2, 3, 4}, {1, 1, 2, 2});
  // Padded input is 5x5, Ho = Wo = (5 - 2) / 2 + 1 = 2; output (oh, ow) reads rows 2oh-1.., cols 2ow-1..
  // y00 = 4*x00 = 4; y01 = 3*x01 + 4*x02 = 6 + 12 = 18; y10 = 2*x10 + 4*x20 = 8 + 28 = 36;
  // y11 = 1*5 + 2*6 + 3*8 + 4*9 = 77
  auto y = ops::conv2d_forward(x, w, Conv2dParams::make(2, 1));
  CHECK(y.shape() == Shape{1, 1, 2, 2});
  require_close(y, {4, 18, 36, 77});
}

TEST_CASE("conv2d_forward: hand-computed asymmetric padding, both layouts") {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    auto x = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3}, {.layout = l});
    auto w = Tensor<double>::from_vector({1, 2, 3, 4}, {1, 1, 2, 2}, {.layout = l});
    // pad top 1, right 1: padded 4x4, output 3x3; y[oh][ow] reads rows oh-1, oh and cols ow, ow+1.
    // row 0: 3*1+4*2 = 11, 3*2+4*3 = 18, 3*3 = 9
    // row 1: 37, 47, 1*3 + 3*6 = 21;  row 2: 67, 77, 1*6 + 3*9 = 33
    auto y = ops::conv2d_forward(x, w, {.pad_top = 1, .pad_right = 1});
    CHECK(y.shape() == Shape{1, 1, 3, 3});
    require_close(y, {11, 18, 9, 37, 47, 21, 67, 77, 33});
  }
}

TEST_CASE("conv2d_forward: hand-computed grouped convolutions") {
  // 2x2 kernels, groups 2: channel 0 = [[1 2] [3 4]] meets k0 = [[1 0] [0 1]] -> 1 + 4 = 5,
  // channel 1 = [[5 6] [7 8]] meets k1 = all ones -> 26; bias [0.5, -1] -> [5.5, 25]
  {
    auto x = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6, 7, 8}, {1, 2, 2, 2});
    auto w = Tensor<double>::from_vector({1, 0, 0, 1, 1, 1, 1, 1}, {2, 1, 2, 2});
    auto b = Tensor<double>::from_vector({0.5, -1}, {2});
    require_close(ops::conv2d_forward(x, w, b, Conv2dParams::make(1, 0, 1, 2)), {5.5, 25});
  }
  // 1x1 kernels, 4 channels, groups 2: c0 = [1 2], c1 = [3 4], c2 = [5 6], c3 = [7 8]
  // k0 = c0 + 10 c1 = [31 42], k1 = 2 c0 - c1 = [-1 0], k2 = c2 + c3 = [12 14], k3 = 3 c3 = [21 24]
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    auto x = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6, 7, 8}, {1, 4, 1, 2}, {.layout = l});
    auto w = Tensor<double>::from_vector({1, 10, 2, -1, 1, 1, 0, 3}, {4, 2, 1, 1}, {.layout = l});
    auto y = ops::conv2d_forward(x, w, Conv2dParams::make(1, 0, 1, 2));
    CHECK(y.layout() == l);
    require_close(y, {31, 42, -1, 0, 12, 14, 21, 24});
  }
}

TEST_CASE("conv2d_backward_bias: hand-computed sums") {
  // dy [2, 2, 1, 2] = 1..8: k0 sums 1 + 2 + 5 + 6 = 14, k1 sums 3 + 4 + 7 + 8 = 22
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    auto dy = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 1, 2}, {.layout = l});
    auto db = ops::conv2d_backward_bias(dy);
    CHECK(db.shape() == Shape{2});
    require_close(db, {14, 22});
  }
}

TEST_CASE("conv2d_forward: matches the direct sum on every case, both layouts") {
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    std::uint64_t seed = 400;
    for (const auto& c : conv_cases) {
      INFO(c.name << " " << layout);
      ConvData d(c, layout, seed++);
      auto y = ops::conv2d_forward(d.x, d.w, d.b, c.p);
      CHECK(y.layout() == reported(y.shape(), reported(c.x, layout)));
      require_close(y, direct_conv(d.x, d.w, d.b, c.p), 1e-12);
    }
  }
}

TEST_CASE("gradcheck: conv2d_backward_data") {
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    std::uint64_t seed = 100;
    for (const auto& c : conv_cases) {
      ConvData d(c, layout, seed++);
      auto dx = ops::conv2d_backward_data(d.r, d.w, d.x.shape(), c.p);
      CHECK(dx.shape() == c.x);
      // dx follows dy, which reads as nchw when its sizes make the layouts agree (e.g. 1x1 outputs)
      CHECK(dx.layout() == reported(c.x, d.r.layout() == Layout::nhwc ? Layout::nhwc : Layout::nchw));
      gradcheck(detail::cat("conv2d dx ", c.name, " ", layout), d.x,
                [&] { return ops::conv2d_forward(d.x, d.w, d.b, c.p); }, dx, d.r);
    }
  }
}

TEST_CASE("gradcheck: conv2d_backward_filter") {
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    std::uint64_t seed = 200;
    for (const auto& c : conv_cases) {
      ConvData d(c, layout, seed++);
      auto dw = ops::conv2d_backward_filter(d.r, d.x, d.w.shape(), c.p);
      CHECK(dw.shape() == c.w);
      CHECK(dw.layout() == reported(c.w, reported(c.x, layout)));
      gradcheck(detail::cat("conv2d dw ", c.name, " ", layout), d.w,
                [&] { return ops::conv2d_forward(d.x, d.w, d.b, c.p); }, dw, d.r);
    }
  }
}

TEST_CASE("gradcheck: conv2d_backward_bias") {
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    std::uint64_t seed = 300;
    for (const auto& c : conv_cases) {
      ConvData d(c, layout, seed++);
      auto db = ops::conv2d_backward_bias(d.r);
      CHECK(db.shape() == Shape{c.w[0]});
      gradcheck(detail::cat("conv2d db ", c.name, " ", layout), d.b,
                [&] { return ops::conv2d_forward(d.x, d.w, d.b, c.p); }, db, d.r);
    }
  }
}

TEST_CASE("conv2d: float matches double on a ResNet-like shape, both layouts") {
  const Shape xs{2, 8, 9, 9}, ws{16, 8, 3, 3};
  const auto p = Conv2dParams::make(1, 1);
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    Rng rng(11);
    auto x = random(xs, rng, l), w = random(ws, rng, l), b = random({16}, rng);
    auto dy = random(conv2d_output_shape(xs, ws, p), rng, l);
    auto xf = cast<float>(x, l), wf = cast<float>(w, l), bf = cast<float>(b, Layout::row_major),
         dyf = cast<float>(dy, l);
    // Each output sums 72 products of values in [-1, 1): float keeps ~1e-5 of that.
    auto close = [](const auto& got, const Tensor<double>& want, double tol) {
      require_close(got, want.to_vector(), tol);
    };
    auto yf = ops::conv2d_forward(xf, wf, bf, p);
    CHECK(yf.layout() == l);
    close(yf, ops::conv2d_forward(x, w, b, p), 1e-4);
    close(ops::conv2d_backward_data(dyf, wf, xs, p), ops::conv2d_backward_data(dy, w, xs, p), 1e-4);
    close(ops::conv2d_backward_filter(dyf, xf, ws, p), ops::conv2d_backward_filter(dy, x, ws, p), 1e-3);
    close(ops::conv2d_backward_bias(dyf), ops::conv2d_backward_bias(dy), 1e-4);
  }
}

TEST_CASE("conv2d: strided (sliced) inputs give the same results as contiguous copies") {
  Rng rng(5);
  const auto p = Conv2dParams::make(2, 1, 1, 2);
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    // channel and width slices make x, w and dy strided views
    auto xb = random({2, 6, 7, 9}, rng, l), wb = random({6, 2, 3, 4}, rng, l);
    auto x = xb.slice(1, 1, 5).slice(3, 1, 8), w = wb.slice(0, 1, 5).slice(3, 0, 3);
    auto dyb = random({2, 5, 4, 4}, rng, l);
    auto dy = dyb.slice(1, 0, 4);
    REQUIRE(x.layout() == Layout::strided);
    REQUIRE(dy.shape() == conv2d_output_shape(x.shape(), w.shape(), p));
    auto xc = x.clone(Layout::nchw), wc = w.clone(Layout::nchw), dyc = dy.clone(Layout::nchw);
    require_close(ops::conv2d_forward(x, w, p), ops::conv2d_forward(xc, wc, p).to_vector(), 1e-12);
    require_close(ops::conv2d_backward_data(dy, w, x.shape(), p),
                  ops::conv2d_backward_data(dyc, wc, x.shape(), p).to_vector(), 1e-12);
    require_close(ops::conv2d_backward_filter(dy, x, w.shape(), p),
                  ops::conv2d_backward_filter(dyc, xc, w.shape(), p).to_vector(), 1e-12);
    require_close(ops::conv2d_backward_bias(dy), ops::conv2d_backward_bias(dyc).to_vector(), 1e-12);
  }
}

TEST_CASE("conv2d_forward: bad input") {
  constexpr const char* op = "conv2d_forward";
  Rng rng(7);
  auto x = random({2, 4, 5, 5}, rng);
  auto w = random({6, 4, 3, 3}, rng);
  auto b = random({6}, rng);
  const auto p = Conv2dParams::make(1, 1);
  auto with = [&](auto edit) { Conv2dParams q = p; edit(q); return q; };
  // ranks and undefined tensors
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(random({4, 5, 5}, rng), w, p), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(x, random({6, 4, 3}, rng), p), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(Tensor<double>{}, w, p), InvalidArgument, op);
  // channels: C != w.dim(1) * groups, K % groups, C % groups
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(x, random({6, 3, 3, 3}, rng), p), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(x, random({5, 2, 3, 3}, rng), with([](auto& q) { q.groups = 2; })),
                            InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(x, random({3, 1, 3, 3}, rng), with([](auto& q) { q.groups = 3; })),
                            InvalidArgument, op);
  // parameters
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(x, w, with([](auto& q) { q.stride_h = 0; })), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(x, w, with([](auto& q) { q.stride_w = -2; })), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(x, w, with([](auto& q) { q.dilation_w = 0; })), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(x, w, with([](auto& q) { q.pad_left = -1; })), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(x, w, with([](auto& q) { q.groups = 0; })), InvalidArgument, op);
  // dilated kernel larger than the padded input: 3x3 dilated by 4 spans 9 > 5 + 2
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(x, w, Conv2dParams::make(1, 1, 4)), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(x, random({6, 4, 8, 3}, rng), p), InvalidArgument, op);
  // zero-size dimensions
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(Tensor<double>({0, 4, 5, 5}), w, p), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(x, Tensor<double>({6, 4, 0, 3}), p), InvalidArgument, op);
  // bias must be [K]
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(x, w, random({5}, rng), p), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(x, w, random({1, 6}, rng), p), InvalidArgument, op);
  // f16 is a storage type on the host
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_forward(Tensor<half>({2, 4, 5, 5}), Tensor<half>({6, 4, 3, 3}), p),
                            NotImplemented, op);
  // the good call still works after all that
  CHECK(ops::conv2d_forward(x, w, b, p).shape() == Shape{2, 6, 5, 5});
}

namespace {
// A grouped geometry whose backward calls the bad-input cases below break one thing at a time.
struct BackwardBadInput {
  Rng rng{8};
  Tensor<double> x = random({2, 4, 5, 5}, rng), w = random({6, 2, 3, 3}, rng), dy = random({2, 6, 5, 5}, rng);
  Conv2dParams p = Conv2dParams::make(1, 1, 1, 2);
};
}  // namespace

TEST_CASE("conv2d_backward_data: bad input") {
  BackwardBadInput t;
  auto& [rng, x, w, dy, p] = t;
  {
    constexpr const char* op = "conv2d_backward_data";
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_data(random({2, 6, 4, 5}, rng), w, x.shape(), p), InvalidArgument,
                              op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_data(random({6, 5, 5}, rng), w, x.shape(), p), InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_data(dy, w, Shape{2, 4, 5}, p), InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_data(dy, w, Shape{2, 6, 5, 5}, p), InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_data(dy, w, Shape{2, 4, 5, 0}, p), InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_data(dy, random({6, 2, 3}, rng), x.shape(), p), InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_data(dy, w, x.shape(), Conv2dParams::make(0, 1, 1, 2)),
                              InvalidArgument, op);
    // absurd sizes are refused before any arithmetic can overflow
    const std::int64_t huge = std::numeric_limits<std::int64_t>::max() - 1;
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_data(dy, w, Shape{2, 4, huge, 5}, p), InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_data(dy, w, Shape{1 << 30, 4, 1 << 30, 1 << 30}, p),
                              InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_data(Tensor<half>({2, 6, 5, 5}), Tensor<half>({6, 2, 3, 3}),
                                                        x.shape(), p),
                              NotImplemented, op);
  }
  CHECK(ops::conv2d_backward_data(dy, w, x.shape(), p).shape() == x.shape());
}

TEST_CASE("conv2d_backward_filter: bad input") {
  BackwardBadInput t;
  auto& [rng, x, w, dy, p] = t;
  {
    constexpr const char* op = "conv2d_backward_filter";
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_filter(random({2, 6, 5, 4}, rng), x, w.shape(), p),
                              InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_filter(dy, x, Shape{6, 2, 3}, p), InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_filter(dy, x, Shape{6, 4, 3, 3}, p), InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_filter(dy, x, Shape{4, 2, 3, 3}, p), InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_filter(dy, random({2, 4, 5}, rng), w.shape(), p), InvalidArgument,
                              op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_filter(dy, Tensor<double>{}, w.shape(), p), InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_filter(Tensor<double>{}, x, w.shape(), p), InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_filter(Tensor<half>({2, 6, 5, 5}), Tensor<half>({2, 4, 5, 5}),
                                                          w.shape(), p),
                              NotImplemented, op);
  }
  CHECK(ops::conv2d_backward_filter(dy, x, w.shape(), p).shape() == w.shape());
}

TEST_CASE("conv2d_backward_bias: bad input") {
  BackwardBadInput t;
  auto& [rng, x, w, dy, p] = t;
  {
    constexpr const char* op = "conv2d_backward_bias";
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_bias(random({2, 6, 5}, rng)), InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_bias(Tensor<double>{}), InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_bias(Tensor<double>({2, 0, 5, 5})), InvalidArgument, op);
    CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_bias(Tensor<half>({2, 6, 5, 5})), NotImplemented, op);
  }
  CHECK(ops::conv2d_backward_bias(dy).shape() == Shape{6});
}

TEST_CASE("conv2d_output_shape: rule and bad input") {
  CHECK(conv2d_output_shape({2, 3, 7, 5}, {4, 3, 3, 3}, Conv2dParams::make(2, 1)) == Shape{2, 4, 4, 3});
  // (28 + 0 + 1 - 2*(3-1) - 1) / 1 + 1 = 25 rows, (28 + 2 + 2 - 5) / 3 + 1 = 10 columns
  CHECK(conv2d_output_shape({1, 1, 28, 28}, {1, 1, 3, 3},
                            {.stride_w = 3, .pad_bottom = 1, .pad_left = 2, .pad_right = 2, .dilation_h = 2}) ==
        Shape{1, 1, 25, 10});
  CUTRAIN_REQUIRE_THROWS_OP(conv2d_output_shape({2, 3, 7}, {4, 3, 3, 3}, {}), InvalidArgument, "conv2d");
  CUTRAIN_REQUIRE_THROWS_OP(conv2d_output_shape({2, 3, 7, 5}, {4, 2, 3, 3}, {}), InvalidArgument, "conv2d");
}

TEST_CASE("conv2d_bias_activation_forward: equals activation(conv2d_forward) and checks input") {
  using namespace cutrain;
  Rng rng(77);
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    auto x = cutrain::test::random({2, 4, 7, 6}, rng, layout);
    auto w = cutrain::test::random({6, 4, 3, 3}, rng, layout);
    auto b = cutrain::test::random({6}, rng);
    const auto p = Conv2dParams::make(2, 1);
    for (Activation k : {Activation::relu, Activation::gelu_erf, Activation::silu}) {
      auto fused = ops::conv2d_bias_activation_forward(x, w, b, {.kind = k}, p);
      auto ref = ops::activation_forward(ops::conv2d_forward(x, w, b, p), {.kind = k});
      CHECK(fused.layout() == ref.layout());
      cutrain::test::require_close(fused, [&] {
        const auto v = ref.to_vector();
        return std::vector<double>(v.begin(), v.end());
      }());
    }
  }
  auto x = Tensor<double>::zeros({1, 3, 5, 5});
  auto w = Tensor<double>::zeros({2, 4, 3, 3});
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_bias_activation_forward(x, w, Tensor<double>{}, {}, Conv2dParams{}),
                            InvalidArgument, "conv2d_bias_activation_forward");
  auto w2 = Tensor<double>::zeros({2, 3, 3, 3});
  auto bad_bias = Tensor<double>::zeros({3});
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_bias_activation_forward(x, w2, bad_bias, {}, Conv2dParams{}), InvalidArgument,
                            "conv2d_bias_activation_forward");
}

TEST_CASE("conv2d_backward_data_activation: equals activation_backward(conv2d_backward_data) and checks input") {
  using namespace cutrain;
  Rng rng(78);
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    auto act_x = cutrain::test::random({2, 4, 7, 6}, rng, layout);
    auto w = cutrain::test::random({6, 4, 3, 3}, rng, layout);
    const auto p = Conv2dParams::make(2, 1);
    auto dy = cutrain::test::random(conv2d_output_shape(act_x.shape(), w.shape(), p), rng, layout);
    for (Activation k : {Activation::relu, Activation::gelu_erf, Activation::silu}) {
      auto fused = ops::conv2d_backward_data_activation(dy, w, act_x, {.kind = k}, p);
      auto ref = ops::activation_backward(act_x, ops::conv2d_backward_data(dy, w, act_x.shape(), p), {.kind = k});
      CHECK(fused.layout() == ref.layout());
      const auto v = ref.to_vector();
      cutrain::test::require_close(fused, std::vector<double>(v.begin(), v.end()));
    }
  }
  auto act_x = Tensor<double>::zeros({1, 3, 5, 5});
  auto w = Tensor<double>::zeros({2, 3, 3, 3});
  auto bad_dy = Tensor<double>::zeros({1, 2, 4, 4});  // the output is [1,2,3,3]
  CUTRAIN_REQUIRE_THROWS_OP(ops::conv2d_backward_data_activation(bad_dy, w, act_x, {}, Conv2dParams{}), InvalidArgument,
                            "conv2d_backward_data_activation");
}

}  // namespace cutrain_test_conv2d
