// act(batch_norm(x) + residual) as one op (ops::batch_norm_act_*, autograd::batch_norm_act): the
// same values as batch norm, add and activation apart; its backward against finite differences in
// f64; ResidualBlock and Sequential with fusion on against fusion off; bad input.
#include "gradcheck.hpp"

#include <string>
#include <vector>

#include "cutrain/autograd.hpp"
#include "cutrain/nn.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/batch_norm.hpp"
#include "cutrain/ops/elementwise.hpp"

namespace cutrain_test_batch_norm_act {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {

const ActivationParams relu{.kind = Activation::relu};
const ActivationParams identity{.kind = Activation::identity};

struct Case {
  Shape shape;
  Layout layout;
  bool residual;
  ActivationParams act;
  std::string name;
};

std::vector<Case> cases() {
  return {{{3, 4, 5, 2}, Layout::nchw, true, relu, "nchw residual relu"},
          {{3, 4, 5, 2}, Layout::nhwc, true, relu, "nhwc residual relu"},
          {{2, 5, 3, 3}, Layout::nhwc, false, relu, "nhwc relu"},
          {{4, 3, 2, 3}, Layout::nchw, true, identity, "nchw residual identity"},
          {{6, 5}, Layout::row_major, true, relu, "2-d residual relu"}};
}

}  // namespace

TEST_CASE("batch_norm_act_forward_training: the values of batch norm, add and activation apart") {
  Rng rng(31);
  for (const auto& c : cases()) {
    INFO(c.name);
    const std::int64_t C = c.shape[1];
    auto x = random(c.shape, rng, c.layout), r = random(c.shape, rng, c.layout);
    auto gamma = random(Shape{C}, rng), beta = random(Shape{C}, rng);
    auto rm = random(Shape{C}, rng), rv = Tensor<double>::uniform(Shape{C}, rng, 0.5, 2.0);
    auto rm2 = rm.clone(), rv2 = rv.clone();
    const BatchNormParams p{.momentum = 0.2, .eps = 1e-4};
    auto fused = ops::batch_norm_act_forward_training(x, gamma, beta, rm, rv, p, c.act,
                                                      c.residual ? r.view() : Tensor<double>{});
    auto plain = ops::batch_norm_forward_training(x, gamma, beta, rm2, rv2, p);
    Tensor<double> want = c.residual ? ops::add(plain.y, r) : plain.y.view();
    want = ops::activation_forward(want, c.act);
    require_close(fused.y, want.to_vector(), 1e-12);
    require_close(fused.save_mean, plain.save_mean.to_vector(), 1e-12);
    require_close(fused.save_inv_std, plain.save_inv_std.to_vector(), 1e-12);
    require_close(rm, rm2.to_vector(), 1e-12);
    require_close(rv, rv2.to_vector(), 1e-12);
  }
}

TEST_CASE("gradcheck: batch_norm_act_backward dx, dgamma, dbeta, dresidual") {
  Rng rng(37);
  for (const auto& c : cases()) {
    const std::int64_t C = c.shape[1];
    auto x = random(c.shape, rng, c.layout), res = random(c.shape, rng, c.layout);
    auto gamma = random(Shape{C}, rng), beta = random(Shape{C}, rng);
    auto rm = Tensor<double>::zeros(Shape{C}), rv = Tensor<double>::full(Shape{C}, 1.0);
    const auto dy = random(c.shape, rng);  // the projection: L = <dy, y>
    const BatchNormParams p{};
    auto forward = [&] {
      return ops::batch_norm_act_forward_training(x, gamma, beta, rm, rv, p, c.act,
                                                  c.residual ? res.view() : Tensor<double>{});
    };
    auto f = forward();
    auto g = ops::batch_norm_act_backward(x, f.y, dy, gamma, f.save_mean, f.save_inv_std, c.act, c.residual);
    REQUIRE(g.dresidual.defined() == c.residual);
    const auto y_of = [&] { return forward().y; };
    gradcheck("batch_norm_act " + c.name + " dx", x, y_of, g.dx, dy);
    gradcheck("batch_norm_act " + c.name + " dgamma", gamma, y_of, g.dgamma, dy);
    gradcheck("batch_norm_act " + c.name + " dbeta", beta, y_of, g.dbeta, dy);
    if (c.residual) gradcheck("batch_norm_act " + c.name + " dresidual", res, y_of, g.dresidual, dy);
  }
}

TEST_CASE("nn::ResidualBlock: fused batch norms give the unfused block's values and gradients", "[autograd]") {
  for (const bool projection : {false, true}) {
    INFO((projection ? "projection shortcut" : "identity shortcut"));
    const nn::ResidualBlockOptions o{.in = 3, .out = projection ? 4 : 3, .stride = projection ? 2 : 1, .seed = 5};
    nn::ResidualBlock<double> a(o), b(o);
    b.set_fusion(false);
    Rng rng(41);
    auto xt = random(Shape{2, 3, 6, 6}, rng, Layout::nhwc);
    auto xa = autograd::parameter(xt.clone()), xb = autograd::parameter(xt.clone());
    Var<double> ya = a(xa), yb = b(xb);
    require_close(ya.value(), yb.value().to_vector(), 1e-12);
    const auto seed = random(ya.shape(), rng);
    ya.backward(seed.clone());
    yb.backward(seed.clone());
    require_close(xa.grad(), xb.grad().to_vector(), 1e-12);
    auto pa = a.named_parameters(), pb = b.named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (std::size_t i = 0; i < pa.size(); ++i) {
      INFO(pa[i].first);
      require_close(pa[i].second.grad(), pb[i].second.grad().to_vector(), 1e-12);
    }
    require_close(a.bn2.running_var, b.bn2.running_var.to_vector(), 1e-12);
    // Eval mode runs the composition: the same values again.
    a.eval();
    b.eval();
    autograd::NoGradGuard ng;
    require_close(a(xa).value(), b(xb).value().to_vector(), 1e-12);
  }
}

TEST_CASE("nn::Sequential: BatchNorm2d + ReLU fused gives the unfused values and gradients", "[autograd]") {
  auto make = [&] {
    Rng r(3);
    return nn::Sequential<double>{nn::Conv2d<double>({.in = 2, .out = 4, .kernel = 3, .padding = 1}, r),
                                  nn::BatchNorm2d<double>({.features = 4}), nn::ReLU{}, nn::Flatten{}};
  };
  auto a = make(), b = make();
  b.set_fusion(false);
  Rng rng(43);
  auto x = random(Shape{3, 2, 4, 4}, rng);
  Var<double> ya = a(x), yb = b(x);
  require_close(ya.value(), yb.value().to_vector(), 1e-12);
  const auto seed = random(ya.shape(), rng);
  ya.backward(seed.clone());
  yb.backward(seed.clone());
  auto pa = a.parameters(), pb = b.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) require_close(pa[i].grad(), pb[i].grad().to_vector(), 1e-12);
}

