// RMS norm over the last 1 to rank dims (gamma's shape) of rank-1 to rank-4 tensors: a naive
// reference written out independently, a hand-computed case, gradient checks in f64 for x and
// gamma (row-major, strided and NHWC x), float against double, autograd::rms_norm and
// nn::RMSNorm, and bad input (exception type, message naming the op and the shapes).
#include "bad_input.hpp"
#include "gradcheck.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/core/cast.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/nn/rms_norm.hpp"
#include "cutrain/ops/rms_norm.hpp"

namespace cutrain_test_rms_norm {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {
Shape trailing(const Shape& s, int k) { return Shape(std::vector<std::int64_t>(s.dims().end() - k, s.dims().end())); }
Shape leading(const Shape& s, int k) { return Shape(std::vector<std::int64_t>(s.dims().begin(), s.dims().end() - k)); }

// y and inv_rms from the definition, in logical (row-major) order: every output element
// recomputes its row's mean square from scratch.
struct Reference {
  std::vector<double> y, inv_rms;
};
Reference reference(const Tensor<double>& x, const Tensor<double>& gamma, double eps) {
  const auto xv = x.to_vector(), g = gamma.to_vector();
  const std::size_t d = g.size(), rows = xv.size() / d;
  Reference r{std::vector<double>(xv.size()), std::vector<double>(rows)};
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const std::size_t row = i / d;
    double ms = 0;
    for (std::size_t j = 0; j < d; ++j) ms += xv[row * d + j] * xv[row * d + j] / static_cast<double>(d);
    r.inv_rms[row] = 1.0 / std::sqrt(ms + eps);
    r.y[i] = xv[i] * g[i % d] / std::sqrt(ms + eps);
  }
  return r;
}

struct Case {
  Shape shape;
  int k;  // normalized dims
};
}  // namespace

TEST_CASE("rms_norm_forward: hand-computed [2,2]") {
  // Rows (3, 4) and (0, 1): mean squares 12.5 and 0.5; eps 0.5 makes them 13 and 1.
  auto x = Tensor<double>::from_vector({3, 4, 0, 1}, Shape{2, 2});
  auto gamma = Tensor<double>::from_vector({1, 2}, Shape{2});
  auto f = ops::rms_norm_forward(x, gamma, 0.5);
  const double s = std::sqrt(13.0);
  require_close(f.y, {3 / s, 8 / s, 0, 2}, 1e-15);
  require_close(f.inv_rms, {1 / s, 1}, 1e-15);
  // The default eps is torch's layer-norm default, 1e-5.
  require_close(ops::rms_norm_forward(x, gamma).inv_rms, {1 / std::sqrt(12.5 + 1e-5), 1 / std::sqrt(0.5 + 1e-5)},
                1e-15);
}

TEST_CASE("rms_norm over the trailing k dims matches the naive reference; inv_rms has the leading shape") {
  const std::vector<Case> cases = {{{6}, 1},       {{5, 4}, 1},       {{5, 4}, 2},       {{3, 4, 5}, 1},
                                   {{3, 4, 5}, 2}, {{3, 4, 5}, 3},    {{2, 3, 4, 5}, 1}, {{2, 3, 4, 5}, 2},
                                   {{2, 3, 4, 5}, 3}, {{2, 3, 4, 5}, 4}, {{7, 1}, 1}};
  for (const Case& c : cases) {
    Rng rng(2000 + static_cast<std::uint64_t>(c.shape.numel() * 4 + c.k));
    auto x = Tensor<double>::uniform(c.shape, rng, -3.0, 3.0);
    auto gamma = Tensor<double>::uniform(trailing(c.shape, c.k), rng, -1.5, 1.5);
    INFO("x " << x.describe() << " normalized " << gamma.shape());
    for (const double eps : {1e-5, 0.25}) {
      auto f = ops::rms_norm_forward(x, gamma, eps);
      const Reference want = reference(x, gamma, eps);
      CHECK(f.y.shape() == c.shape);
      CHECK(f.inv_rms.shape() == leading(c.shape, c.k));
      require_close(f.y, want.y, 1e-12);
      require_close(f.inv_rms, want.inv_rms, 1e-12);
    }
  }
}

