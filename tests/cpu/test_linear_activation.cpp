// linear_activation_forward: equals linear_forward followed by activation_forward for every
// activation, with and without a bias, in f32 and f64; a hand-computed relu case; bad input;
// linear_residual_forward by hand and its bad input.
#include "gradcheck.hpp"

#include "cutrain/core/view.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/linear.hpp"

namespace cutrain_test_linear_activation {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

TEST_CASE("linear_activation_forward: hand-computed relu case") {
  auto x = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  auto w = Tensor<double>::from_vector({1, 0, -1, 0.5, 1, 2}, {2, 3});
  auto b = Tensor<double>::from_vector({0.5, -1}, {2});
  // x w^T + b = [[-1.5, 7.5], [-1.5, 18]] (see test_linear.cpp); relu clips the negatives.
  require_close(ops::linear_activation_forward(x, w, b, {.kind = Activation::relu}), {0, 7.5, 0, 18});
  require_close(ops::linear_activation_forward(x, w, b, {.kind = Activation::identity}), {-1.5, 7.5, -1.5, 18});
  // without the bias: [[-2, 8.5], [-2, 19]]
  require_close(ops::linear_activation_forward(x, w, Tensor<double>{}, {.kind = Activation::relu}), {0, 8.5, 0, 19});
}

namespace {

template <class T>
Tensor<T> random_t(const Shape& s, Rng& rng) {
  return Tensor<T>::uniform(s, rng, -2.0, 2.0);
}

template <class T>
void check_equals_two_ops(double tol) {
  const Activation kinds[] = {Activation::identity, Activation::relu,     Activation::leaky_relu,
                              Activation::elu,      Activation::sigmoid,  Activation::tanh,
                              Activation::gelu_erf, Activation::gelu_tanh, Activation::silu};
  struct Case { std::int64_t n, in, out; };
  for (Case c : {Case{7, 13, 5}, Case{1, 4, 3}, Case{16, 32, 8}}) {
    for (Activation k : kinds) {
      const ActivationParams a{.kind = k, .alpha = k == Activation::elu ? 1.0 : 0.1};
      Rng rng(1000 + static_cast<std::uint64_t>(k) * 31 + static_cast<std::uint64_t>(c.n * 7 + c.in));
      auto x = random_t<T>({c.n, c.in}, rng), w = random_t<T>({c.out, c.in}, rng), b = random_t<T>({c.out}, rng);
      INFO(dtype_of<T> << " " << k << " N" << c.n << " in" << c.in << " out" << c.out);
      auto fused = ops::linear_activation_forward(x, w, b, a);
      CHECK(fused.shape() == Shape{c.n, c.out});
      const auto two = ops::activation_forward(ops::linear_forward(x, w, b), a).to_vector();
      require_close(fused, std::vector<double>(two.begin(), two.end()), tol);
      auto fused_nb = ops::linear_activation_forward(x, w, Tensor<T>{}, a);
      auto two_nb = ops::activation_forward(ops::linear_forward(x, w), a);
      const auto v = two_nb.to_vector();
      require_close(fused_nb, std::vector<double>(v.begin(), v.end()), tol);
    }
  }
}

}  // namespace

TEST_CASE("linear_activation_forward equals linear_forward then activation_forward") {
  check_equals_two_ops<double>(1e-12);
  check_equals_two_ops<float>(1e-6);
}

TEST_CASE("linear_activation_forward: strided input and empty batch") {
  auto wide = Tensor<double>::from_vector({9, 1, 2, 3, 9, 4, 5, 6}, {2, 4});
  auto x = wide.slice(1, 1, 4);
  REQUIRE(x.layout() == Layout::strided);
  auto w = Tensor<double>::from_vector({1, 0, -1, 0.5, 1, 2}, {2, 3});
  auto b = Tensor<double>::from_vector({0.5, -1}, {2});
  require_close(ops::linear_activation_forward(x, w, b, {.kind = Activation::relu}), {0, 7.5, 0, 18});
  CHECK(ops::linear_activation_forward(Tensor<double>::zeros({0, 3}), w, b, {.kind = Activation::relu}).shape() ==
        Shape{0, 2});
}

TEST_CASE("linear_activation_forward: bad input") {
  Rng rng(9);
  auto x = random({3, 4}, rng);
  auto w = random({2, 4}, rng);
  auto b = random({2}, rng);
  const ActivationParams relu{.kind = Activation::relu};
  const char* op = "linear_activation_forward";
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_activation_forward(Tensor<double>{}, w, b, relu), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_activation_forward(x, Tensor<double>{}, b, relu), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_activation_forward(random({4}, rng), w, b, relu), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_activation_forward(x, random({1, 2, 4}, rng), b, relu), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_activation_forward(x, random({2, 5}, rng), b, relu), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_activation_forward(x, w, random({3}, rng), relu), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_activation_forward(x, w, random({1, 2}, rng), relu), InvalidArgument, op);
  auto xh = Tensor<half>::zeros({3, 4}), wh = Tensor<half>::zeros({2, 4});
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_activation_forward(xh, wh, Tensor<half>{}, relu), NotImplemented, op);
}

TEST_CASE("linear_residual_forward: hand-computed case and bad input") {
  auto x = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  auto w = Tensor<double>::from_vector({1, 0, -1, 0.5, 1, 2}, {2, 3});
  auto b = Tensor<double>::from_vector({0.5, -1}, {2});
  auto r = Tensor<double>::from_vector({1, 2, 3, 4}, {2, 2});
  // x w^T + b = [[-1.5, 7.5], [-1.5, 18]], plus r.
  require_close(ops::linear_residual_forward(x, w, b, r), {-0.5, 9.5, 1.5, 22});
  require_close(ops::linear_residual_forward(x, w, Tensor<double>{}, r), {-1, 10.5, 1, 23});
  require_close(ops::linear_residual_forward(x, w, b, transpose(Tensor<double>::from_vector({1, 3, 2, 4}, {2, 2}), 0, 1)),
                {-0.5, 9.5, 1.5, 22});
  const char* op = "linear_residual_forward";
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_residual_forward(x, w, b, Tensor<double>{}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_residual_forward(x, w, b, Tensor<double>::zeros({2, 3})), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_residual_forward(x, w, Tensor<double>::zeros({3}), r), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_residual_forward(x, Tensor<double>::zeros({2, 4}), b, r), InvalidArgument, op);
}

}  // namespace cutrain_test_linear_activation
