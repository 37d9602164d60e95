// Batch norm and layer norm: hand-computed values, layouts, float against double, gradient
// checks in both layouts and on strided inputs, and bad input (which must leave running stats alone).
#include "gradcheck.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cutrain/ops/batch_norm.hpp"
#include "cutrain/ops/layer_norm.hpp"

namespace cutrain_test_norm {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

// A [N,C,H,W] (or 2-d) double tensor in `layout`, or, for Layout::strided, a view that skips
// elements of a larger tensor (every other W, or every other column of a 2-d one).
Tensor<double> random_input(const Shape& s, Rng& rng, Layout layout, Tensor<double>& backing) {
  if (layout != Layout::strided) return random(s, rng, layout);
  Shape big = s;
  const int last = s.rank() - 1;
  big[last] = 2 * s[last] + 1;
  backing = random(big, rng);
  auto v = backing.slice(last, 1, 1 + s[last]);
  return v;
}

Tensor<double> to_double(const Tensor<float>& t) {
  const auto v = t.to_vector();
  return Tensor<double>::from_vector(std::vector<double>(v.begin(), v.end()), t.shape());
}

Tensor<float> to_float(const Tensor<double>& t) {
  const auto v = t.to_vector();
  const Layout l = t.layout() == Layout::nhwc ? Layout::nhwc : Layout::row_major;
  return Tensor<float>::from_vector(std::vector<float>(v.begin(), v.end()), t.shape(), {.layout = l});
}

std::vector<double> values(const Tensor<double>& t) { return t.to_vector(); }

void gradcheck_batch_norm(const std::string& name, const Shape& s, Layout layout, Layout dy_layout, Rng& rng) {
  Tensor<double> backing;
  auto x = random_input(s, rng, layout, backing);
  const std::int64_t C = s[1];
  auto gamma = Tensor<double>::uniform({C}, rng, 0.5, 1.5);
  auto beta = random({C}, rng);
  auto rm0 = random({C}, rng);
  auto rv0 = Tensor<double>::uniform({C}, rng, 0.5, 1.5);
  auto r = random(s, rng, dy_layout);
  const BatchNormParams p{};
  // Fresh copies of the running stats on every call, so that repeated calls see the same state.
  auto forward = [&] {
    auto rm = rm0.clone();
    auto rv = rv0.clone();
    return ops::batch_norm_forward_training(x, gamma, beta, rm, rv, p).y;
  };
  auto rm = rm0.clone();
  auto rv = rv0.clone();
  auto fwd = ops::batch_norm_forward_training(x, gamma, beta, rm, rv, p);
  auto g = ops::batch_norm_backward(x, r, gamma, fwd.save_mean, fwd.save_inv_std);
  const Layout want = layout == Layout::nhwc ? Layout::nhwc : (s.rank() == 4 ? Layout::nchw : Layout::row_major);
  CHECK(fwd.y.layout() == want);
  CHECK(g.dx.layout() == want);
  CHECK(g.dgamma.shape() == Shape{C});
  CHECK(g.dbeta.shape() == Shape{C});
  gradcheck(name + " dx", x, forward, g.dx, r);
  gradcheck(name + " dgamma", gamma, forward, g.dgamma, r);
  gradcheck(name + " dbeta", beta, forward, g.dbeta, r);
}

void gradcheck_layer_norm(const std::string& name, const Shape& s, Layout layout, Rng& rng) {
  Tensor<double> backing;
  auto x = random_input(s, rng, layout, backing);
  const Shape rest(std::vector<std::int64_t>(s.dims().begin() + 1, s.dims().end()));
  auto gamma = Tensor<double>::uniform(rest, rng, 0.5, 1.5);
  auto beta = random(rest, rng);
  auto r = random(s, rng, layout == Layout::strided ? Layout::row_major : layout);
  auto forward = [&] { return ops::layer_norm_forward(x, gamma, beta).y; };
  auto fwd = ops::layer_norm_forward(x, gamma, beta);
  auto g = ops::layer_norm_backward(x, r, gamma, fwd.mean, fwd.inv_std);
  const Layout want = layout == Layout::nhwc ? Layout::nhwc : (s.rank() == 4 ? Layout::nchw : Layout::row_major);
  CHECK(fwd.y.layout() == want);
  CHECK(g.dx.layout() == want);
  CHECK(fwd.mean.shape() == Shape{s[0]});
  CHECK(g.dgamma.shape() == rest);
  gradcheck(name + " dx", x, forward, g.dx, r);
  gradcheck(name + " dgamma", gamma, forward, g.dgamma, r);
  gradcheck(name + " dbeta", beta, forward, g.dbeta, r);
}

}  // namespace

