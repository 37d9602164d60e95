// Fusion graphs (core/fusion.hpp, ops/fusion.hpp) on the CPU: the builder's checks and text, shape
// inference, the GPU description's ranks and strides, and ops::Fusion's values against
// references written out element by element (conv + bias + residual + relu, matmul + bias +
// gelu, a frozen batch norm's scale and shift + relu, layer and RMS norm with a scale and an
// activation) in f64; autograd::fused's gradients
// against finite differences in f64; every bad input's error.
#include "bad_input.hpp"
#include "gradcheck.hpp"

#include <cmath>
#include <vector>

#include "cutrain/autograd/functions/fusion.hpp"
#include "cutrain/ops/fusion.hpp"

namespace cutrain_test_fusion {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

// g: y = relu(conv2d(x, w) + bias + residual).
fusion::Graph residual_block(const Conv2dParams& p) {
  fusion::Graph g;
  auto x = g.input("x"), w = g.input("w"), b = g.input("bias"), r = g.input("residual");
  g.output(g.relu(g.add(g.add(g.conv2d(x, w, p), b), r)), "y");
  return g;
}

double gelu(double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }

}  // namespace

TEST_CASE("fusion graph: text, shapes and the GPU description", "[fusion]") {
  const Conv2dParams p{.stride_h = 2, .stride_w = 2, .pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  const auto g = residual_block(p);
  CHECK(g.describe() == "y = relu(add(add(conv2d(x, w), bias), residual))");
  CHECK(g.has(fusion::NodeKind::conv2d));
  CHECK_FALSE(g.has(fusion::NodeKind::matmul));
  CHECK(fusion::described_rank(g) == 4);
  const auto s = fusion::infer_shapes(g, {Shape{2, 3, 9, 9}, Shape{8, 3, 3, 3}, Shape{1, 8, 1, 1}, Shape{2, 8, 5, 5}}, "t");
  REQUIRE(s.size() == g.nodes().size());
  CHECK(s[4] == Shape{2, 8, 5, 5});  // conv2d
  CHECK(s.back() == Shape{2, 8, 5, 5});

  fusion::Graph m;
  auto a = m.input("a"), w = m.input("w"), b = m.input("b");
  m.output(m.gelu(m.add(m.matmul(a, w), b)), "y");
  CHECK(fusion::described_rank(m) == 3);
  CHECK(fusion::infer_shapes(m, {Shape{4, 6, 5}, Shape{5, 7}, Shape{7}}, "t").back() == Shape{4, 6, 7});
  CHECK(fusion::infer_shapes(m, {Shape{6, 5}, Shape{5, 7}, Shape{1, 7}}, "t").back() == Shape{6, 7});

  // Leading dims of 1 keep the memory: a [K] bias at rank 4, a [M, N] matrix at rank 3.
  const auto [d1, s1] = fusion::at_rank(Shape{8}, Strides{1}, 4);
  CHECK(d1 == Shape{1, 1, 1, 8});
  CHECK(s1 == Strides{8, 8, 8, 1});
  const auto [d2, s2] = fusion::at_rank(Shape{6, 7}, Strides{7, 1}, 3);
  CHECK(d2 == Shape{1, 6, 7});
  CHECK(s2 == Strides{42, 7, 1});
  CHECK(fusion::packed_strides(Shape{2, 8, 5, 5}, true) == Strides{200, 1, 40, 8});
  CHECK(fusion::packed_strides(Shape{2, 8, 5, 5}, false) == Strides{200, 25, 5, 1});
  CHECK(fusion::packed_strides(Shape{4, 6, 7}, true) == Strides{42, 7, 1});

  // key_text (plan files, the tuning cache) tells apart what describe() writes alike.
  const auto leaky = [](double alpha, double scale) {
    fusion::Graph l;
    l.output(l.scale(l.activation(l.input("x"), {.kind = Activation::leaky_relu, .alpha = alpha}), scale), "y");
    return l;
  };
  CHECK(leaky(0.1, 2).describe() == leaky(0.2, 2).describe());
  CHECK(leaky(0.1, 2).key_text() != leaky(0.2, 2).key_text());
  CHECK(leaky(0.1, 1.0 / 3).key_text() != leaky(0.1, 1.0 / 3 + 1e-15).key_text());
  CHECK(residual_block(p).key_text() != residual_block({}).key_text());
  CHECK(residual_block(p).key_text() == g.key_text());
}

TEST_CASE("fusion: conv + bias + residual + relu equals its reference (f64)", "[fusion]") {
  Rng rng(11);
  for (const Layout l : {Layout::row_major, Layout::nhwc}) {
    const Conv2dParams p{.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
    auto x = random({2, 3, 6, 5}, rng, l), w = random({4, 3, 3, 3}, rng, l);
    auto b = random({1, 4, 1, 1}, rng), r = random({2, 4, 6, 5}, rng, l);
    const ops::Fusion f(residual_block(p));
    const auto out = f(x, w, b, r);
    REQUIRE(out.size() == 1);
    const auto c = cpu::conv2d_forward(x, w, p);
    REQUIRE(out[0].shape() == c.shape());
    for (std::int64_t n = 0; n < 2; ++n)
      for (std::int64_t k = 0; k < 4; ++k)
        for (std::int64_t i = 0; i < 6; ++i)
          for (std::int64_t j = 0; j < 5; ++j) {
            const double want = std::max(0.0, c(n, k, i, j) + b(0, k, 0, 0) + r(n, k, i, j));
            CHECK(out[0](n, k, i, j) == Approx(want).margin(1e-12));
          }
  }
}

TEST_CASE("fusion: empty inputs give empty outputs", "[fusion]") {
  Rng rng(16);
  fusion::Graph g;
  auto x = g.input("x"), b = g.input("b");
  g.output(g.relu(g.add(x, b)), "y");
  const ops::Fusion f(std::move(g));
  const auto out = f(random({0, 3, 4, 4}, rng), random({1, 3, 1, 1}, rng));
  REQUIRE(out.size() == 1);
  CHECK(out[0].shape() == Shape{0, 3, 4, 4});
}

TEST_CASE("fusion: matmul + bias + gelu, and a frozen batch norm + relu (f64)", "[fusion]") {
  Rng rng(12);
  fusion::Graph m;
  auto a = m.input("a"), wt = m.input("w"), bias = m.input("bias");
  auto pre = m.add(m.matmul(a, wt), bias);
  m.output(m.gelu(pre), "y");
  m.output(pre, "pre");  // two outputs: the activation's input too, as a backward would want
  const ops::Fusion f(std::move(m));
  auto A = random({3, 4, 5}, rng), W = random({5, 6}, rng), B = random({6}, rng);
  const auto out = f(A, W, B);
  REQUIRE(out.size() == 2);
  REQUIRE(out[0].shape() == Shape{3, 4, 6});
  for (std::int64_t bi = 0; bi < 3; ++bi)
    for (std::int64_t i = 0; i < 4; ++i)
      for (std::int64_t j = 0; j < 6; ++j) {
        double acc = B(j);
        for (std::int64_t k = 0; k < 5; ++k) acc += A(bi, i, k) * W(k, j);
        CHECK(out[1](bi, i, j) == Approx(acc).margin(1e-12));
        CHECK(out[0](bi, i, j) == Approx(gelu(acc)).margin(1e-12));
      }

  // y = relu(x * scale + shift) with per-channel scale and shift, 0.5 scaled: inference batch norm.
  fusion::Graph n;
  auto x = n.input("x"), s = n.input("scale"), t = n.input("shift");
  n.output(n.relu(n.add(n.mul(n.scale(x, 0.5), s), t)), "y");
  const ops::Fusion bn(std::move(n));
  auto X = random({2, 3, 4, 4}, rng, Layout::nhwc), S = random({1, 3, 1, 1}, rng), T = random({1, 3, 1, 1}, rng);
  const auto y = std::move(bn(X, S, T)[0]);
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t c = 0; c < 3; ++c)
      for (std::int64_t h = 0; h < 4; ++h)
        for (std::int64_t w = 0; w < 4; ++w)
          CHECK(y(i, c, h, w) ==
                Approx(std::max(0.0, 0.5 * X(i, c, h, w) * S(0, c, 0, 0) + T(0, c, 0, 0))).margin(1e-12));
}

// g: y = silu(layer_norm(x, gamma, beta) * s), s a per-sample, per-channel modulation [N, C, 1, 1].
fusion::Graph modulated_norm() {
  fusion::Graph g;
  auto x = g.input("x"), gamma = g.input("gamma"), beta = g.input("beta"), s = g.input("s");
  g.output(g.silu(g.mul(g.layer_norm(x, gamma, beta, 1e-3), s)), "y");
  return g;
}

TEST_CASE("fusion: layer norm + modulation + silu, rms norm + scale + relu (f64)", "[fusion]") {
  Rng rng(15);
  const ops::Fusion f(modulated_norm());
  CHECK(f.graph().describe() == "y = silu(mul(layer_norm(x, gamma, beta), s))");
  CHECK(f.graph().f32_inputs() == std::vector<bool>{false, true, true, false});
  auto X = random({2, 3, 2, 4}, rng), G = random({3, 2, 4}, rng), B = random({3, 2, 4}, rng), S = random({2, 3, 1, 1}, rng);
  const auto y = std::move(f(X, G, B, S)[0]);
  REQUIRE(y.shape() == X.shape());
  const auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  for (std::int64_t n = 0; n < 2; ++n) {
    double mean = 0, var = 0;
    for (std::int64_t i = 0; i < 24; ++i) mean += X.flat(n * 24 + i) / 24;
    for (std::int64_t i = 0; i < 24; ++i) var += (X.flat(n * 24 + i) - mean) * (X.flat(n * 24 + i) - mean) / 24;
    for (std::int64_t c = 0; c < 3; ++c)
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t w = 0; w < 4; ++w) {
          const double ln = (X(n, c, h, w) - mean) / std::sqrt(var + 1e-3) * G(c, h, w) + B(c, h, w);
          CHECK(y(n, c, h, w) == Approx(silu(ln * S(n, c, 0, 0))).margin(1e-12));
        }
  }

  fusion::Graph r;
  auto x = r.input("x"), gamma = r.input("gamma");
  r.output(r.relu(r.scale(r.rms_norm(x, gamma, 1e-4), 1.5)), "y");
  const ops::Fusion rf(std::move(r));
  auto X2 = random({3, 5, 1, 1}, rng), G2 = random({5, 1, 1}, rng);
  const auto y2 = std::move(rf(X2, G2)[0]);
  for (std::int64_t n = 0; n < 3; ++n) {
    double ms = 0;
    for (std::int64_t c = 0; c < 5; ++c) ms += X2(n, c, 0, 0) * X2(n, c, 0, 0) / 5;
    for (std::int64_t c = 0; c < 5; ++c)
      CHECK(y2(n, c, 0, 0) == Approx(std::max(0.0, 1.5 * G2(c, 0, 0) * X2(n, c, 0, 0) / std::sqrt(ms + 1e-4))).margin(1e-12));
  }
}

