// Modules, optimizers and schedules: parameter names, seeded init, train/eval, state_dict round
// trips, SGD/AdamW steps against hand-computed values, LR schedules at known points, global-norm
// clipping, and a short CPU training run on a fixed seed that must reduce the loss.
#include "gradcheck.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "cutrain/nn.hpp"

namespace cutrain_test_nn_optim {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {

Var<double> param(const std::vector<double>& v) {
  return autograd::parameter(Tensor<double>::from_vector(v, Shape{static_cast<std::int64_t>(v.size())}));
}
void set_grad(const Var<double>& p, const std::vector<double>& g) {
  p.grad() = Tensor<double>::from_vector(g, p.shape());
}

nn::Sequential<float> small_cnn(std::uint64_t seed) {
  return nn::Sequential<float>{nn::Conv2d<float>({.in = 1, .out = 4, .kernel = 3, .padding = 1, .seed = seed}),
                               nn::BatchNorm2d<float>({.features = 4}), nn::ReLU{}, nn::MaxPool2d({.kernel = 2}),
                               nn::Flatten{}, nn::Linear<float>({.in = 4 * 4 * 4, .out = 2, .seed = seed + 1})};
}

}  // namespace

TEST_CASE("nn: named parameters, buffers and state_dict keys", "[nn]") {
  nn::Sequential<float> net{nn::Conv2d<float>({.in = 1, .out = 2, .kernel = 3}), nn::BatchNorm2d<float>({.features = 2}),
                            nn::ReLU{}, nn::Flatten{}, nn::Linear<float>({.in = 8, .out = 3, .bias = false})};
  std::vector<std::string> names;
  for (auto& [n, v] : net.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "4.weight"});
  CHECK(net.parameters().size() == 5);
  CHECK(net.named_parameters("net").front().first == "net.0.weight");
  const auto sd = net.state_dict();
  CHECK(sd.size() == 7);
  CHECK(sd.count("1.running_mean") == 1);
  CHECK(sd.count("1.running_var") == 1);
  CHECK(sd.at("0.weight").shape() == Shape{2, 1, 3, 3});
  // parameters() are handles: changing one changes the module.
  net.parameters()[1].value().fill(7.0f);
  CHECK(net.at<nn::Conv2d<float>>(0).bias.value().to_vector()[0] == 7.0f);
}

TEST_CASE("nn: init is seeded and scaled as Kaiming / Xavier", "[nn]") {
  nn::Conv2d<double> a({.in = 3, .out = 4, .kernel = 3, .seed = 1}), b({.in = 3, .out = 4, .kernel = 3, .seed = 1}),
      c({.in = 3, .out = 4, .kernel = 3, .seed = 2});
  CHECK(a.weight.value().to_vector() == b.weight.value().to_vector());
  CHECK(a.weight.value().to_vector() != c.weight.value().to_vector());
  Rng r1(5), r2(5);
  nn::Linear<double> d({.in = 4, .out = 4}, r1), e({.in = 4, .out = 4}, r2);
  CHECK(d.weight.value().to_vector() == e.weight.value().to_vector());
  auto variance = [](const Tensor<double>& t) {
    double s = 0, s2 = 0;
    const auto v = t.to_vector();
    for (double x : v) s += x, s2 += x * x;
    const double m = s / static_cast<double>(v.size());
    return s2 / static_cast<double>(v.size()) - m * m;
  };
  for (auto kind : {nn::Init::kaiming_uniform, nn::Init::kaiming_normal}) {
    nn::Linear<double> l({.in = 1000, .out = 400, .init = kind, .seed = 3});
    CHECK(variance(l.weight.value()) == Approx(2.0 / 1000).epsilon(0.05));
    require_close(l.bias.value(), std::vector<double>(400, 0.0));
  }
  for (auto kind : {nn::Init::xavier_uniform, nn::Init::xavier_normal}) {
    nn::Linear<double> l({.in = 1000, .out = 500, .init = kind, .seed = 3});
    CHECK(variance(l.weight.value()) == Approx(2.0 / 1500).epsilon(0.05));
  }
  CUTRAIN_REQUIRE_THROWS_OP(nn::Conv2d<float>({.in = 0, .out = 4}), InvalidArgument, "nn::Conv2d");
  CUTRAIN_REQUIRE_THROWS_OP(nn::AdaptiveAvgPool2d(2), NotImplemented, "AdaptiveAvgPool2d");
}