TEST_CASE("batch_norm_forward_training: hand-computed [2,1,1,2], running stats and backward") {
  // One channel holding 1, 3, 5, 7: mean 4, deviations -3, -1, 1, 3,
  // biased variance (9 + 1 + 1 + 9) / 4 = 5, unbiased 20 / 3.
  // eps = 4 makes var + eps = 9, so inv_std = 1/3 and xhat = -1, -1/3, 1/3, 1.
  // gamma 2, beta 0.5: y = 2 * xhat + 0.5 = -1.5, -1/6, 7/6, 2.5.
  // Running stats from mean 1, var 2 with momentum 0.1:
  //   mean 0.9 * 1 + 0.1 * 4 = 1.3, var 0.9 * 2 + 0.1 * 20/3 = 1.8 + 2/3 = 2.4666...
  auto x = Tensor<double>::from_vector({1, 3, 5, 7}, {2, 1, 1, 2});
  auto gamma = Tensor<double>::from_vector({2}, {1});
  auto beta = Tensor<double>::from_vector({0.5}, {1});
  auto rm = Tensor<double>::from_vector({1}, {1});
  auto rv = Tensor<double>::from_vector({2}, {1});
  auto f = ops::batch_norm_forward_training(x, gamma, beta, rm, rv, {.momentum = 0.1, .eps = 4});
  require_close(f.y, {-1.5, -1.0 / 6, 7.0 / 6, 2.5});
  require_close(f.save_mean, {4});
  require_close(f.save_inv_std, {1.0 / 3});
  require_close(rm, {1.3});
  require_close(rv, {1.8 + 2.0 / 3});

  // Backward with dy = 1, 0, 0, 0 (M = 4 values in the channel):
  //   dbeta = 1, dgamma = sum dy * xhat = -1,
  //   dx = gamma * inv_std / M * (M dy - dbeta - xhat dgamma) = (1/6) * (4 dy - 1 + xhat)
  //      = (1/6) * (2, -4/3, -2/3, 0) = 1/3, -2/9, -1/9, 0.
  auto dy = Tensor<double>::from_vector({1, 0, 0, 0}, {2, 1, 1, 2});
  auto g = ops::batch_norm_backward(x, dy, gamma, f.save_mean, f.save_inv_std);
  require_close(g.dx, {1.0 / 3, -2.0 / 9, -1.0 / 9, 0});
  require_close(g.dgamma, {-1});
  require_close(g.dbeta, {1});

  // Default eps 1e-5: inv_std = 1 / sqrt(5.00001); y = 2 * (-3, -1, 1, 3) * inv_std + 0.5. A
  // second update moves the stats again: 0.9 * 1.3 + 0.4 = 1.57, 0.9 * 2.4666... + 2/3 = 2.8866...
  auto f2 = ops::batch_norm_forward_training(x, gamma, beta, rm, rv, {});
  const double is = 1 / std::sqrt(5.00001);
  require_close(f2.save_inv_std, {is});
  require_close(f2.y, {-6 * is + 0.5, -2 * is + 0.5, 2 * is + 0.5, 6 * is + 0.5});
  require_close(rm, {1.57});
  require_close(rv, {0.9 * (1.8 + 2.0 / 3) + 2.0 / 3});
}

