// Activations: hand-computed forward values, gradient checks for every kind in both layouts,
// and bad input.
#include "gradcheck.hpp"

#include "cutrain/ops/activation.hpp"

namespace cutrain_test_activation {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

TEST_CASE("activation: hand-computed forward values") {
  auto x = Tensor<double>::from_vector({-2.0, -0.5, 0.0, 1.5}, {4});
  require_close(ops::activation_forward(x, {.kind = Activation::relu}), {0, 0, 0, 1.5});
  require_close(ops::activation_forward(x, {.kind = Activation::leaky_relu, .alpha = 0.1}), {-0.2, -0.05, 0, 1.5});
  require_close(ops::activation_forward(x, {.kind = Activation::elu, .alpha = 1.0}),
                {std::expm1(-2.0), std::expm1(-0.5), 0, 1.5});
  require_close(ops::activation_forward(x, {.kind = Activation::sigmoid}),
                {1 / (1 + std::exp(2.0)), 1 / (1 + std::exp(0.5)), 0.5, 1 / (1 + std::exp(-1.5))});
  require_close(ops::activation_forward(x, {.kind = Activation::tanh}), {std::tanh(-2.0), std::tanh(-0.5), 0, std::tanh(1.5)});
  // gelu(x) = x * Phi(x): Phi(-2) = 0.02275013194817921, Phi(-0.5) = 0.3085375387259869, Phi(1.5) = 0.9331927987311419
  require_close(ops::activation_forward(x, {.kind = Activation::gelu_erf}),
                {-2 * 0.02275013194817921, -0.5 * 0.3085375387259869, 0, 1.5 * 0.9331927987311419}, 1e-12);
  require_close(ops::activation_forward(x, {.kind = Activation::gelu_tanh}),
                {-0.04540230591222, -0.15428599017, 0, 1.39957226}, 1e-6);
  require_close(ops::activation_forward(x, {.kind = Activation::silu}),
                {-2 / (1 + std::exp(2.0)), -0.5 / (1 + std::exp(0.5)), 0, 1.5 / (1 + std::exp(-1.5))});
}

TEST_CASE("gradcheck: activation_backward, every kind, nchw and nhwc") {
  const Activation kinds[] = {Activation::relu,     Activation::leaky_relu, Activation::elu,
                              Activation::sigmoid,  Activation::tanh,       Activation::gelu_erf,
                              Activation::gelu_tanh, Activation::silu};
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    for (Activation k : kinds) {
      Rng rng(42 + static_cast<int>(k));
      auto x = random({2, 3, 5, 7}, rng, layout);
      // keep relu-like kinks away from finite-difference steps
      for (std::int64_t i = 0; i < x.numel(); ++i)
        if (std::abs(x.flat(i)) < 1e-3) x.flat(i) = 0.5;
      auto r = random(x.shape(), rng, layout);
      const ActivationParams a{.kind = k, .alpha = 0.2};
      auto dx = ops::activation_backward(x, r, a);
      CHECK(dx.layout() == layout);
      gradcheck(detail::cat("activation ", k, " ", layout), x, [&] { return ops::activation_forward(x, a); }, dx, r);
    }
  }
}

TEST_CASE("activation: bad input") {
  Rng rng(3);
  auto x = random({2, 3}, rng);
  auto dy = random({3, 2}, rng);
  CUTRAIN_REQUIRE_THROWS_OP(ops::activation_backward(x, dy, {}), InvalidArgument, "activation_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::activation_forward(Tensor<double>{}, {}), InvalidArgument, "activation_forward");
  auto h = Tensor<half>::zeros({2});
  CUTRAIN_REQUIRE_THROWS_OP(ops::activation_forward(h, {}), NotImplemented, "activation_forward");
}

}  // namespace cutrain_test_activation
