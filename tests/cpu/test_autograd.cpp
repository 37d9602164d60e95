// The tiny autograd on composite graphs, in f64: analytic gradients of every leaf against
// finite differences of the scalar loss (shared subexpressions, a residual block, the
// conv -> bn -> relu -> pool -> flatten -> linear -> cross_entropy chain), accumulation,
// no-grad, skipped inputs, and the errors for freed graphs and non-scalar roots.
#include "gradcheck.hpp"

#include <string>
#include <vector>

#include "cutrain/nn.hpp"

namespace cutrain_test_autograd {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {

Tensor<std::int32_t> labels(const std::vector<std::int32_t>& v) {
  return Tensor<std::int32_t>::from_vector(v, Shape{static_cast<std::int64_t>(v.size())});
}

// Checks d loss / d leaf for every leaf: loss_fn builds the scalar loss from the leaves' current
// values (called under NoGradGuard for the finite differences).
void check_leaves(const std::string& name, std::vector<std::pair<std::string, Var<double>>> leaves,
                  const std::function<Var<double>()>& loss_fn, double tol = 1e-6) {
  for (auto& [n, v] : leaves) v.zero_grad();
  Var<double> loss = loss_fn();
  REQUIRE(loss.numel() == 1);
  loss.backward();
  const Tensor<double> r = Tensor<double>::full(Shape{}, 1.0);
  for (auto& [n, v] : leaves) {
    INFO(name << ": leaf " << n);
    REQUIRE(v.grad().defined());
    const Tensor<double> analytic = v.grad().clone();
    gradcheck(name + " d/d " + n, v.value(), [&] {
      autograd::NoGradGuard ng;
      return loss_fn().value().view();
    }, analytic, r, tol, 60);
  }
}

}  // namespace

TEST_CASE("gradcheck: autograd shared subexpressions accumulate", "[autograd]") {
  Rng rng(11);
  auto x = autograd::parameter(random(Shape{3, 4}, rng));
  auto w = autograd::parameter(random(Shape{5, 4}, rng));
  auto lab = labels({0, 4, 2});
  // x feeds three ops and h two: gradients must be summed at both.
  auto loss_fn = [&] {
    Var<double> h = autograd::tanh(x);
    Var<double> s = autograd::add(autograd::multiply(h, x), autograd::scale(h, -0.5));
    return autograd::cross_entropy(autograd::linear(autograd::add(s, x), w), lab);
  };
  check_leaves("shared", {{"x", x}, {"w", w}}, loss_fn);
}

TEST_CASE("autograd: x*x + 3x has gradient 2x + 3", "[autograd]") {
  auto x = autograd::parameter(Tensor<double>::from_vector({1.0, -2.0, 0.5}, Shape{3}));
  Var<double> y = autograd::add(autograd::multiply(x, x), autograd::scale(x, 3.0));
  y.backward(Tensor<double>::full(Shape{3}, 1.0));
  require_close(x.grad(), {5.0, -1.0, 4.0});
  // x + x: one Var on both sides of an op.
  x.zero_grad();
  autograd::add(x, x).backward(Tensor<double>::full(Shape{3}, 1.0));
  require_close(x.grad(), {2.0, 2.0, 2.0});
}

TEST_CASE("autograd: an add's backward shares dy, but two leaves never share a gradient", "[autograd]") {
  auto a = autograd::parameter(Tensor<double>::from_vector({1.0, 2.0, 3.0, 4.0}, Shape{2, 2}));
  auto b = autograd::parameter(Tensor<double>::from_vector({5.0, 6.0, 7.0, 8.0}, Shape{4}));
  auto c = autograd::parameter(Tensor<double>::from_vector({1.0, 1.0, 1.0, 1.0}, Shape{4}));
  // Both inputs of the first add pass dy on as views (a reshape, then the leaf b); a and b
  // must get gradients of their own, as must c and the add's other input.
  Var<double> y = autograd::add(autograd::add(autograd::reshape(a, Shape{4}), b), c);
  y.backward(Tensor<double>::from_vector({1.0, 2.0, 3.0, 4.0}, Shape{4}));
  require_close(a.grad(), {1.0, 2.0, 3.0, 4.0});
  require_close(b.grad(), {1.0, 2.0, 3.0, 4.0});
  require_close(c.grad(), {1.0, 2.0, 3.0, 4.0});
  CHECK(a.grad().data() != b.grad().data());
  CHECK(b.grad().data() != c.grad().data());
  CHECK(a.grad().data() != c.grad().data());
  b.grad().data()[0] = 100.0;  // an in-place change (as GradScaler's unscale) reaches one leaf only
  CHECK(a.grad().data()[0] == 1.0);
  CHECK(c.grad().data()[0] == 1.0);
}

TEST_CASE("autograd: a leaf's gradient hook runs after each gradient added, once per use", "[autograd]") {
  auto w = autograd::parameter(Tensor<double>::from_vector({2.0, 3.0}, {2}));
  auto unused = autograd::parameter(Tensor<double>::zeros({2}));
  std::vector<double> seen;  // w's grad[0] at each call
  int unused_calls = 0;
  w.set_grad_hook([&] { seen.push_back(w.grad().flat(0)); });
  unused.set_grad_hook([&] { ++unused_calls; });
  autograd::sum(autograd::add(autograd::multiply(w, w), w)).backward();  // w used three times
  CHECK(seen.size() == 3);
  CHECK(seen.back() == 5.0);  // 2w + 1 at w = 2
  CHECK(unused_calls == 0);
  w.set_grad_hook(nullptr);
  autograd::sum(w).backward();
  CHECK(seen.size() == 3);
  const auto y = autograd::multiply(w, w);
  CHECK_THROWS_WITH(y.set_grad_hook([] {}), Catch::Contains("Var::set_grad_hook") && Catch::Contains("only leaves"));
}

TEST_CASE("gradcheck: autograd conv -> bn -> relu -> pool -> flatten -> linear -> cross_entropy", "[autograd]") {
  nn::Sequential<double> net{nn::Conv2d<double>({.in = 2, .out = 3, .kernel = 3, .padding = 1, .seed = 1}),
                             nn::BatchNorm2d<double>({.features = 3}), nn::ReLU{}, nn::MaxPool2d({.kernel = 2}),
                             nn::Flatten{}, nn::Linear<double>({.in = 3 * 3 * 3, .out = 4, .seed = 2})};
  Rng rng(5);
  auto x = autograd::parameter(random(Shape{4, 2, 6, 6}, rng));
  auto lab = labels({0, 3, 1, 2});
  auto leaves = net.named_parameters();
  REQUIRE(leaves.size() == 6);
  // BatchNorm's beta is zero and gamma one at init; move them off so the check sees their effect.
  net.at<nn::BatchNorm2d<double>>(1).weight.value().assign({0.7, 1.3, -0.9});
  net.at<nn::BatchNorm2d<double>>(1).bias.value().assign({0.1, -0.2, 0.3});
  leaves.emplace_back("x", x);
  check_leaves("cnn", leaves, [&] { return nn::cross_entropy(net(x), lab); });
}

TEST_CASE("gradcheck: autograd fused conv+relu, linear+relu, avg pool, dropout, global pool", "[autograd]") {
  nn::Sequential<double> net{nn::Conv2d<double>({.in = 1, .out = 2, .kernel = 3, .padding = 1, .seed = 3}),
                             nn::ReLU{},
                             nn::AvgPool2d({.kernel = 2}),
                             nn::Conv2d<double>({.in = 2, .out = 3, .kernel = 1, .seed = 4}),
                             nn::Activation({.kind = Activation::sigmoid}),
                             nn::AdaptiveAvgPool2d(1),
                             nn::Flatten{},
                             nn::Linear<double>({.in = 3, .out = 4, .seed = 5}),
                             nn::ReLU{},
                             nn::Linear<double>({.in = 4, .out = 3, .seed = 6})};
  Rng rng(8);
  auto x = autograd::parameter(random(Shape{3, 1, 4, 4}, rng));
  auto lab = labels({2, 0, 1});
  auto leaves = net.named_parameters();
  leaves.emplace_back("x", x);
  check_leaves("fused", leaves, [&] {
    return nn::cross_entropy(autograd::dropout(net(x), 0.3, /*seed=*/99), lab, {.label_smoothing = 0.1});
  });
}

TEST_CASE("autograd: fused and unfused Sequential agree", "[autograd]") {
  auto make = [] {
    return nn::Sequential<double>{nn::Conv2d<double>({.in = 1, .out = 2, .kernel = 3, .seed = 7}), nn::ReLU{},
                                  nn::Flatten{}, nn::Linear<double>({.in = 2 * 3 * 3, .out = 3, .seed = 8}), nn::ReLU{}};
  };
  auto a = make(), b = make();
  b.set_fusion(false);
  Rng rng(3);
  Tensor<double> xt = random(Shape{2, 1, 5, 5}, rng);
  Var<double> ya = a(xt), yb = b(xt);
  CHECK(std::string(ya.node()->name()) == "linear_activation");
  CHECK(std::string(yb.node()->name()) == "relu");
  require_close(ya.value(), yb.value().to_vector(), 1e-12);
  ya.backward(Tensor<double>::full(Shape{2, 3}, 1.0));
  yb.backward(Tensor<double>::full(Shape{2, 3}, 1.0));
  auto pa = a.parameters(), pb = b.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) require_close(pa[i].grad(), pb[i].grad().to_vector(), 1e-12);
}