TEST_CASE("nn: train() and eval() switch batch norm and dropout", "[nn]") {
  nn::Sequential<double> net{nn::BatchNorm2d<double>({.features = 1}), nn::Dropout({.p = 0.5, .seed = 1})};
  Rng rng(1);
  Tensor<double> x = Tensor<double>::uniform(Shape{4, 1, 2, 2}, rng, 1.0, 3.0);
  CHECK(net.is_training());
  net(x);
  auto& bn = net.at<nn::BatchNorm2d<double>>(0);
  const double m1 = bn.running_mean.to_vector()[0];
  CHECK(m1 > 0.1);  // momentum 0.1 towards a batch mean near 2
  net.eval();
  CHECK_FALSE(net.is_training());
  Var<double> in(x.view());
  Var<double> y1 = net(in), y2 = net(in);
  CHECK(bn.running_mean.to_vector()[0] == m1);
  CHECK(y1.value().to_vector() == y2.value().to_vector());  // no dropout in eval
  net.train();
  Var<double> y3 = net(in);
  int zeros = 0;
  for (double v : y3.value().to_vector()) zeros += v == 0.0;
  CHECK(zeros > 0);
  CHECK(net.at<nn::Dropout>(1).calls() == 2);  // once per call in training, never in eval
}

TEST_CASE("nn: state_dict round trip, shape checks and strictness", "[nn]") {
  auto a = small_cnn(1), b = small_cnn(100);
  Rng rng(3);
  Tensor<float> x;
  Tensor<std::int32_t> y;
  make_batch(rng, 8, x, y);
  a(x);  // moves a's running statistics
  auto sd = a.state_dict();
  b.load_state_dict(sd);
  a.eval();
  b.eval();
  require_close(b(x).value(), [&] { auto v = a(x).value().to_vector(); return std::vector<double>(v.begin(), v.end()); }(), 0);
  // The export is a copy.
  const float before = sd.at("0.weight").to_vector()[0];
  a.parameters()[0].value().fill(3.0f);
  CHECK(sd.at("0.weight").to_vector()[0] == before);

  auto bad = a.state_dict();
  bad.at("5.weight") = Tensor<float>::zeros(Shape{2, 63});
  const auto w_before = b.parameters()[0].value().to_vector();
  CUTRAIN_REQUIRE_THROWS_OP(b.load_state_dict(bad), InvalidArgument, "load_state_dict");
  CHECK(b.parameters()[0].value().to_vector() == w_before);  // nothing copied
  auto missing = a.state_dict();
  missing.erase("1.running_var");
  CUTRAIN_REQUIRE_THROWS_OP(b.load_state_dict(missing), InvalidArgument, "load_state_dict");
  b.load_state_dict(missing, /*strict=*/false);
  CHECK(b.parameters()[0].value().to_vector()[0] == 3.0f);
  auto extra = a.state_dict();
  extra.emplace("9.weight", Tensor<float>::zeros(Shape{1}));
  CUTRAIN_REQUIRE_THROWS_OP(b.load_state_dict(extra), InvalidArgument, "load_state_dict");
}

TEST_CASE("nn: to(device)", "[nn]") {
  auto net = small_cnn(1);
  net.to(Device::cpu());
  CHECK(net.parameters()[0].device() == Device::cpu());
  if constexpr (!built_with_cuda) CHECK_THROWS_AS(net.to(Device::cuda(0)), Error);
}