TEST_CASE("gradcheck: rms_norm dx and dgamma over the last 1 and 2 dims of rank-2 to rank-4 x") {
  const std::vector<Case> cases = {{{4, 7}, 1},       {{4, 7}, 2},       {{3, 4, 5}, 1},
                                   {{3, 4, 5}, 2},    {{2, 3, 4, 5}, 1}, {{2, 3, 4, 5}, 2},
                                   {{1, 9}, 1},       {{3, 5, 7, 3}, 3}};
  for (const Case& c : cases) {
    for (const int variant : {0, 1, 2}) {  // row-major, strided (transposed), nhwc
      if (variant == 2 && c.shape.rank() != 4) continue;
      Rng rng(2100 + static_cast<std::uint64_t>(c.shape.numel() * 4 + c.k + variant * 7));
      const int r = c.shape.rank();
      Tensor<double> backing, x;
      if (variant == 1) {
        Shape st = c.shape;
        std::swap(st[0], st[r - 1]);
        backing = random(st, rng);
        x = transpose(backing, 0, r - 1);
      } else {
        x = random(c.shape, rng, variant == 2 ? Layout::nhwc : Layout::row_major);
      }
      const Shape ns = trailing(c.shape, c.k);
      auto gamma = Tensor<double>::uniform(ns, rng, -1.5, 1.5);
      auto dy = random(c.shape, rng, variant == 2 ? Layout::nhwc : Layout::row_major);
      auto forward = [&] { return ops::rms_norm_forward(x, gamma).y; };
      auto f = ops::rms_norm_forward(x, gamma);
      if (variant == 2) CHECK(f.y.layout() == Layout::nhwc);
      require_close(f.y, reference(x.contiguous(Layout::row_major), gamma, 1e-5).y, 1e-12);
      auto g = ops::rms_norm_backward(x, dy, gamma, f.inv_rms);
      CHECK(g.dx.shape() == c.shape);
      CHECK(g.dgamma.shape() == ns);
      if (variant == 2) CHECK(g.dx.layout() == Layout::nhwc);
      const std::string name = detail::cat("rms_norm ", c.shape, " last ", c.k, variant == 1 ? " strided" : "",
                                           variant == 2 ? " nhwc" : "");
      gradcheck(name + " dx", x, forward, g.dx, dy);
      gradcheck(name + " dgamma", gamma, forward, g.dgamma, dy);
    }
  }
}

TEST_CASE("gradcheck: rms_norm with a large eps and rows near zero") {
  // eps dominates the mean square here: the eps term of the derivative must be right too.
  Rng rng(2200);
  auto x = Tensor<double>::uniform({3, 6}, rng, -0.05, 0.05);
  auto gamma = Tensor<double>::uniform({6}, rng, 0.5, 1.5);
  auto dy = random({3, 6}, rng);
  auto forward = [&] { return ops::rms_norm_forward(x, gamma, 0.01).y; };
  auto f = ops::rms_norm_forward(x, gamma, 0.01);
  auto g = ops::rms_norm_backward(x, dy, gamma, f.inv_rms);
  gradcheck("rms_norm eps 0.01 small x dx", x, forward, g.dx, dy);
  gradcheck("rms_norm eps 0.01 small x dgamma", gamma, forward, g.dgamma, dy);
}