TEST_CASE("gradcheck: autograd residual block with projection shortcut", "[autograd]") {
  nn::ResidualBlock<double> block({.in = 2, .out = 3, .stride = 2, .seed = 4});
  nn::Linear<double> head({.in = 3, .out = 2, .seed = 9});
  Rng rng(21);
  auto x = autograd::parameter(random(Shape{3, 2, 4, 4}, rng));
  auto lab = labels({1, 0, 1});
  auto leaves = block.named_parameters("block");
  REQUIRE(leaves.size() == 9);  // conv1, bn1 (2), conv2, bn2 (2), shortcut conv, shortcut bn (2)
  for (auto& [n, v] : head.named_parameters("head")) leaves.emplace_back(n, v);
  leaves.emplace_back("x", x);
  auto loss_fn = [&] { return nn::cross_entropy(head(autograd::flatten(autograd::global_avg_pool(block(x)))), lab); };
  check_leaves("residual", leaves, loss_fn);
}

TEST_CASE("gradcheck: autograd identity residual and layer norm", "[autograd]") {
  nn::ResidualBlock<double> block({.in = 2, .seed = 12});
  nn::LayerNorm<double> ln({.shape = {2, 3, 3}});
  ln.weight.value().assign(std::vector<double>(18, 0.8));
  Rng rng(2);
  auto x = autograd::parameter(random(Shape{2, 2, 3, 3}, rng));
  auto lab = labels({3, 7});
  auto leaves = block.named_parameters();
  for (auto& [n, v] : ln.named_parameters("ln")) leaves.emplace_back(n, v);
  leaves.emplace_back("x", x);
  check_leaves("identity residual", leaves,
               [&] { return nn::cross_entropy(autograd::flatten(ln(block(x))), lab); });
}