TEST_CASE("batch_norm_forward_training: momentum 0 keeps and momentum 1 replaces the running stats") {
  // Channel 0 holds 0, 2 (mean 1, unbiased variance 2), channel 1 holds 5, 5 (mean 5, variance 0,
  // which eps keeps finite: y = beta there).
  auto x = Tensor<double>::from_vector({0, 5, 2, 5}, {2, 2});
  auto gamma = Tensor<double>::from_vector({1, 1}, {2});
  auto beta = Tensor<double>::from_vector({0, 0.25}, {2});
  auto rm = Tensor<double>::from_vector({7, 8}, {2});
  auto rv = Tensor<double>::from_vector({3, 4}, {2});
  auto f = ops::batch_norm_forward_training(x, gamma, beta, rm, rv, {.momentum = 0});
  require_close(rm, {7, 8});
  require_close(rv, {3, 4});
  require_close(f.y, {-1 / std::sqrt(1 + 1e-5), 0.25, 1 / std::sqrt(1 + 1e-5), 0.25});
  ops::batch_norm_forward_training(x, gamma, beta, rm, rv, {.momentum = 1});
  require_close(rm, {1, 5});
  require_close(rv, {2, 0});
}

TEST_CASE("batch_norm_forward_inference: hand-computed [2,2] and nhwc") {
  // y = gamma * (x - running_mean) / sqrt(running_var + eps) + beta with eps = 1:
  // channel 0: mean 1, sqrt(3 + 1) = 2, gamma 1, beta 0:  (1 - 1) / 2 = 0,  (3 - 1) / 2 = 1
  // channel 1: mean 2, sqrt(8 + 1) = 3, gamma 3, beta -1: 3 * 0 / 3 - 1 = -1, 3 * 2 / 3 - 1 = 1
  auto x = Tensor<double>::from_vector({1, 2, 3, 4}, {2, 2});
  auto gamma = Tensor<double>::from_vector({1, 3}, {2});
  auto beta = Tensor<double>::from_vector({0, -1}, {2});
  auto rm = Tensor<double>::from_vector({1, 2}, {2});
  auto rv = Tensor<double>::from_vector({3, 8}, {2});
  require_close(ops::batch_norm_forward_inference(x, gamma, beta, rm, rv, 1.0), {0, -1, 1, 1});

  // The same numbers as [1,2,1,2] in nhwc (logical order n, c, h, w): channel 0 holds 1, 3, channel 1 holds 2, 4.
  auto x4 = Tensor<double>::from_vector({1, 3, 2, 4}, {1, 2, 1, 2}, {.layout = Layout::nhwc});
  auto y4 = ops::batch_norm_forward_inference(x4, gamma, beta, rm, rv, 1.0);
  CHECK(y4.layout() == Layout::nhwc);
  require_close(y4, {0, 1, -1, 1});
  // Inference has no variance to estimate, so one value per channel is fine.
  auto x1 = Tensor<double>::from_vector({3, 4}, {1, 2, 1, 1});
  require_close(ops::batch_norm_forward_inference(x1, gamma, beta, rm, rv, 1.0), {1, 1});
}

TEST_CASE("layer_norm_forward: hand-computed [2,3]") {
  // eps = 1/3. Row 0 = 1, 2, 3: mean 2, variance 2/3, + eps = 1, inv_std 1, xhat -1, 0, 1.
  // Row 1 = 2, 4, 9: mean 5, deviations -3, -1, 4, variance 26/3, + eps = 9, inv_std 1/3,
  // xhat -1, -1/3, 4/3. gamma 1, 2, 3 and beta 0, 1, -1:
  //   y row 0 = -1, 0 + 1, 3 - 1 = -1, 1, 2;  row 1 = -1, -2/3 + 1, 4 - 1 = -1, 1/3, 3.
  auto x = Tensor<double>::from_vector({1, 2, 3, 2, 4, 9}, {2, 3});
  auto gamma = Tensor<double>::from_vector({1, 2, 3}, {3});
  auto beta = Tensor<double>::from_vector({0, 1, -1}, {3});
  auto f = ops::layer_norm_forward(x, gamma, beta, 1.0 / 3);
  require_close(f.y, {-1, 1, 2, -1, 1.0 / 3, 3});
  require_close(f.mean, {2, 5});
  require_close(f.inv_std, {1, 1.0 / 3});
  // A constant row has variance 0: xhat = 0 and y = beta, never NaN.
  auto c = Tensor<double>::from_vector({4, 4, 4}, {1, 3});
  require_close(ops::layer_norm_forward(c, gamma, beta).y, {0, 1, -1});
}