TEST_CASE("rms_norm: float matches double") {
  Rng rng(2300);
  auto x = random({4, 6, 32}, rng), dy = random({4, 6, 32}, rng);
  auto gamma = Tensor<double>::uniform({32}, rng, 0.5, 1.5);
  auto f = ops::rms_norm_forward(x, gamma);
  auto g = ops::rms_norm_backward(x, dy, gamma, f.inv_rms);
  auto xf = cast<float>(x), dyf = cast<float>(dy), gf = cast<float>(gamma);
  auto ff = ops::rms_norm_forward(xf, gf);
  auto gff = ops::rms_norm_backward(xf, dyf, gf, ff.inv_rms);
  require_close(ff.y, f.y.to_vector(), 1e-5);
  require_close(ff.inv_rms, f.inv_rms.to_vector(), 1e-5);
  require_close(gff.dx, g.dx.to_vector(), 1e-5);
  require_close(gff.dgamma, g.dgamma.to_vector(), 1e-4);
}

TEST_CASE("autograd::rms_norm and nn::RMSNorm over the last dim of [B, T, C]") {
  nn::RMSNorm<double> norm({.shape = {5}});
  CHECK(norm.weight.value().to_vector() == std::vector<double>(5, 1.0));
  std::vector<std::string> names;
  norm.visit_params("norm", [&](const std::string& n, autograd::Var<double>&) { names.push_back(n); });
  CHECK(names == std::vector<std::string>{"norm.weight"});

  Rng rng(2400);
  norm.weight.value().assign(Tensor<double>::uniform({5}, rng, 0.5, 1.5).to_vector());
  auto xv = random({2, 3, 5}, rng);
  auto dy = random({2, 3, 5}, rng);
  auto x = autograd::parameter(xv.clone());
  auto y = norm(x);
  require_close(y.value(), reference(xv, norm.weight.value(), 1e-5).y, 1e-12);
  y.backward(dy);
  auto gamma = norm.weight.value().clone();
  auto forward = [&] { return ops::rms_norm_forward(xv, gamma).y; };
  gradcheck("nn::RMSNorm [2,3,5] dx", xv, forward, x.grad(), dy);
  gradcheck("nn::RMSNorm [2,3,5] dgamma", gamma, forward, norm.weight.grad(), dy);

  // eps from the options; a gamma that needs no gradient gets none.
  nn::RMSNorm<double> wide({.shape = {3, 5}, .eps = 0.5});
  auto x2 = autograd::parameter(xv.clone());
  auto y2 = wide(x2);
  require_close(y2.value(), reference(xv, wide.weight.value(), 0.5).y, 1e-12);
  auto g_const = autograd::Var<double>(Tensor<double>::full({5}, 2.0));
  auto x3 = autograd::parameter(xv.clone());
  auto y3 = autograd::rms_norm(x3, g_const);
  y3.backward(dy);
  CHECK(!g_const.grad().defined());
  auto g2 = Tensor<double>::full({5}, 2.0);
  auto forward3 = [&] { return ops::rms_norm_forward(xv, g2).y; };
  gradcheck("autograd::rms_norm const gamma dx", xv, forward3, x3.grad(), dy);
}