TEST_CASE("gradcheck: autograd batch norm in eval mode", "[autograd]") {
  nn::BatchNorm2d<double> bn({.features = 2});
  bn.running_mean.assign({0.3, -0.1});
  bn.running_var.assign({1.5, 0.4});
  bn.weight.value().assign({1.2, -0.7});
  bn.eval();
  Rng rng(4);
  auto x = autograd::parameter(random(Shape{2, 2, 2, 2}, rng));
  auto w = autograd::parameter(random(Shape{3, 8}, rng));
  auto lab = labels({0, 2});
  auto leaves = bn.named_parameters();
  leaves.emplace_back("x", x);
  leaves.emplace_back("w", w);
  check_leaves("bn eval", leaves, [&] { return nn::cross_entropy(autograd::linear(autograd::flatten(bn(x)), w), lab); });
  // Eval mode leaves the running statistics alone.
  require_close(bn.running_mean, {0.3, -0.1});
}

TEST_CASE("autograd: gradients accumulate across backward calls until zero_grad", "[autograd]") {
  auto w = autograd::parameter(Tensor<double>::from_vector({2.0, -1.0}, Shape{2}));
  auto x = Var<double>(Tensor<double>::from_vector({3.0, 4.0}, Shape{2}));
  auto seed = Tensor<double>::full(Shape{2}, 1.0);
  autograd::multiply(w, x).backward(seed);
  autograd::multiply(w, x).backward(seed);
  require_close(w.grad(), {6.0, 8.0});
  w.zero_grad();
  CHECK_FALSE(w.grad().defined());
  autograd::multiply(w, x).backward(seed);
  require_close(w.grad(), {3.0, 4.0});
}

TEST_CASE("autograd: inputs that need no gradient are skipped", "[autograd]") {
  Rng rng(1);
  auto x = Var<double>(random(Shape{2, 3}, rng));  // data: no gradient
  auto w = autograd::parameter(random(Shape{4, 3}, rng));
  auto b = Var<double>(random(Shape{4}, rng));  // frozen bias
  CHECK_FALSE(x.requires_grad());
  Var<double> y = autograd::linear(x, w, b);
  CHECK(y.requires_grad());
  CHECK_FALSE(y.is_leaf());
  autograd::cross_entropy(y, labels({1, 3})).backward();
  CHECK(w.grad().defined());
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(b.grad().defined());
  // Nothing requires grad: no node is recorded at all.
  Var<double> z = autograd::relu(x);
  CHECK(z.is_leaf());
  CHECK_FALSE(z.requires_grad());
  CUTRAIN_REQUIRE_THROWS_OP(autograd::cross_entropy(z, labels({0, 1})).backward(), InvalidArgument, "backward");
}