TEST_CASE("autograd::fused: every input's gradient matches finite differences (f64)", "[fusion][autograd]") {
  Rng rng(14);
  const auto check = [&](const std::string& name, const ops::Fusion& f, std::vector<Tensor<double>> x) {
    std::vector<autograd::Var<double>> v;
    for (auto& t : x) v.emplace_back(t.view(), true);
    auto y = autograd::fused(f, v);
    auto r = random(y.value().shape(), rng);
    y.backward(r);
    for (std::size_t i = 0; i < x.size(); ++i)
      gradcheck(name + " d" + f.graph().nodes()[static_cast<std::size_t>(f.graph().inputs()[i])].name, x[i],
                [&] { return std::move(f(x)[0]); }, v[i].grad(), r, 1e-6);
  };
  check("residual block", ops::Fusion(residual_block({.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1})),
        tensors(random({2, 3, 5, 4}, rng), random({4, 3, 3, 3}, rng), random({1, 4, 1, 1}, rng), random({2, 4, 5, 4}, rng)));
  fusion::Graph m;
  auto a = m.input("a"), w = m.input("w"), b = m.input("bias"), s = m.input("s");
  m.output(m.tanh(m.scale(m.sub(m.gelu(m.add(m.matmul(a, w), b)), s), 0.7)), "y");
  check("matmul mlp", ops::Fusion(std::move(m)), tensors(random({2, 3, 4}, rng), random({4, 5}, rng), random({5}, rng),
                                                           random({3, 1}, rng)));
  check("modulated layer norm", ops::Fusion(modulated_norm()),
        tensors(random({2, 3, 2, 2}, rng), random({3, 2, 2}, rng), random({3, 2, 2}, rng), random({2, 3, 1, 1}, rng)));
  // Inputs that need no gradient get none; with none needing one, no graph is recorded.
  const ops::Fusion f(residual_block({}));
  std::vector<autograd::Var<double>> v{autograd::Var<double>(random({1, 2, 4, 4}, rng), true),
                                       autograd::Var<double>(random({3, 2, 3, 3}, rng)),
                                       autograd::Var<double>(random({1, 3, 1, 1}, rng)),
                                       autograd::Var<double>(random({1, 3, 2, 2}, rng))};
  auto y = autograd::fused(f, v);
  REQUIRE(y.requires_grad());
  {
    autograd::NoGradGuard off;  // the backward's recomputation records its graph all the same
    y.backward(random(y.value().shape(), rng));
  }
  CHECK(v[0].grad().defined());
  CHECK_FALSE(v[1].grad().defined());
  v[0] = autograd::Var<double>(v[0].value().view());
  CHECK_FALSE(autograd::fused(f, v).requires_grad());
}

