// Elementwise add / multiply / scale, dropout and flatten: hand-computed values, layouts,
// dropout statistics and seeding, gradient checks in both layouts, float against double, bad input.
#include "gradcheck.hpp"

#include <cmath>

#include "cutrain/ops/dropout.hpp"
#include "cutrain/ops/elementwise.hpp"
#include "cutrain/ops/flatten.hpp"

namespace cutrain_test_elementwise {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {
Tensor<float> to_float(const Tensor<double>& t) {
  const auto v = t.to_vector();
  return Tensor<float>::from_vector(std::vector<float>(v.begin(), v.end()), t.shape(),
                                    {.layout = cpu::output_layout(t)});
}
}  // namespace

TEST_CASE("elementwise: hand-computed add, multiply, scale, mixed layouts") {
  auto a = Tensor<double>::from_vector({1, -2, 3, 0.5}, {2, 2});
  auto b = Tensor<double>::from_vector({4, 5, -6, 2}, {2, 2});
  require_close(ops::add(a, b), {5, 3, -3, 2.5});
  require_close(ops::multiply(a, b), {4, -10, -18, 1});
  require_close(ops::scale(a, -1.5), {-1.5, 3, -4.5, -0.75});
  auto gm = ops::multiply_backward(a, b, Tensor<double>::from_vector({1, 2, 3, 4}, {2, 2}));
  require_close(gm.da, {4, 10, -18, 8});  // dy * b
  require_close(gm.db, {1, -4, 9, 2});    // dy * a
  auto ga = ops::add_backward(b);
  require_close(ga.da, {4, 5, -6, 2});
  require_close(ga.db, {4, 5, -6, 2});
  CHECK(ga.da.data() != b.data());  // copies, not views
  require_close(ops::scale_backward(b, 0.5), {2, 2.5, -3, 1});

  // a nhwc, b nchw: same logical values; the output takes a's layout.
  std::vector<double> va(24), vb(24);
  for (int i = 0; i < 24; ++i) va[static_cast<std::size_t>(i)] = i, vb[static_cast<std::size_t>(i)] = 100 - 2 * i;
  auto an = Tensor<double>::from_vector(va, {1, 2, 3, 4}, {.layout = Layout::nhwc});
  auto bn = Tensor<double>::from_vector(vb, {1, 2, 3, 4}, {.layout = Layout::nchw});
  auto sum = ops::add(an, bn);
  CHECK(sum.layout() == Layout::nhwc);
  std::vector<double> want(24, 0);
  for (std::size_t i = 0; i < 24; ++i) want[i] = 100 - static_cast<double>(i);  // i + 100 - 2i
  require_close(sum, want);
  CHECK(ops::multiply(bn, an).layout() == Layout::nchw);
  auto gmn = ops::multiply_backward(an, bn, bn);
  CHECK(gmn.da.layout() == Layout::nhwc);
  CHECK(gmn.db.layout() == Layout::nchw);
  // A strided slice works as well.
  auto sl = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}).slice(1, 1, 3);
  require_close(ops::add(sl, sl), {4, 6, 10, 12});
  // Rank 0 and empty tensors.
  require_close(ops::multiply(Tensor<double>::full(Shape{}, 3.0), Tensor<double>::full(Shape{}, -2.0)), {-6});
  CHECK(ops::add(Tensor<double>::zeros({0, 3}), Tensor<double>::zeros({0, 3})).shape() == Shape{0, 3});
}

TEST_CASE("gradcheck: add_backward, both layouts") {
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    Rng rng(500 + static_cast<int>(layout));
    auto a = random({2, 3, 5, 3}, rng, layout);
    auto b = random({2, 3, 5, 3}, rng, layout == Layout::nchw ? Layout::nhwc : Layout::nchw);
    auto r = random(a.shape(), rng, layout);
    auto g = ops::add_backward(r);
    auto f = [&] { return ops::add(a, b); };
    gradcheck(detail::cat("add da ", layout), a, f, g.da, r);
    gradcheck(detail::cat("add db ", layout), b, f, g.db, r);
  }
}

TEST_CASE("gradcheck: multiply_backward, both layouts") {
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    Rng rng(600 + static_cast<int>(layout));
    auto a = random({1, 5, 3, 7}, rng, layout);
    auto b = random({1, 5, 3, 7}, rng, layout == Layout::nchw ? Layout::nhwc : Layout::nchw);
    auto r = random(a.shape(), rng, layout);
    auto g = ops::multiply_backward(a, b, r);
    auto f = [&] { return ops::multiply(a, b); };
    gradcheck(detail::cat("multiply da ", layout), a, f, g.da, r);
    gradcheck(detail::cat("multiply db ", layout), b, f, g.db, r);
  }
  Rng rng(610);
  auto a = random({7}, rng), b = random({7}, rng), r = random({7}, rng);
  auto g = ops::multiply_backward(a, b, r);
  gradcheck("multiply da 1-d", a, [&] { return ops::multiply(a, b); }, g.da, r);
}