TEST_CASE("autograd: NoGradGuard records nothing and nests", "[autograd]") {
  auto w = autograd::parameter(Tensor<double>::from_vector({1.0, 2.0}, Shape{2}));
  CHECK(autograd::is_grad_enabled());
  {
    autograd::NoGradGuard outer;
    {
      autograd::NoGradGuard inner;
      CHECK_FALSE(autograd::is_grad_enabled());
    }
    CHECK_FALSE(autograd::is_grad_enabled());
    Var<double> y = autograd::scale(w, 2.0);
    CHECK(y.is_leaf());
    CHECK_FALSE(y.requires_grad());
    require_close(y.value(), {2.0, 4.0});
  }
  CHECK(autograd::is_grad_enabled());
  CHECK(autograd::scale(w, 2.0).requires_grad());
}

TEST_CASE("autograd: backward through a freed graph is a clear error; retain_graph keeps it", "[autograd]") {
  auto w = autograd::parameter(Tensor<double>::from_vector({0.5, -0.5, 1.0, 2.0}, Shape{2, 2}));
  Var<double> loss = autograd::cross_entropy(autograd::tanh(w), labels({0, 1}));
  loss.backward(/*retain_graph=*/true);
  const auto once = w.grad().to_vector();
  loss.backward();
  std::vector<double> twice;
  for (double g : once) twice.push_back(2 * g);
  require_close(w.grad(), twice, 1e-12);
  try {
    loss.backward();
    FAIL("backward through a freed graph did not throw");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("freed") != std::string::npos);
    CHECK(std::string(e.what()).find("retain_graph") != std::string::npos);
  }
  // A second root sharing the freed part of the graph fails the same way.
  Var<double> h = autograd::tanh(w);
  Var<double> l1 = autograd::cross_entropy(h, labels({0, 1}));
  Var<double> l2 = autograd::cross_entropy(h, labels({1, 0}));
  l1.backward();
  CUTRAIN_REQUIRE_THROWS_OP(l2.backward(), InvalidArgument, "backward");
}

TEST_CASE("autograd: a non-scalar root needs a seed gradient", "[autograd]") {
  auto w = autograd::parameter(Tensor<double>::from_vector({1.0, -2.0, 3.0}, Shape{3}));
  Var<double> y = autograd::relu(w);
  try {
    y.backward();
    FAIL("non-scalar backward without a seed did not throw");
  } catch (const InvalidArgument& e) {
    CHECK(std::string(e.what()).find("not a scalar") != std::string::npos);
  }
  CUTRAIN_REQUIRE_THROWS_OP(y.backward(Tensor<double>::full(Shape{2}, 1.0)), InvalidArgument, "backward");
  y.backward(Tensor<double>::from_vector({1.0, 1.0, 5.0}, Shape{3}));
  require_close(w.grad(), {1.0, 0.0, 5.0});
  // A leaf root: its own gradient is the seed.
  auto s = autograd::parameter(Tensor<double>::full(Shape{1}, 2.0));
  s.backward();
  require_close(s.grad(), {1.0});
}

TEST_CASE("autograd: a deep chain runs backward without recursion", "[autograd]") {
  auto w = autograd::parameter(Tensor<double>::full(Shape{1}, 1.0));
  Var<double> y = w;
  const int depth = 50000;
  for (int i = 0; i < depth; ++i) y = autograd::scale(y, i % 2 ? 1.0 : -1.0);
  y.backward();
  require_close(w.grad(), {1.0});
}

TEST_CASE("autograd: undefined Var and shapes are reported", "[autograd]") {
  Var<double> none;
  CHECK_FALSE(none.defined());
  CUTRAIN_REQUIRE_THROWS_OP(none.value(), InvalidArgument, "Var");
  auto a = autograd::parameter(Tensor<double>::zeros(Shape{2}));
  auto b = autograd::parameter(Tensor<double>::zeros(Shape{3}));
  CUTRAIN_REQUIRE_THROWS_OP(autograd::add(a, b), InvalidArgument, "add");
  Var<double> y = autograd::scale(a, 2.0);
  CUTRAIN_REQUIRE_THROWS_OP(y.set_requires_grad(false), InvalidArgument, "set_requires_grad");
}

}  // namespace cutrain_test_autograd