TEST_CASE("optim: SGD steps match hand-computed values", "[optim]") {
  SECTION("plain and weight decay") {
    auto w = param({1.0, -2.0});
    optim::SGD<double> opt({w}, {.lr = 0.1});
    set_grad(w, {0.5, 1.0});
    opt.step();
    require_close(w.value(), {0.95, -2.1}, 1e-12);
    auto v = param({1.0, -2.0});
    optim::SGD<double> wd({v}, {.lr = 0.1, .weight_decay = 0.1});
    set_grad(v, {0.5, 1.0});
    wd.step();
    require_close(v.value(), {0.94, -2.08}, 1e-12);
  }
  SECTION("momentum") {
    auto w = param({1.0, -2.0});
    optim::SGD opt(std::vector{w}, {.lr = 0.1, .momentum = 0.9});
    set_grad(w, {0.5, 1.0});
    opt.step();
    require_close(w.value(), {0.95, -2.1}, 1e-12);
    opt.step();
    require_close(w.value(), {0.855, -2.29}, 1e-12);
    require_close(opt.momentum_buffer(0), {0.95, 1.9}, 1e-12);
  }
  SECTION("nesterov") {
    auto w = param({1.0, -2.0});
    optim::SGD<double> opt({w}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
    set_grad(w, {0.5, 1.0});
    opt.step();
    require_close(w.value(), {0.905, -2.19}, 1e-12);
    opt.step();
    require_close(w.value(), {0.7695, -2.461}, 1e-12);
  }
  SECTION("zero_grad and parameters without a gradient") {
    auto w = param({1.0}), u = param({5.0});
    optim::SGD<double> opt({w, u}, {.lr = 1.0});
    set_grad(w, {0.25});
    opt.step();
    require_close(w.value(), {0.75});
    require_close(u.value(), {5.0});  // no gradient: untouched
    opt.zero_grad();
    CHECK_FALSE(w.grad().defined());
    CUTRAIN_REQUIRE_THROWS_OP(optim::SGD<double>({w}, {.nesterov = true}), InvalidArgument, "optim::SGD");
  }
}

TEST_CASE("optim: AdamW steps match hand-computed values", "[optim]") {
  auto w = param({1.0, -1.0});
  optim::AdamW<double> opt({w}, {.lr = 0.1, .weight_decay = 0.1});
  set_grad(w, {0.5, -0.5});
  opt.step();
  // Step 1: w *= 0.99; m = 0.05, v = 0.00025; update lr * m_hat / sqrt(v_hat) = 0.1.
  require_close(w.value(), {0.89, -0.89}, 1e-7);
  opt.step();
  // Step 2: w *= 0.99; m = 0.095, v = 0.00049975; m_hat / sqrt(v_hat) = 0.5 / 0.5 = 1.
  require_close(w.value(), {0.8811 - 0.1, -0.8811 + 0.1}, 1e-7);
  CHECK(opt.step_count(0) == 2);
  require_close(opt.exp_avg(0), {0.095, -0.095}, 1e-12);
  require_close(opt.exp_avg_sq(0), {0.00049975, 0.00049975}, 1e-12);
  // The general formula, with eps mattering.
  auto u = param({0.3});
  optim::AdamW<double> o2({u}, {.lr = 0.01, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-3, .weight_decay = 0.5});
  set_grad(u, {0.02});
  o2.step();
  const double m = 0.2 * 0.02, v = 0.1 * 0.0004;
  const double want = 0.3 * (1 - 0.005) - 0.01 / 0.2 * m / (std::sqrt(v) / std::sqrt(0.1) + 1e-3);
  require_close(u.value(), {want}, 1e-12);
}

TEST_CASE("optim: cosine and one-cycle schedules at known points", "[optim]") {
  const optim::CosineSchedule cos{.lr = 0.1, .total_steps = 100};
  CHECK(cos(0) == Approx(0.1));
  CHECK(cos(50) == Approx(0.05));
  CHECK(cos(25) == Approx(0.05 * (1 + std::sqrt(0.5))));
  CHECK(cos(100) == Approx(0.0).margin(1e-15));
  CHECK(cos(500) == Approx(0.0).margin(1e-15));
  const optim::CosineSchedule warm{.lr = 0.1, .total_steps = 110, .min_lr = 0.01, .warmup_steps = 10};
  CHECK(warm(0) == Approx(0.01));
  CHECK(warm(9) == Approx(0.1));
  CHECK(warm(10) == Approx(0.1));
  CHECK(warm(60) == Approx(0.055));
  CHECK(warm(110) == Approx(0.01));
  const optim::OneCycleSchedule one{.max_lr = 1.0, .total_steps = 100};
  CHECK(one(0) == Approx(0.04));
  CHECK(one(29) == Approx(1.0));
  CHECK(one(64) == Approx((1.0 + 4e-6) / 2));
  CHECK(one(99) == Approx(4e-6));
  CHECK(one(14) < one(15));
  CHECK(one(50) > one(51));
  CUTRAIN_REQUIRE_THROWS_OP((optim::CosineSchedule{.total_steps = 0})(0), InvalidArgument, "CosineSchedule");
}

TEST_CASE("optim: clip_grad_norm scales by the global norm", "[optim]") {
  auto a = param({0.0, 0.0}), b = param({0.0}), c = param({1.0});
  set_grad(a, {3.0, 4.0});
  set_grad(b, {12.0});
  // c has no gradient and is skipped.
  std::vector<Var<double>> ps{a, b, c};
  CHECK(optim::clip_grad_norm(ps, 20.0) == Approx(13.0));
  require_close(a.grad(), {3.0, 4.0});
  CHECK(optim::clip_grad_norm(ps, 6.5) == Approx(13.0));
  require_close(a.grad(), {1.5, 2.0}, 1e-6);
  require_close(b.grad(), {6.0}, 1e-6);
  CHECK_FALSE(c.grad().defined());
}

TEST_CASE("nn: a short CPU training run reduces the loss", "[nn][optim]") {
  auto net = small_cnn(42);
  net.to(Device::cpu());
  optim::AdamW opt(net.parameters(), {.lr = 1e-2, .weight_decay = 5e-4});
  const optim::CosineSchedule sched{.lr = 1e-2, .total_steps = 60, .warmup_steps = 5};
  Rng data(7);
  std::vector<float> losses;
  for (int step = 0; step < 60; ++step) {
    Tensor<float> x;
    Tensor<std::int32_t> y;
    make_batch(data, 32, x, y);
    auto loss = nn::cross_entropy(net(x), y);
    opt.zero_grad();
    loss.backward();
    optim::clip_grad_norm(opt.params(), 5.0);
    opt.set_lr(sched(step));
    opt.step();
    losses.push_back(loss.item());
  }
  const auto mean = [&](std::size_t from, std::size_t to) {
    double s = 0;
    for (std::size_t i = from; i < to; ++i) s += losses[i];
    return s / static_cast<double>(to - from);
  };
  INFO("first losses " << mean(0, 5) << ", last " << mean(55, 60));
  CHECK(mean(0, 5) > 0.5);
  CHECK(mean(55, 60) < 0.5 * mean(0, 5));
  // Held-out accuracy in eval mode, with no graph recorded.
  net.eval();
  autograd::NoGradGuard no_grad;
  Tensor<float> x;
  Tensor<std::int32_t> y;
  make_batch(data, 200, x, y);
  const auto logits = net(x).value().to_vector();
  const auto labels = y.to_vector();
  int correct = 0;
  for (std::size_t i = 0; i < labels.size(); ++i) correct += (logits[2 * i + 1] > logits[2 * i]) == (labels[i] == 1);
  CHECK(correct >= 180);
}

TEST_CASE("nn: resnet18_cifar, and a model moved to channels-last computes the same", "[nn]") {
  Rng init(3);
  auto net = nn::resnet18_cifar<float>(init);
  std::int64_t count = 0;
  for (const auto& p : net.parameters()) count += p.numel();
  CHECK(count == 11173962);  // torchvision-style CIFAR ResNet-18, 10 classes
  Rng rng(4);
  const auto x = Tensor<float>::uniform(Shape{2, 3, 8, 8}, rng, -1, 1);
  net.eval();
  autograd::NoGradGuard no_grad;
  const auto y = net(x).value().to_vector();
  REQUIRE(y.size() == 20);
  net.to(Layout::nhwc);
  for (auto& [name, p] : net.named_parameters())
    if (p.value().rank() == 4 && p.value().dim(2) > 1) {  // 1x1 kernels: nchw and nhwc are one layout
      INFO(name);
      CHECK(p.value().layout() == Layout::nhwc);
    }
  const auto y2 = net(x.contiguous(Layout::nhwc)).value().to_vector();
  for (std::size_t i = 0; i < y.size(); ++i) CHECK(y2[i] == Approx(y[i]).margin(1e-4));
  CUTRAIN_REQUIRE_THROWS_OP(net.to(Layout::row_major), InvalidArgument, "Module::to");
}

TEST_CASE("nn: Module::to lays out one-channel weights by their strides, both ways", "[nn]") {
  Rng init(5);
  auto net = nn::fashion_mnist_cnn<float>(init);
  auto w = net.named_parameters().front().second;  // the first conv's [32, 1, 3, 3]
  REQUIRE(w.value().shape() == Shape{32, 1, 3, 3});
  net.to(Layout::nhwc);
  CHECK(w.value().layout() == Layout::nchw);  // one channel: layout() cannot tell
  CHECK(is_channels_last(w.value().shape(), w.value().strides()));
  const float* before = w.value().data();
  net.to(Layout::nhwc);  // already there: not copied again
  CHECK(w.value().data() == before);
  net.to(Layout::nchw);
  CHECK_FALSE(is_channels_last(w.value().shape(), w.value().strides()));
  for (auto& [name, p] : net.named_parameters())
    if (p.value().rank() == 4) {
      INFO(name);
      CHECK_FALSE(is_channels_last(p.value().shape(), p.value().strides()));
    }
}

TEST_CASE("optim: AdamW parameter groups decay by their own weight_decay", "[optim]") {
  Rng rng(91);
  const auto make = [&](std::uint64_t seed) {
    Rng r(seed);
    return std::pair{autograd::parameter(Tensor<double>::uniform({3, 2}, r, -1, 1)),
                     autograd::parameter(Tensor<double>::uniform({4}, r, -1, 1))};
  };
  auto [a1, b1] = make(5);
  auto [a2, b2] = make(5);
  optim::AdamW<double> grouped({{{a1}, 0.3}, {{b1}, 0.0}}, {.lr = 0.1});
  optim::AdamW<double> only_a({a2}, {.lr = 0.1, .weight_decay = 0.3});
  optim::AdamW<double> only_b({b2}, {.lr = 0.1, .weight_decay = 0.0});
  CHECK(grouped.weight_decay(0) == 0.3);
  CHECK(grouped.weight_decay(1) == 0.0);
  for (int s = 0; s < 3; ++s) {
    const auto ga = Tensor<double>::uniform({3, 2}, rng, -1, 1), gb = Tensor<double>::uniform({4}, rng, -1, 1);
    a1.grad() = ga.clone();
    a2.grad() = ga.clone();
    b1.grad() = gb.clone();
    b2.grad() = gb.clone();
    grouped.step();
    only_a.step();
    only_b.step();
  }
  CHECK(a1.value().to_vector() == a2.value().to_vector());
  CHECK(b1.value().to_vector() == b2.value().to_vector());
  CHECK_THROWS_AS(optim::AdamW<double>({{{a1}, -1.0}}, {}), InvalidArgument);
}

}  // namespace cutrain_test_nn_optim