TEST_CASE("rms_norm: bad input names the op and the shapes") {
  using F = Tensor<float>;
  auto z = [](const Shape& s) { return F::zeros(s); };
  auto ones = [](const Shape& s) { return F::full(s, 1.0f); };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto x = z({2, 3, 4});
  const auto f = ops::rms_norm_forward(ones({2, 3, 4}), ones({4}));
  run_cases({
      bad<InvalidArgument>("gamma not x's trailing dims", "rms_norm_forward", {"[4,3]", "[2,3,4]", "trailing"},
                           [&] { (void)ops::rms_norm_forward(x, ones({4, 3})); }),
      bad<InvalidArgument>("gamma with more dims than x", "rms_norm_forward", {"[1,2,3,4]", "1 to 3 dims"},
                           [&] { (void)ops::rms_norm_forward(x, ones({1, 2, 3, 4})); }),
      bad<InvalidArgument>("gamma 0-d", "rms_norm_forward", {"gamma", "[2,3,4]"},
                           [&] { (void)ops::rms_norm_forward(x, F::full(Shape{}, 1.0f)); }),
      bad<InvalidArgument>("x 0-d", "rms_norm_forward", {"at least 1 dim"},
                           [&] { (void)ops::rms_norm_forward(F::full(Shape{}, 1.0f), ones({1})); }),
      bad<InvalidArgument>("x undefined", "rms_norm_forward", {"x", "undefined"},
                           [&] { (void)ops::rms_norm_forward(F{}, ones({4})); }),
      bad<InvalidArgument>("gamma undefined", "rms_norm_forward", {"gamma", "undefined"},
                           [&] { (void)ops::rms_norm_forward(x, F{}); }),
      bad<InvalidArgument>("zero dim", "rms_norm_forward", {"no elements"},
                           [&] { (void)ops::rms_norm_forward(z({2, 0, 4}), ones({4})); }),
      bad<InvalidArgument>("eps 0", "rms_norm_forward", {"eps", "0"}, [&] { (void)ops::rms_norm_forward(x, ones({4}), 0.0); }),
      bad<InvalidArgument>("eps -1", "rms_norm_forward", {"eps", "-1"},
                           [&] { (void)ops::rms_norm_forward(x, ones({4}), -1.0); }),
      bad<InvalidArgument>("eps NaN", "rms_norm_forward", {"eps", "nan"},
                           [&] { (void)ops::rms_norm_forward(x, ones({4}), nan); }),
      bad<NotImplemented>("f16 on the CPU", "rms_norm_forward", {"f16"},
                          [] { (void)ops::rms_norm_forward(Tensor<half>::zeros({2, 3}), Tensor<half>::zeros({3})); }),
      bad<NotImplemented>("gamma in another dtype", "rms_norm_forward", {"f32", "f64"},
                          [&] { (void)ops::rms_norm_forward(x, Tensor<double>::full({4}, 1.0)); }),
      bad<InvalidArgument>("dy shape", "rms_norm_backward", {"dy", "[2,3,5]", "[2,3,4]"},
                           [&] { (void)ops::rms_norm_backward(x, z({2, 3, 5}), ones({4}), f.inv_rms); }),
      bad<InvalidArgument>("inv_rms shape", "rms_norm_backward", {"inv_rms", "[2]", "[2,3]"},
                           [&] { (void)ops::rms_norm_backward(x, x, ones({4}), ones({2})); }),
      bad<InvalidArgument>("backward gamma not trailing", "rms_norm_backward", {"[3]", "[2,3,4]"},
                           [&] { (void)ops::rms_norm_backward(x, x, ones({3}), f.inv_rms); }),
      bad<InvalidArgument>("autograd gamma undefined", "autograd::rms_norm", {"gamma is an undefined"},
                           [] { (void)autograd::rms_norm(autograd::parameter(F::full({2, 3}, 0.5f)), autograd::Var<float>{}); }),
      bad<InvalidArgument>("RMSNorm empty shape", "nn::RMSNorm", {"at least one dim"},
                           [] { nn::RMSNorm<float> n({.shape = {}}); }),
      bad<InvalidArgument>("RMSNorm negative dim", "nn::RMSNorm", {"[3,-2]"},
                           [] { nn::RMSNorm<float> n({.shape = {3, -2}}); }),
      bad<InvalidArgument>("RMSNorm eps 0", "nn::RMSNorm", {"eps"},
                           [] { nn::RMSNorm<float> n({.shape = {3}, .eps = 0.0}); }),
      bad<InvalidArgument>("RMSNorm on the wrong width", "rms_norm_forward", {"[3]", "[2,4]"}, [] {
        nn::RMSNorm<float> n({.shape = {3}});
        (void)n(autograd::parameter(F::full({2, 4}, 0.5f)));
      }),
  });
}

}  // namespace cutrain_test_rms_norm