TEST_CASE("autograd::fused with backward graphs: dgrad, wgrad, relu backward, bias sum (f64)", "[fusion][autograd]") {
  Rng rng(15);
  const Conv2dParams p{.stride_h = 2, .stride_w = 2, .pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  const Shape xs{2, 3, 7, 6}, ws{4, 3, 3, 3}, ys{2, 4, 4, 3};
  const ops::Fusion f(residual_block(p));
  // dresidual = relu'(y) * dy (relu's derivative read from its output), dbias its sum over
  // N, H, W; dx and dw from it: three graphs, as cuDNN fuses them (a dgrad and a wgrad do not
  // share a graph).
  fusion::Graph a, b, c;
  {
    auto dy = a.input("dy"), y = a.input("y");
    auto dr = a.activation_backward(dy, y, {.kind = Activation::relu});
    a.output(dr, "dresidual");
    a.output(a.sum_to(dr, Shape{1, 4, 1, 1}), "dbias");
    auto d = b.input("dresidual"), w = b.input("w");
    b.output(b.conv2d_dgrad(d, w, p, xs), "dx");
    auto d2 = c.input("dresidual"), x = c.input("x");
    c.output(c.conv2d_wgrad(d2, x, p, ws), "dw");
  }
  CHECK(a.describe() == "%2 = relu_backward(dy, y); dresidual = %2; dbias = sum_to(%2, [1,4,1,1])");
  CHECK_FALSE(a.differentiable());
  const std::vector<ops::Fusion> backward{ops::Fusion(a), ops::Fusion(b), ops::Fusion(c)};
  auto x = random(xs, rng), w = random(ws, rng), bias = random({1, 4, 1, 1}, rng), r = random(ys, rng);
  const auto vars = [&] {
    return std::vector{autograd::Var<double>(x.view(), true), autograd::Var<double>(w.view(), true),
                       autograd::Var<double>(bias.view(), true), autograd::Var<double>(r.view(), true)};
  };
  auto user = vars(), unfused = vars();
  auto seed = random(ys, rng);
  auto yu = autograd::fused(f, user, backward);
  auto yf = autograd::fused(f, unfused);
  yu.backward(seed);
  yf.backward(seed);
  for (std::size_t i = 0; i < 4; ++i) {
    const auto gu = user[i].grad().to_vector(), gf = unfused[i].grad().to_vector();
    REQUIRE(gu.size() == gf.size());
    for (std::size_t k = 0; k < gu.size(); ++k) CHECK(gu[k] == Approx(gf[k]).margin(1e-12));
  }
  run_cases({
      bad<InvalidArgument>("unknown name", "autograd::fused", {"backward graph 0", "takes 'dz'"},
                           [&] {
                             fusion::Graph g;
                             g.output(g.relu(g.input("dz")), "dx");
                             autograd::fused(f, vars(), std::vector{ops::Fusion(std::move(g))});
                           }),
      bad<InvalidArgument>("a gradient nobody gives", "autograd::fused", {"input 'w' needs a gradient", "'dw'"},
                           [&] {
                             autograd::fused(f, vars(), std::vector{backward[0], backward[1]}).backward(seed);
                           }),
      bad<NotImplemented>("backward nodes, no backward graphs", "autograd::fused", {"give its backward graphs"},
                          [&] {
                            autograd::fused(backward[2], std::vector{autograd::Var<double>(seed.view(), true),
                                                                     autograd::Var<double>(x.view(), true)});
                          }),
      bad<InvalidArgument>("dgrad of the wrong dy", "fusion", {"node 2: cutrain::conv2d_dgrad", "dy [2,4,5,3]"},
                           [&] { backward[1](random({2, 4, 5, 3}, rng), w); }),
      bad<InvalidArgument>("sum_to a shape that is not below", "fusion", {"node 1: cutrain::sum_to", "cannot sum"},
                           [&] {
                             fusion::Graph g;
                             g.output(g.sum_to(g.input("v"), Shape{1, 5, 1, 1}), "s");
                             ops::Fusion(std::move(g))(seed);
                           }),
  });
}

TEST_CASE("fusion: bad graphs and bad inputs name the pattern and the reason", "[fusion][bad_input]") {
  Rng rng(13);
  auto x = random({2, 3, 6, 6}, rng), w = random({4, 3, 3, 3}, rng), b = random({1, 4, 1, 1}, rng);
  auto r = random({2, 4, 4, 4}, rng);
  const ops::Fusion f(residual_block({}));
  const ops::Fusion mn(modulated_norm());
  run_cases({
      bad<InvalidArgument>("output is an input", "fusion::Graph::output", {"'x' is an input"},
                           [] {
                             fusion::Graph g;
                             g.output(g.input("x"), "y");
                           }),
      bad<InvalidArgument>("value of another graph", "fusion::Graph", {"activation", "value 3 is not of this graph"},
                           [] {
                             fusion::Graph g;
                             g.relu(fusion::Value{3});
                           }),
      bad<InvalidArgument>("value of another graph whose id exists here", "fusion::Graph",
                           {"add", "value 0 is not of this graph", "another graph made it"},
                           [] {
                             fusion::Graph g, h;
                             const auto x = g.input("x");
                             const auto y = h.input("y");
                             h.add(x, y);
                           }),
      bad<InvalidArgument>("repeated input name", "fusion::Graph", {"'x' is taken"},
                           [] {
                             fusion::Graph g;
                             g.input("x");
                             g.input("x");
                           }),
      bad<InvalidArgument>("no outputs", "ops::Fusion", {"no outputs"},
                           [] {
                             fusion::Graph g;
                             g.relu(g.input("x"));
                             ops::Fusion{std::move(g)};
                           }),
      bad<InvalidArgument>("a node that reaches no output", "ops::Fusion", {"node 1 (relu(a)) reaches no output"},
                           [] {
                             fusion::Graph g;
                             auto a = g.input("a");
                             g.relu(a);
                             g.output(g.tanh(a), "y");
                             ops::Fusion{std::move(g)};
                           }),
      bad<InvalidArgument>("scale by NaN", "fusion::Graph", {"alpha must be finite"},
                           [] {
                             fusion::Graph g;
                             g.scale(g.input("a"), std::nan(""));
                           }),
      bad<InvalidArgument>("unfused with too many inputs", "fusion_unfused", {"takes 4 inputs, got 5"},
                           [&] {
                             std::vector<Tensor<double>> in;
                             for (int i = 0; i < 5; ++i) in.push_back(x.view());
                             ops::fusion_unfused(f.graph(), std::span<const Tensor<double>>(in));
                           }),
      bad<InvalidArgument>("unused input", "ops::Fusion", {"input 'b' reaches no output"},
                           [] {
                             fusion::Graph g;
                             auto a = g.input("a");
                             g.input("b");
                             g.output(g.relu(a), "y");
                             ops::Fusion{std::move(g)};
                           }),
      bad<NotImplemented>("conv and matmul", "ops::Fusion", {"not both"},
                          [] {
                            fusion::Graph g;
                            auto a = g.input("a"), k = g.input("k"), m = g.input("m");
                            g.output(g.matmul(g.conv2d(a, k), m), "y");
                            ops::Fusion{std::move(g)};
                          }),
      bad<InvalidArgument>("norm eps", "fusion::Graph", {"layer_norm", "eps must be finite and > 0"},
                           [] {
                             fusion::Graph g;
                             g.layer_norm(g.input("x"), g.input("g"), g.input("b"), 0.0);
                           }),
      bad<InvalidArgument>("norm gamma used elsewhere", "ops::Fusion", {"takes g, a norm's parameter or statistic"},
                           [] {
                             fusion::Graph g;
                             auto x = g.input("x"), gm = g.input("g");
                             g.output(g.add(g.rms_norm(x, gm), gm), "y");
                             ops::Fusion{std::move(g)};
                           }),
      bad<InvalidArgument>("computed gamma", "ops::Fusion", {"must be graph inputs or norms' results"},
                           [] {
                             fusion::Graph g;
                             auto x = g.input("x"), gm = g.input("g");
                             g.output(g.rms_norm(x, g.relu(gm)), "y");
                             ops::Fusion{std::move(g)};
                           }),
      bad<NotImplemented>("norm and matmul", "ops::Fusion", {"no matmul"},
                          [] {
                            fusion::Graph g;
                            auto x = g.input("x"), gm = g.input("g"), m = g.input("m");
                            g.output(g.matmul(g.rms_norm(x, gm), m), "y");
                            ops::Fusion{std::move(g)};
                          }),
      bad<InvalidArgument>("norm of a 2-d x", "fusion", {"layer_norm", "must be 4-d", "[rows, D, 1, 1]"},
                           [&] { mn(random({4, 6}, rng), random({6}, rng), random({6}, rng), random({4, 6}, rng)); }),
      bad<InvalidArgument>("norm gamma shape", "fusion", {"gamma [3,2]", "[3,2,2]"},
                           [&] {
                             mn(random({2, 3, 2, 2}, rng), random({3, 2}, rng), random({3, 2, 2}, rng),
                                random({2, 3, 1, 1}, rng));
                           }),
      bad<InvalidArgument>("too few inputs", "fusion", {"takes 4 inputs, got 3"}, [&] { f(x, w, b); }),
      bad<InvalidArgument>("undefined input", "fusion", {"bias"}, [&] { f(x, w, Tensor<double>{}, r); }),
      bad<InvalidArgument>("residual shape", "fusion", {"node 6: cutrain::add", "[2,4,4,4]", "[2,4,5,5]"},
                           [&] { f(x, w, b, random({2, 4, 5, 5}, rng)); }),
      bad<InvalidArgument>("conv channels", "fusion", {"node 4: cutrain::conv2d", "channels"},
                           [&] { f(x, random({4, 2, 3, 3}, rng), b, r); }),
      bad<NotImplemented>("rank above 4", "fusion", {"rank <= 4"},
                          [&] {
                            fusion::Graph g;
                            auto a = g.input("a");
                            g.output(g.relu(a), "y");
                            ops::Fusion(std::move(g))(random({1, 2, 1, 2, 2}, rng));
                          }),
      bad<NotImplemented>("autograd with two outputs", "autograd::fused", {"2 outputs"},
                          [&] {
                            fusion::Graph g;
                            auto a = g.input("a");
                            g.output(g.relu(a), "y");
                            g.output(g.tanh(a), "z");
                            autograd::fused(ops::Fusion(std::move(g)), std::vector{autograd::Var<double>(x.view(), true)});
                          }),
      bad<InvalidArgument>("matmul inner dims", "fusion", {"node 2: cutrain::matmul", "inner dims 5 and 4 differ"},
                           [&] {
                             fusion::Graph g;
                             auto a = g.input("a"), k = g.input("k");
                             g.output(g.matmul(a, k), "y");
                             ops::Fusion(std::move(g))(random({3, 5}, rng), random({4, 2}, rng));
                           }),
  });
}

}  // namespace cutrain_test_fusion
