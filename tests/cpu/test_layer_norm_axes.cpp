// Layer norm over the last 1, 2 or 3 dims of rank-1 to rank-4 tensors (gamma's shape is the
// normalized shape): a hand-rolled reference, gradient checks in f64 for x, gamma and beta
// (row-major, strided and NHWC x), nn::LayerNorm over the last dim, and bad shapes.
#include "gradcheck.hpp"

#include <cmath>
#include <vector>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/nn/layer_norm.hpp"
#include "cutrain/ops/layer_norm.hpp"

namespace cutrain_test_layer_norm_axes {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {
Shape trailing(const Shape& s, int k) {
  return Shape(std::vector<std::int64_t>(s.dims().end() - k, s.dims().end()));
}

// y over rows of d = gamma.numel() logical elements, in double, two passes.
std::vector<double> reference(const Tensor<double>& x, const Tensor<double>& gamma, const Tensor<double>& beta,
                              double eps) {
  const auto xv = x.to_vector(), g = gamma.to_vector(), b = beta.to_vector();
  const std::size_t d = g.size();
  std::vector<double> y(xv.size());
  for (std::size_t base = 0; base < xv.size(); base += d) {
    double mean = 0, var = 0;
    for (std::size_t j = 0; j < d; ++j) mean += xv[base + j];
    mean /= static_cast<double>(d);
    for (std::size_t j = 0; j < d; ++j) var += (xv[base + j] - mean) * (xv[base + j] - mean);
    var /= static_cast<double>(d);
    for (std::size_t j = 0; j < d; ++j) y[base + j] = g[j] * (xv[base + j] - mean) / std::sqrt(var + eps) + b[j];
  }
  return y;
}

struct Case {
  Shape shape;
  int k;  // normalized dims
};

const std::vector<Case> cases = {
    {{3, 4, 5}, 1}, {{3, 4, 5}, 2}, {{3, 4, 5}, 3}, {{2, 3, 4, 5}, 1}, {{2, 3, 4, 5}, 2},
    {{2, 3, 4, 5}, 3}, {{6}, 1},     {{5, 4}, 2},    {{2, 3, 4, 5}, 4},
};
}  // namespace

TEST_CASE("layer_norm over the trailing k dims matches a reference; mean and inv_std have the leading shape") {
  for (const Case& c : cases) {
    Rng rng(1000 + static_cast<std::uint64_t>(c.shape.numel() * 4 + c.k));
    auto x = Tensor<double>::uniform(c.shape, rng, -3.0, 3.0);
    const Shape ns = trailing(c.shape, c.k);
    auto gamma = Tensor<double>::uniform(ns, rng, 0.5, 1.5);
    auto beta = random(ns, rng);
    INFO("x " << x.describe() << " normalized " << ns);
    auto f = ops::layer_norm_forward(x, gamma, beta, 1e-5);
    require_close(f.y, reference(x, gamma, beta, 1e-5), 1e-12);
    const Shape lead(std::vector<std::int64_t>(c.shape.dims().begin(), c.shape.dims().end() - c.k));
    CHECK(f.mean.shape() == lead);
    CHECK(f.inv_std.shape() == lead);
  }
}

TEST_CASE("gradcheck: layer_norm over the last 1, 2, 3 dims of rank-3 and rank-4 x") {
  for (const Case& c : cases) {
    for (const int variant : {0, 1, 2}) {  // row-major, strided (transposed), nhwc
      if (variant == 2 && c.shape.rank() != 4) continue;
      Rng rng(1100 + static_cast<std::uint64_t>(c.shape.numel() * 4 + c.k + variant * 7));
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
      auto gamma = Tensor<double>::uniform(ns, rng, 0.5, 1.5);
      auto beta = random(ns, rng);
      auto dy = random(c.shape, rng);
      auto forward = [&] { return ops::layer_norm_forward(x, gamma, beta).y; };
      auto f = ops::layer_norm_forward(x, gamma, beta);
      if (variant == 2) CHECK(f.y.layout() == Layout::nhwc);
      require_close(f.y, reference(x.contiguous(Layout::row_major), gamma, beta, 1e-5), 1e-12);
      auto g = ops::layer_norm_backward(x, dy, gamma, f.mean, f.inv_std);
      CHECK(g.dgamma.shape() == ns);
      CHECK(g.dbeta.shape() == ns);
      const std::string name = detail::cat("layer_norm ", c.shape, " last ", c.k, variant == 1 ? " strided" : "",
                                           variant == 2 ? " nhwc" : "");
      gradcheck(name + " dx", x, forward, g.dx, dy);
      gradcheck(name + " dgamma", gamma, forward, g.dgamma, dy);
      gradcheck(name + " dbeta", beta, forward, g.dbeta, dy);
    }
  }
}

TEST_CASE("nn::LayerNorm over the last dim of [B, T, C], autograd") {
  nn::LayerNorm<double> ln({.shape = {5}});
  Rng rng(1200);
  ln.weight.value().assign(Tensor<double>::uniform({5}, rng, 0.5, 1.5).to_vector());
  ln.bias.value().assign(random({5}, rng).to_vector());
  auto xv = random({2, 3, 5}, rng);
  auto dy = random({2, 3, 5}, rng);
  auto x = autograd::parameter(xv.clone());
  auto y = ln(x);
  require_close(y.value(), reference(xv, ln.weight.value(), ln.bias.value(), 1e-5), 1e-12);
  y.backward(dy);
  auto gamma = ln.weight.value().clone(), beta = ln.bias.value().clone();
  auto forward = [&] { return ops::layer_norm_forward(xv, gamma, beta).y; };
  gradcheck("nn::LayerNorm [2,3,5] dx", xv, forward, x.grad(), dy);
  gradcheck("nn::LayerNorm [2,3,5] dgamma", gamma, forward, ln.weight.grad(), dy);
  gradcheck("nn::LayerNorm [2,3,5] dbeta", beta, forward, ln.bias.grad(), dy);
}

TEST_CASE("layer_norm trailing dims: bad shapes name the op and both shapes") {
  Rng rng(1300);
  auto x = random({2, 3, 4}, rng);
  auto check_msg = [](auto&& call, const std::vector<std::string>& needles) {
    try {
      call();
      FAIL("no throw");
    } catch (const InvalidArgument& e) {
      const std::string w = e.what();
      for (const auto& n : needles) {
        INFO("want " << n << " in " << w);
        CHECK(w.find(n) != std::string::npos);
      }
    }
  };
  auto g34 = Tensor<double>::full({3, 4}, 1.0), b34 = Tensor<double>::zeros({3, 4});
  check_msg([&] { (void)ops::layer_norm_forward(x, Tensor<double>::full({4, 3}, 1.0), b34); },
            {"layer_norm_forward", "[4,3]", "[2,3,4]", "trailing"});
  check_msg([&] { (void)ops::layer_norm_forward(x, Tensor<double>::full({1, 2, 3, 4}, 1.0), b34); },
            {"layer_norm_forward", "[1,2,3,4]", "1 to 3 dims"});
  check_msg([&] { (void)ops::layer_norm_forward(x, Tensor<double>::full(Shape{}, 1.0), b34); },
            {"layer_norm_forward", "gamma"});
  check_msg([&] { (void)ops::layer_norm_forward(x, g34, Tensor<double>::zeros({4})); }, {"layer_norm_forward", "beta"});
  auto f = ops::layer_norm_forward(x, g34, b34);
  check_msg([&] { (void)ops::layer_norm_backward(x, x, g34, Tensor<double>::zeros({2, 3}), f.inv_std); },
            {"layer_norm_backward", "mean", "[2]"});
  check_msg([&] { (void)ops::layer_norm_backward(x, random({2, 3, 5}, rng), g34, f.mean, f.inv_std); },
            {"layer_norm_backward", "dy"});
  check_msg([&] { (void)ops::layer_norm_forward(Tensor<double>::zeros({2, 0, 4}), Tensor<double>::full({4}, 1.0),
                                                Tensor<double>::zeros({4})); },
            {"layer_norm_forward", "no elements"});
}

}  // namespace cutrain_test_layer_norm_axes