TEST_CASE("gradcheck: scale_backward, both layouts") {
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    Rng rng(700 + static_cast<int>(layout));
    auto a = random({3, 2, 5, 1}, rng, layout);
    auto r = random(a.shape(), rng, layout);
    const double alpha = -2.75;
    auto da = ops::scale_backward(r, alpha);
    gradcheck(detail::cat("scale ", layout), a, [&] { return ops::scale(a, alpha); }, da, r);
  }
}

TEST_CASE("dropout: statistics, seeding, mask values and layouts") {
  const std::int64_t n = 100000;
  const double p = 0.3;
  auto x = Tensor<double>::full({n}, 2.0);
  auto d = ops::dropout_forward(x, p, 1234);
  const double keep = 1 / (1 - p);
  std::int64_t kept = 0, bad = 0;
  const auto mv = d.mask.to_vector(), yv = d.y.to_vector();
  for (std::size_t i = 0; i < mv.size(); ++i) {
    bad += (mv[i] != 0.0 && std::abs(mv[i] - keep) > 1e-15) || std::abs(yv[i] - 2.0 * mv[i]) > 1e-14;
    kept += mv[i] != 0.0;
  }
  CHECK(bad == 0);  // every mask value is 0 or 1 / (1 - p), and y = x * mask
  // kept ~ Binomial(n, 1 - p): within 3 sigma of n (1 - p)
  const double sigma = std::sqrt(static_cast<double>(n) * p * (1 - p));
  INFO("kept " << kept << " of " << n);
  CHECK(std::abs(static_cast<double>(kept) - static_cast<double>(n) * (1 - p)) < 3 * sigma);
  // The same seed gives the same mask; another seed a different one.
  CHECK(ops::dropout_forward(x, p, 1234).mask.to_vector() == mv);
  CHECK(ops::dropout_forward(x, p, 1235).mask.to_vector() != mv);
  // Element i is dropped exactly when uniform_at(seed, i) < p.
  for (std::uint64_t i : {0ull, 1ull, 77ull, 99999ull})
    CHECK((mv[i] == 0.0) == (uniform_at(1234, i) < p));
  // p == 0 keeps everything unscaled.
  auto d0 = ops::dropout_forward(x, 0.0, 5);
  CHECK(d0.mask.to_vector() == std::vector<double>(static_cast<std::size_t>(n), 1.0));
  CHECK(d0.y.to_vector() == x.to_vector());

  // The mask follows logical indices, so nchw and nhwc inputs with the same values agree; the
  // outputs keep x's layout.
  Rng rng(8);
  auto xc = random({2, 3, 4, 5}, rng, Layout::nchw);
  auto xh = xc.contiguous(Layout::nhwc);
  auto dc = ops::dropout_forward(xc, 0.5, 77), dh = ops::dropout_forward(xh, 0.5, 77);
  CHECK(dh.mask.layout() == Layout::nhwc);
  CHECK(dh.y.layout() == Layout::nhwc);
  CHECK(dc.mask.layout() == Layout::nchw);
  CHECK(dh.mask.to_vector() == dc.mask.to_vector());
  CHECK(dh.y.to_vector() == dc.y.to_vector());
  auto dxh = ops::dropout_backward(xh, dh.mask);
  CHECK(dxh.layout() == Layout::nhwc);
  CHECK(dxh.to_vector() == dc.y.to_vector());  // dy = x gives dx = x * mask = y

  // float against double
  auto df = ops::dropout_forward(to_float(xc), 0.5, 77);
  require_close(df.y, dc.y.to_vector(), 1e-6);
  require_close(df.mask, dc.mask.to_vector(), 1e-6);
}

TEST_CASE("gradcheck: dropout_backward, both layouts") {
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    Rng rng(800 + static_cast<int>(layout));
    auto x = random({2, 3, 3, 5}, rng, layout);
    auto r = random(x.shape(), rng, layout);
    const double p = 0.4;
    const std::uint64_t seed = 99;
    auto d = ops::dropout_forward(x, p, seed);
    const auto mask = d.mask.to_vector();
    auto dx = ops::dropout_backward(r, d.mask);
    gradcheck(detail::cat("dropout ", layout), x,
              [&] {
                auto again = ops::dropout_forward(x, p, seed);
                CHECK(again.mask.to_vector() == mask);  // the mask does not depend on x or on the call
                return std::move(again.y);
              },
              dx, r);
  }
}