TEST_CASE("batch_norm_act: bad input") {
  Rng rng(47);
  auto x = random(Shape{2, 3, 4, 4}, rng), gamma = random(Shape{3}, rng), beta = random(Shape{3}, rng);
  auto rm = random(Shape{3}, rng), rv = Tensor<double>::full(Shape{3}, 1.0);
  const auto rm0 = rm.to_vector();
  constexpr auto op = "batch_norm_act_forward_training";
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_act_forward_training(x, gamma, beta, rm, rv, {}, relu,
                                                                 random(Shape{2, 3, 4, 5}, rng)),
                            InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_act_forward_training(x, gamma, beta, rm, rv, {},
                                                                 {.kind = Activation::gelu_erf}),
                            NotImplemented, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_act_forward_training(x, random(Shape{4}, rng), beta, rm, rv, {}, relu),
                            InvalidArgument, op);
  require_close(rm, rm0);  // nothing was written
  auto f = ops::batch_norm_act_forward_training(x, gamma, beta, rm, rv, {}, relu);
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_act_backward(x, f.y, random(Shape{2, 3, 4, 3}, rng), gamma, f.save_mean,
                                                         f.save_inv_std, relu, false),
                            InvalidArgument, "batch_norm_act_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::batch_norm_act_backward(x, f.y, f.y, gamma, f.save_mean, f.save_inv_std,
                                                         {.kind = Activation::silu}, false),
                            NotImplemented, "batch_norm_act_backward");
  auto xv = autograd::parameter(x.clone()), g = autograd::parameter(gamma.clone()), b = autograd::parameter(beta.clone());
  CUTRAIN_REQUIRE_THROWS_OP(autograd::batch_norm_act(xv, g, b, rm, rv, true, {}, {.kind = Activation::tanh}),
                            NotImplemented, "autograd::batch_norm_act");
}

}  // namespace cutrain_test_batch_norm_act