TEST_CASE("batch_norm: nchw, nhwc and strided inputs give the same values") {
  Rng rng(11);
  const Shape s{3, 4, 5, 6};
  auto x = random(s, rng);
  auto x_nhwc = x.clone(Layout::nhwc);
  Tensor<double> backing;
  auto x_str = random_input(s, rng, Layout::strided, backing);
  x_str.copy_from(x);
  REQUIRE(x_str.layout() == Layout::strided);
  auto dy = random(s, rng);
  auto gamma = Tensor<double>::uniform({4}, rng, 0.5, 1.5);
  auto beta = random({4}, rng);
  auto lg = Tensor<double>::uniform({4, 5, 6}, rng, 0.5, 1.5);
  auto lb = random({4, 5, 6}, rng);

  auto run = [&](const Tensor<double>& in) {
    auto rm = Tensor<double>::zeros({4});
    auto rv = Tensor<double>::full({4}, 1.0);
    auto f = ops::batch_norm_forward_training(in, gamma, beta, rm, rv, {});
    auto g = ops::batch_norm_backward(in, dy, gamma, f.save_mean, f.save_inv_std);
    auto yi = ops::batch_norm_forward_inference(in, gamma, beta, rm, rv);
    auto lf = ops::layer_norm_forward(in, lg, lb);
    auto lgr = ops::layer_norm_backward(in, dy, lg, lf.mean, lf.inv_std);
    return std::vector<std::vector<double>>{values(f.y),  values(g.dx),    values(g.dgamma), values(yi),
                                            values(rm),   values(rv),      values(lf.y),     values(lgr.dx),
                                            values(lgr.dgamma), values(lgr.dbeta)};
  };
  const auto want = run(x);
  for (const auto* in : {&x_nhwc, &x_str}) {
    const auto got = run(*in);
    for (std::size_t i = 0; i < want.size(); ++i) {
      REQUIRE(got[i].size() == want[i].size());
      for (std::size_t j = 0; j < want[i].size(); ++j) REQUIRE(got[i][j] == Approx(want[i][j]).margin(1e-12));
    }
  }
  auto rm = Tensor<double>::zeros({4});
  auto rv = Tensor<double>::full({4}, 1.0);
  CHECK(ops::batch_norm_forward_training(x_nhwc, gamma, beta, rm, rv, {}).y.layout() == Layout::nhwc);
  CHECK(ops::layer_norm_forward(x_nhwc, lg, lb).y.layout() == Layout::nhwc);
}