TEST_CASE("flatten: logical order from nchw, nhwc and strided inputs") {
  std::vector<double> v(12);
  for (std::size_t i = 0; i < 12; ++i) v[i] = static_cast<double>(i);
  auto xc = Tensor<double>::from_vector(v, {2, 3, 2, 1});
  auto fc = ops::flatten(xc);
  CHECK(fc.shape() == Shape{2, 6});
  CHECK(fc.data() == xc.data());  // a view
  require_close(fc, v);
  // nhwc: copied, but the features still come out in c, h, w order.
  auto xh = Tensor<double>::from_vector(v, {2, 3, 2, 1}, {.layout = Layout::nhwc});
  auto fh = ops::flatten(xh);
  CHECK(fh.layout() == Layout::row_major);
  CHECK(fh.data() != xh.data());
  require_close(fh, v);
  // strided (a channel slice) and a 3-d input
  require_close(ops::flatten(xc.slice(1, 1, 3)), {2, 3, 4, 5, 8, 9, 10, 11});
  CHECK(ops::flatten(Tensor<double>::zeros({4, 2, 3})).shape() == Shape{4, 6});
  CHECK(ops::flatten(Tensor<double>::zeros({0, 2, 3})).shape() == Shape{0, 6});
  // Flatten only moves data: other dtypes work too.
  CHECK(ops::flatten(Tensor<half>::zeros({2, 3, 2, 2}, {.layout = Layout::nhwc})).shape() == Shape{2, 12});

  // backward: back to the shape, in the asked layout
  auto bc = ops::flatten_backward(fc, xc.shape(), Layout::nchw);
  CHECK(bc.shape() == xc.shape());
  CHECK(bc.layout() == Layout::nchw);
  require_close(bc, v);
  auto bh = ops::flatten_backward(fh, xh.shape(), Layout::nhwc);
  CHECK(bh.layout() == Layout::nhwc);
  require_close(bh, v);
  CHECK(ops::flatten_backward(fc, Shape{2, 6}, Layout::row_major).shape() == Shape{2, 6});
}

TEST_CASE("gradcheck: flatten_backward, nhwc and nchw inputs") {
  for (Layout layout : {Layout::nhwc, Layout::nchw}) {
    Rng rng(900 + static_cast<int>(layout));
    auto x = random({3, 5, 2, 3}, rng, layout);
    auto r = random({3, 30}, rng);
    auto dx = ops::flatten_backward(r, x.shape(), layout);
    CHECK(dx.layout() == layout);
    gradcheck(detail::cat("flatten ", layout), x, [&] { return ops::flatten(x).clone(); }, dx, r);
  }
}

TEST_CASE("elementwise: float matches double") {
  Rng rng(14);
  auto a = random({2, 3, 4, 5}, rng, Layout::nhwc), b = random({2, 3, 4, 5}, rng), dy = random({2, 3, 4, 5}, rng);
  auto af = to_float(a), bf = to_float(b), dyf = to_float(dy);
  require_close(ops::add(af, bf), ops::add(a, b).to_vector(), 1e-6);
  require_close(ops::multiply(af, bf), ops::multiply(a, b).to_vector(), 1e-6);
  require_close(ops::scale(af, 0.3), ops::scale(a, 0.3).to_vector(), 1e-6);
  require_close(ops::multiply_backward(af, bf, dyf).db, ops::multiply_backward(a, b, dy).db.to_vector(), 1e-6);
}

