// A max pool's indices (ops::max_pool2d_indices) and max_unpool2d: the indices against a direct
// search over each window's taps (ties and NaN included), the values they point at against
// pool2d_forward, max_unpool2d of dy against pool2d_backward, and the errors.
#include "gradcheck.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cutrain/ops/pool2d.hpp"

namespace cutrain_test_pool_indices {  // one per file: the unity build compiles files together

using namespace cutrain;

namespace {
// The flat index r W + q of each window's maximum by its definition: taps (i s - pad + a d,
// j s - pad + b d) inside the input, in row-then-column order; the first strictly larger value
// wins, and the first NaN wins outright.
std::vector<std::int32_t> reference(const Tensor<double>& x, const Pool2dParams& p) {
  const Shape ys = pool2d_output_shape(x.shape(), p);
  const std::int64_t H = x.dim(2), W = x.dim(3);
  const Tensor<double> xc = x.contiguous(Layout::nchw);
  const std::int64_t sh = p.effective_stride_h(), sw = p.effective_stride_w();
  std::vector<std::int32_t> out;
  for (std::int64_t n = 0; n < ys[0]; ++n)
    for (std::int64_t c = 0; c < ys[1]; ++c)
      for (std::int64_t i = 0; i < ys[2]; ++i)
        for (std::int64_t j = 0; j < ys[3]; ++j) {
          std::int64_t best = -1;
          double bv = 0;
          bool nan = false;
          for (std::int64_t a = 0; a < p.kernel_h && !nan; ++a)
            for (std::int64_t b = 0; b < p.kernel_w && !nan; ++b) {
              const std::int64_t r = i * sh - p.pad_top + a * p.dilation_h, q = j * sw - p.pad_left + b * p.dilation_w;
              if (r < 0 || r >= H || q < 0 || q >= W) continue;
              const double v = xc.data()[((n * x.dim(1) + c) * H + r) * W + q];
              if (std::isnan(v)) {
                best = r * W + q;
                nan = true;
              } else if (best < 0 || v > bv) {
                best = r * W + q;
                bv = v;
              }
            }
          out.push_back(static_cast<std::int32_t>(best));
        }
  return out;
}

// Values from a small set, so that windows hold ties.
Tensor<double> tied_random(const Shape& s, Rng& rng, Layout l) {
  Tensor<double> t = Tensor<double>::uniform(s, rng, 0, 4, {.layout = l});
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = std::floor(t.data()[i]);
  return t;
}

struct Case {
  std::string name;
  Shape x;
  Pool2dParams p;
};

std::vector<Case> cases() {
  Pool2dParams ceil3 = Pool2dParams::max(3, 2, 1);
  ceil3.ceil_mode = true;
  Pool2dParams rect = {.kernel_h = 2, .kernel_w = 3, .stride_h = 1, .stride_w = 2, .pad_top = 1, .pad_bottom = 0,
                       .pad_left = 1, .pad_right = 1};
  return {{"2x2 stride 2", Shape{2, 3, 8, 8}, Pool2dParams::max(2)},
          {"3x3 stride 2 pad 1", Shape{2, 3, 9, 7}, Pool2dParams::max(3, 2, 1)},
          {"3x3 stride 2 pad 1 ceil", Shape{1, 2, 8, 8}, ceil3},
          {"3x3 stride 1 (overlapping)", Shape{1, 4, 6, 5}, Pool2dParams::max(3, 1)},
          {"2x3 rectangular, uneven padding", Shape{2, 2, 5, 7}, rect},
          {"3x3 dilation 2 pad 2", Shape{1, 3, 9, 9}, Pool2dParams::max(3, 1, 2, 2)}};
}
}  // namespace

TEST_CASE("max_pool2d_indices: the first maximum of each window, as pool2d_forward picks it", "[pool][indices]") {
  Rng rng(7);
  for (const Case& c : cases())
    for (Layout l : {Layout::nchw, Layout::nhwc})
      for (bool ties : {false, true}) {
        INFO(c.name << (l == Layout::nhwc ? " nhwc" : " nchw") << (ties ? " ties" : ""));
        const Tensor<double> x = ties ? tied_random(c.x, rng, l) : Tensor<double>::uniform(c.x, rng, -1, 1, {.layout = l});
        const Tensor<std::int32_t> idx = ops::max_pool2d_indices(x, c.p);
        const Shape ys = pool2d_output_shape(c.x, c.p);
        REQUIRE(idx.shape() == ys);
        CHECK(idx.layout() != Layout::nhwc);
        CHECK(idx.to_vector() == reference(x, c.p));
        // The values they point at are pool2d_forward's.
        const Tensor<double> y = ops::pool2d_forward(x, c.p).contiguous(Layout::nchw);
        const Tensor<double> xc = x.contiguous(Layout::nchw);
        const auto iv = idx.to_vector();
        const std::int64_t plane = c.x[2] * c.x[3], oplane = ys[2] * ys[3];
        for (std::int64_t k = 0; k < ys.numel(); ++k)
          REQUIRE(xc.data()[(k / oplane) * plane + iv[static_cast<std::size_t>(k)]] == y.data()[k]);
      }
}

TEST_CASE("max_pool2d_indices: a NaN in a window is its index, as the forward's NaN rule", "[pool][indices]") {
  Rng rng(8);
  Tensor<double> x = Tensor<double>::uniform(Shape{1, 1, 4, 4}, rng, -1, 1);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  x.data()[1 * 4 + 1] = nan;  // the second tap of window (0, 0), after a larger value is possible
  x.data()[0] = 5;
  x.data()[2 * 4 + 3] = nan;  // window (1, 1)'s last tap
  x.data()[3 * 4 + 2] = nan;
  const auto idx = ops::max_pool2d_indices(x, Pool2dParams::max(2)).to_vector();
  CHECK(idx == reference(x, Pool2dParams::max(2)));
  CHECK(idx[0] == 1 * 4 + 1);
  CHECK(idx[3] == 2 * 4 + 3);
}

TEST_CASE("max_unpool2d puts y at the indices; of dy it is pool2d_backward", "[pool][indices]") {
  Rng rng(9);
  for (const Case& c : cases()) {
    INFO(c.name);
    const Tensor<double> x = Tensor<double>::uniform(c.x, rng, -1, 1);
    const Tensor<double> y = ops::pool2d_forward(x, c.p);
    const Tensor<std::int32_t> idx = ops::max_pool2d_indices(x, c.p);
    const Tensor<double> dy = Tensor<double>::uniform(y.shape(), rng, -1, 1);
    const Tensor<double> un = ops::max_unpool2d(dy, idx, x.shape());
    REQUIRE(un.shape() == x.shape());
    const Tensor<double> dx = ops::pool2d_backward(x, y, dy, c.p).contiguous(Layout::nchw);
    const auto a = un.contiguous(Layout::nchw).to_vector(), b = dx.to_vector();
    REQUIRE(a.size() == b.size());
    for (std::size_t k = 0; k < a.size(); ++k) REQUIRE(a[k] == Approx(b[k]).margin(1e-15));
    // Unpooling y itself: every chosen element gets back its value when no two windows share it.
    if (c.p.effective_stride_h() >= c.p.kernel_h && c.p.effective_stride_w() >= c.p.kernel_w && c.p.dilation_h == 1) {
      const Tensor<double> back = ops::max_unpool2d(y, idx, x.shape()).contiguous(Layout::nchw);
      const auto iv = idx.to_vector();
      const auto xv = x.to_vector(), bv = back.to_vector();
      const std::int64_t plane = c.x[2] * c.x[3], oplane = y.dim(2) * y.dim(3);
      for (std::int64_t k = 0; k < y.numel(); ++k) {
        const auto at = static_cast<std::size_t>((k / oplane) * plane + iv[static_cast<std::size_t>(k)]);
        REQUIRE(bv[at] == xv[at]);
      }
    }
  }
}

TEST_CASE("max_pool2d_indices and max_unpool2d refuse bad input", "[pool][indices]") {
  Rng rng(10);
  const Tensor<float> x = Tensor<float>::uniform(Shape{1, 2, 4, 4}, rng, -1, 1);
  const auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(message([&] { (void)ops::max_pool2d_indices(x, Pool2dParams::average(2)); }),
             Catch::Contains("max_pool2d_indices") && Catch::Contains("max pool"));
  CHECK_THAT(message([&] { (void)ops::max_pool2d_indices(Tensor<float>::zeros(Shape{2, 4, 4}), Pool2dParams::max(2)); }),
             Catch::Contains("max_pool2d_indices"));
  const Tensor<float> y = ops::pool2d_forward(x, Pool2dParams::max(2));
  const Tensor<std::int32_t> idx = ops::max_pool2d_indices(x, Pool2dParams::max(2));
  CHECK_THAT(message([&] { (void)ops::max_unpool2d(y, idx.slice(3, 0, 1), x.shape()); }),
             Catch::Contains("max_unpool2d") && Catch::Contains("indices must have y's shape"));
  CHECK_THAT(message([&] { (void)ops::max_unpool2d(y, idx, Shape{1, 3, 4, 4}); }),
             Catch::Contains("max_unpool2d") && Catch::Contains("x_shape"));
  Tensor<std::int32_t> bad = idx.contiguous(Layout::nchw);
  bad.data()[0] = 16;  // past the 4 x 4 plane
  CHECK_THAT(message([&] { (void)ops::max_unpool2d(y, bad, x.shape()); }), Catch::Contains("max_unpool2d") ||
                                                                              Catch::Contains("gather"));
}

}  // namespace cutrain_test_pool_indices