TEST_CASE("batch_norm, layer_norm: float matches double") {
  Rng rng(5);
  const Shape s{4, 3, 5, 2};
  auto x = random(s, rng, Layout::nhwc);
  auto dy = random(s, rng, Layout::nhwc);
  auto gamma = Tensor<double>::uniform({3}, rng, 0.5, 1.5);
  auto beta = random({3}, rng);
  auto rm = random({3}, rng);
  auto rv = Tensor<double>::uniform({3}, rng, 0.5, 1.5);
  auto xf = to_float(x), dyf = to_float(dy), gammaf = to_float(gamma), betaf = to_float(beta);
  auto rmf = to_float(rm), rvf = to_float(rv);

  const double tol = 1e-5;
  auto yi = ops::batch_norm_forward_inference(x, gamma, beta, rm, rv);
  require_close(ops::batch_norm_forward_inference(xf, gammaf, betaf, rmf, rvf), values(yi), tol);
  auto f = ops::batch_norm_forward_training(x, gamma, beta, rm, rv, {});
  auto ff = ops::batch_norm_forward_training(xf, gammaf, betaf, rmf, rvf, {});
  CHECK(ff.y.layout() == Layout::nhwc);
  require_close(ff.y, values(f.y), tol);
  require_close(ff.save_mean, values(f.save_mean), tol);
  require_close(ff.save_inv_std, values(f.save_inv_std), tol);
  require_close(rmf, values(rm), tol);
  require_close(rvf, values(rv), tol);
  auto g = ops::batch_norm_backward(x, dy, gamma, f.save_mean, f.save_inv_std);
  auto gf = ops::batch_norm_backward(xf, dyf, gammaf, ff.save_mean, ff.save_inv_std);
  require_close(gf.dx, values(g.dx), tol);
  require_close(gf.dgamma, values(g.dgamma), tol);
  require_close(gf.dbeta, values(g.dbeta), tol);

  auto lg = Tensor<double>::uniform({3, 5, 2}, rng, 0.5, 1.5);
  auto lb = random({3, 5, 2}, rng);
  auto lgf = to_float(lg), lbf = to_float(lb);
  auto lf = ops::layer_norm_forward(x, lg, lb);
  auto lff = ops::layer_norm_forward(xf, lgf, lbf);
  require_close(lff.y, values(lf.y), tol);
  require_close(to_double(lff.inv_std), values(lf.inv_std), tol);
  auto lgrad = ops::layer_norm_backward(x, dy, lg, lf.mean, lf.inv_std);
  auto lgradf = ops::layer_norm_backward(xf, dyf, lgf, lff.mean, lff.inv_std);
  require_close(lgradf.dx, values(lgrad.dx), tol);
  require_close(lgradf.dgamma, values(lgrad.dgamma), tol);
  require_close(lgradf.dbeta, values(lgrad.dbeta), tol);
}

TEST_CASE("gradcheck: batch_norm_backward dx, dgamma, dbeta") {
  Rng rng(101);
  gradcheck_batch_norm("batch_norm nchw [3,5,7,3]", {3, 5, 7, 3}, Layout::nchw, Layout::nchw, rng);
  gradcheck_batch_norm("batch_norm nhwc [3,5,7,3]", {3, 5, 7, 3}, Layout::nhwc, Layout::nhwc, rng);
  gradcheck_batch_norm("batch_norm nchw x, nhwc dy [2,3,4,5]", {2, 3, 4, 5}, Layout::nchw, Layout::nhwc, rng);
  gradcheck_batch_norm("batch_norm batch 1 nchw [1,4,3,5]", {1, 4, 3, 5}, Layout::nchw, Layout::nchw, rng);
  gradcheck_batch_norm("batch_norm batch 1 nhwc [1,4,3,5]", {1, 4, 3, 5}, Layout::nhwc, Layout::nhwc, rng);
  gradcheck_batch_norm("batch_norm two values per channel [2,3,1,1]", {2, 3, 1, 1}, Layout::nchw, Layout::nchw, rng);
  gradcheck_batch_norm("batch_norm strided [3,4,5,7]", {3, 4, 5, 7}, Layout::strided, Layout::nchw, rng);
  gradcheck_batch_norm("batch_norm 2-d [6,5]", {6, 5}, Layout::row_major, Layout::row_major, rng);
  gradcheck_batch_norm("batch_norm 2-d strided [7,3]", {7, 3}, Layout::strided, Layout::row_major, rng);
}