TEST_CASE("elementwise: bad input") {
  Rng rng(15);
  auto a = random({2, 3}, rng);
  auto b = random({3, 2}, rng);
  CUTRAIN_REQUIRE_THROWS_OP(ops::add(a, b), InvalidArgument, "add");
  CUTRAIN_REQUIRE_THROWS_OP(ops::add(a, random({2, 3, 1}, rng)), InvalidArgument, "add");  // rank differs
  CUTRAIN_REQUIRE_THROWS_OP(ops::add(Tensor<double>{}, a), InvalidArgument, "add");
  CUTRAIN_REQUIRE_THROWS_OP(ops::multiply(a, b), InvalidArgument, "multiply");
  CUTRAIN_REQUIRE_THROWS_OP(ops::multiply(a, Tensor<double>{}), InvalidArgument, "multiply");
  CUTRAIN_REQUIRE_THROWS_OP(ops::scale(Tensor<double>{}, 2.0), InvalidArgument, "scale");
  CUTRAIN_REQUIRE_THROWS_OP(ops::scale(a, std::nan("")), InvalidArgument, "scale");
  CUTRAIN_REQUIRE_THROWS_OP(ops::scale(a, INFINITY), InvalidArgument, "scale");
  CUTRAIN_REQUIRE_THROWS_OP(ops::scale_backward(Tensor<double>{}, 2.0), InvalidArgument, "scale_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::scale_backward(a, -INFINITY), InvalidArgument, "scale_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::add_backward(Tensor<double>{}), InvalidArgument, "add_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::multiply_backward(a, b, a), InvalidArgument, "multiply_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::multiply_backward(a, a, b), InvalidArgument, "multiply_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::multiply_backward(a, a, Tensor<double>{}), InvalidArgument, "multiply_backward");
  auto h = Tensor<half>::zeros({2, 3});
  CUTRAIN_REQUIRE_THROWS_OP(ops::add(h, h), NotImplemented, "add");
  CUTRAIN_REQUIRE_THROWS_OP(ops::multiply(h, h), NotImplemented, "multiply");
  CUTRAIN_REQUIRE_THROWS_OP(ops::scale(h, 2.0), NotImplemented, "scale");
  CUTRAIN_REQUIRE_THROWS_OP(ops::add_backward(h), NotImplemented, "add_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::multiply_backward(h, h, h), NotImplemented, "multiply_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::scale_backward(h, 2.0), NotImplemented, "scale_backward");
}

TEST_CASE("dropout: bad input") {
  Rng rng(16);
  auto x = random({4, 5}, rng);
  CUTRAIN_REQUIRE_THROWS_OP(ops::dropout_forward(Tensor<double>{}, 0.5, 1), InvalidArgument, "dropout_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::dropout_forward(x, 1.0, 1), InvalidArgument, "dropout_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::dropout_forward(x, -0.1, 1), InvalidArgument, "dropout_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::dropout_forward(x, 1.5, 1), InvalidArgument, "dropout_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::dropout_forward(x, std::nan(""), 1), InvalidArgument, "dropout_forward");
  auto d = ops::dropout_forward(x, 0.5, 1);
  CUTRAIN_REQUIRE_THROWS_OP(ops::dropout_backward(x, random({5, 4}, rng)), InvalidArgument, "dropout_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::dropout_backward(random({4, 5, 1}, rng), d.mask), InvalidArgument,
                            "dropout_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::dropout_backward(x, Tensor<double>{}), InvalidArgument, "dropout_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::dropout_backward(Tensor<double>{}, d.mask), InvalidArgument, "dropout_backward");
  auto h = Tensor<half>::zeros({4, 5});
  CUTRAIN_REQUIRE_THROWS_OP(ops::dropout_forward(h, 0.5, 1), NotImplemented, "dropout_forward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::dropout_backward(h, h), NotImplemented, "dropout_backward");
}

TEST_CASE("flatten: bad input") {
  Rng rng(17);
  auto x = random({2, 3, 4, 5}, rng);
  auto dy = random({2, 60}, rng);
  CUTRAIN_REQUIRE_THROWS_OP(ops::flatten(Tensor<double>{}), InvalidArgument, "flatten");
  CUTRAIN_REQUIRE_THROWS_OP(ops::flatten(random({6}, rng)), InvalidArgument, "flatten");
  CUTRAIN_REQUIRE_THROWS_OP(ops::flatten_backward(Tensor<double>{}, x.shape(), Layout::nchw), InvalidArgument,
                            "flatten_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::flatten_backward(random({120}, rng), x.shape(), Layout::nchw), InvalidArgument,
                            "flatten_backward");  // dy not 2-d
  CUTRAIN_REQUIRE_THROWS_OP(ops::flatten_backward(random({2, 59}, rng), x.shape(), Layout::nchw), InvalidArgument,
                            "flatten_backward");  // rest differs
  CUTRAIN_REQUIRE_THROWS_OP(ops::flatten_backward(random({3, 40}, rng), x.shape(), Layout::nchw), InvalidArgument,
                            "flatten_backward");  // same count, N differs
  CUTRAIN_REQUIRE_THROWS_OP(ops::flatten_backward(dy, Shape{120}, Layout::row_major), InvalidArgument,
                            "flatten_backward");  // x_shape 1-d
  CUTRAIN_REQUIRE_THROWS_OP(ops::flatten_backward(dy, Shape{2, -3, -20}, Layout::row_major), InvalidArgument,
                            "flatten_backward");  // negative dims
  CUTRAIN_REQUIRE_THROWS_OP(ops::flatten_backward(dy, Shape{2, 60}, Layout::nhwc), InvalidArgument,
                            "flatten_backward");  // nhwc needs 4-d
  CUTRAIN_REQUIRE_THROWS_OP(ops::flatten_backward(dy, x.shape(), Layout::strided), InvalidArgument,
                            "flatten_backward");
}

}  // namespace cutrain_test_elementwise