TEST_CASE("gradcheck: layer_norm_backward dx, dgamma, dbeta") {
  Rng rng(202);
  gradcheck_layer_norm("layer_norm nchw [3,5,7,3]", {3, 5, 7, 3}, Layout::nchw, rng);
  gradcheck_layer_norm("layer_norm nhwc [3,5,7,3]", {3, 5, 7, 3}, Layout::nhwc, rng);
  gradcheck_layer_norm("layer_norm strided [2,3,4,5]", {2, 3, 4, 5}, Layout::strided, rng);
  gradcheck_layer_norm("layer_norm 2-d [4,7]", {4, 7}, Layout::row_major, rng);
  gradcheck_layer_norm("layer_norm 2-d batch 1 [1,9]", {1, 9}, Layout::row_major, rng);
  gradcheck_layer_norm("layer_norm 3-d [2,3,4]", {2, 3, 4}, Layout::row_major, rng);
}

TEST_CASE("batch_norm_forward_training: bad input leaves the running stats unchanged") {
  constexpr auto op = "batch_norm_forward_training";
  Rng rng(7);
  auto x = random({2, 3, 4, 5}, rng);
  auto g = random({3}, rng), b = random({3}, rng);
  auto rm = random({3}, rng);
  auto rv = Tensor<double>::uniform({3}, rng, 0.5, 1.5);
  const auto rm0 = values(rm), rv0 = values(rv);
  auto g4 = random({4}, rng), g31 = random({3, 1}, rng);
  auto x3 = random({2, 3, 4}, rng), x1 = random({6}, rng), x5 = random({1, 3, 2, 2, 1}, rng);
  auto x0 = Tensor<double>::zeros({2, 3, 0, 5});
  auto xc0 = Tensor<double>::zeros({2, 0});
  auto one = random({1, 3, 1, 1}, rng), one2 = random({1, 3}, rng);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();

  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(Tensor<double>{}, g, b, rm, rv, {}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x3, g, b, rm, rv, {}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x1, g, b, rm, rv, {}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x5, g, b, rm, rv, {}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x0, g, b, rm, rv, {}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(xc0, g, b, rm, rv, {}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x, g4, b, rm, rv, {}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x, g31, b, rm, rv, {}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x, g, g4, rm, rv, {}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x, g, b, g4, rv, {}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x, g, b, rm, g31, {}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x, g, b, rm, rv, {.eps = 0}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x, g, b, rm, rv, {.eps = -1e-5}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x, g, b, rm, rv, {.eps = nan}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x, g, b, rm, rv, {.eps = inf}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x, g, b, rm, rv, {.momentum = -0.1}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x, g, b, rm, rv, {.momentum = 1.5}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(x, g, b, rm, rv, {.momentum = nan}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(one, g, b, rm, rv, {}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(one2, g, b, rm, rv, {}), InvalidArgument, op);
  try {
    ops::batch_norm_forward_training(one, g, b, rm, rv, {});
  } catch (const InvalidArgument& e) {
    CHECK(std::string(e.what()).find("variance") != std::string::npos);
  }
  CHECK(values(rm) == rm0);
  CHECK(values(rv) == rv0);

  auto h = Tensor<half>::zeros({2, 3});
  auto hg = Tensor<half>::zeros({3}), hb = Tensor<half>::zeros({3}), hm = Tensor<half>::zeros({3});
  auto hv = Tensor<half>::zeros({3});
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_training(h, hg, hb, hm, hv, {}), NotImplemented, op);
}

TEST_CASE("batch_norm_forward_inference: bad input") {
  constexpr auto op = "batch_norm_forward_inference";
  Rng rng(8);
  auto x = random({2, 3, 4, 5}, rng, Layout::nhwc);
  auto g = random({3}, rng), b = random({3}, rng), rm = random({3}, rng);
  auto rv = Tensor<double>::uniform({3}, rng, 0.5, 1.5);
  auto g2 = random({2}, rng);
  auto x3 = random({2, 3, 4}, rng);
  auto x0 = Tensor<double>::zeros({0, 3, 4, 5});
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_inference(x3, g, b, rm, rv), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_inference(x0, g, b, rm, rv), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_inference(x, g2, b, rm, rv), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_inference(x, g, g2, rm, rv), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_inference(x, g, b, g2, rv), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_inference(x, g, b, rm, g2), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_inference(x, g, b, rm, Tensor<double>{}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_inference(x, g, b, rm, rv, 0.0), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_inference(x, g, b, rm, rv, -1.0), InvalidArgument, op);
  auto h = Tensor<half>::zeros({2, 3, 1, 1});
  auto hc = Tensor<half>::zeros({3});
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_forward_inference(h, hc, hc, hc, hc), NotImplemented, op);
}

TEST_CASE("batch_norm_backward: bad input") {
  constexpr auto op = "batch_norm_backward";
  Rng rng(9);
  auto x = random({2, 3, 4, 5}, rng);
  auto dy = random({2, 3, 4, 5}, rng);
  auto dy_t = random({2, 3, 5, 4}, rng);
  auto g = random({3}, rng), sm = random({3}, rng), si = random({3}, rng);
  auto g4 = random({4}, rng);
  auto x5 = random({2, 3, 4, 5, 1}, rng);
  auto x0 = Tensor<double>::zeros({2, 3, 4, 0});
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_backward(x, dy_t, g, sm, si), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_backward(x, Tensor<double>{}, g, sm, si), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_backward(x, dy, g4, sm, si), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_backward(x, dy, g, g4, si), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_backward(x, dy, g, sm, g4), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_backward(x5, x5, g, sm, si), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_backward(x0, x0, g, sm, si), InvalidArgument, op);
  auto h = Tensor<half>::zeros({2, 3});
  auto hc = Tensor<half>::zeros({3});
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_backward(h, h, hc, hc, hc), NotImplemented, op);
}

TEST_CASE("layer_norm_forward: bad input") {
  constexpr auto op = "layer_norm_forward";
  Rng rng(10);
  auto x = random({2, 3, 4, 5}, rng);
  auto g = random({3, 4, 5}, rng), b = random({3, 4, 5}, rng);
  auto gc = random({3}, rng), gt = random({5, 4, 3}, rng), gflat = random({60}, rng);
  auto x1 = random({6}, rng);
  auto x0 = Tensor<double>::zeros({2, 0});
  auto g0 = Tensor<double>::zeros({0});
  auto g16 = random({1, 6}, rng);  // more dims than x: x1 [6] takes gamma [6] (normalized whole)
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_forward(x1, g16, g16), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_forward(Tensor<double>{}, g, b), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_forward(x0, g0, g0), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_forward(x, gc, b), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_forward(x, gt, b), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_forward(x, gflat, b), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_forward(x, g, gt), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_forward(x, g, b, 0.0), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_forward(x, g, b, -1.0), InvalidArgument, op);
  auto h = Tensor<half>::zeros({2, 3});
  auto hc = Tensor<half>::zeros({3});
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_forward(h, hc, hc), NotImplemented, op);
}

TEST_CASE("layer_norm_backward: bad input") {
  constexpr auto op = "layer_norm_backward";
  Rng rng(12);
  auto x = random({2, 6}, rng), dy = random({2, 6}, rng), dy_t = random({6, 2}, rng);
  auto g = random({6}, rng), m = random({2}, rng), s = random({2}, rng);
  auto g5 = random({5}, rng), m3 = random({3}, rng), m21 = random({2, 1}, rng);
  auto x1 = random({6}, rng);
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_backward(x, dy_t, g, m, s), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_backward(x, dy, g5, m, s), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_backward(x, dy, g, m3, s), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_backward(x, dy, g, m21, s), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_backward(x, dy, g, m, m3), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_backward(x1, x1, g, m, s), InvalidArgument, op);
  auto h = Tensor<half>::zeros({2, 3});
  auto hc = Tensor<half>::zeros({3}), hn = Tensor<half>::zeros({2});
  CUTRAIN_REQUIRE_THROWS_OP(ops::layer_norm_backward(h, h, hc, hn, hn), NotImplemented, op);
}

}  // namespace cutrain_test_norm
