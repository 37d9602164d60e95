// Reductions (sum, mean, max/argmax, min/argmin, var, norm) over any set of axes: hand-computed
// cases, ties and NaN, f64 gradient checks through autograd for every op with keepdim on and
// off (ranks 1-5, strided and NHWC inputs), empty tensors, and bad input.
#include "gradcheck.hpp"

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "cutrain/autograd/functions/reduce.hpp"
#include "cutrain/ops/reduce.hpp"

namespace cutrain_test_reduce {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {
Tensor<double> iota(const Shape& s) {
  std::vector<double> v(static_cast<std::size_t>(s.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return Tensor<double>::from_vector(v, s);
}

void require_indices(const Tensor<std::int32_t>& t, const std::vector<std::int32_t>& want) {
  REQUIRE(t.to_vector() == want);
}
}  // namespace

TEST_CASE("reduce: hand-computed 2x3 cases", "[reduce]") {
  auto x = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  auto all = ops::sum(x);
  CHECK(all.shape() == Shape{});
  require_close(all, {21});
  CHECK(ops::sum(x, {}, true).shape() == (Shape{1, 1}));
  require_close(ops::sum(x, {0}), {5, 7, 9});
  require_close(ops::sum(x, {1}), {6, 15});
  CHECK(ops::sum(x, {1}, true).shape() == (Shape{2, 1}));
  CHECK(ops::sum(x, {-1}).shape() == (Shape{2}));
  require_close(ops::sum(x, {-1}), {6, 15});
  require_close(ops::sum(x, {0, 1}), {21});
  require_close(ops::mean(x, {1}), {2, 5});
  require_close(ops::mean(x), {3.5});

  auto mx = ops::max_with_indices(x, {1});
  require_close(mx.values, {3, 6});
  require_indices(mx.indices, {2, 2});
  auto mn = ops::min_with_indices(x, {0}, true);
  CHECK(mn.values.shape() == (Shape{1, 3}));
  require_close(mn.values, {1, 2, 3});
  require_indices(mn.indices, {0, 0, 0});
  require_indices(ops::argmax(x), {5});
  require_indices(ops::argmin(x), {0});
  require_close(ops::max(x), {6});
  require_close(ops::min(x, {1}), {1, 4});

  // Rows [1, 2, 3] and [4, 5, 6]: mean 2 and 5, squared deviations 1 + 0 + 1.
  require_close(ops::var(x, {1}), {1, 1});
  require_close(ops::var(x, {1}, 0.0), {2.0 / 3, 2.0 / 3}, 1e-12);
  // All six: mean 3.5, squared deviations 17.5.
  require_close(ops::var(x), {3.5});
  require_close(ops::var(x, {}, 0.0), {17.5 / 6}, 1e-12);
  require_close(ops::norm(x, 2.0, {1}), {std::sqrt(14.0), std::sqrt(77.0)}, 1e-12);
  require_close(ops::norm(x, 1.0, {0}), {5, 7, 9});
  require_close(ops::norm(x, 3.0, {1}, true), {std::cbrt(36.0), std::cbrt(405.0)}, 1e-12);
  require_close(ops::norm(Tensor<double>::from_vector({-3, 4}, {2})), {5});
}

TEST_CASE("reduce: several axes of a 3-d tensor, backwards by hand", "[reduce]") {
  // x[i, j, k] = 12 i + 4 j + k over [2, 3, 4]: the sum over i and k is 32 j + 60.
  auto x = iota({2, 3, 4});
  require_close(ops::sum(x, {0, 2}), {60, 92, 124});
  require_close(ops::sum(x, {2, 0}), {60, 92, 124});
  require_close(ops::sum(x, {-3, -1}, true), {60, 92, 124});
  CHECK(ops::sum(x, {-3, -1}, true).shape() == (Shape{1, 3, 1}));
  require_close(ops::mean(x, {0, 2}), {7.5, 11.5, 15.5});
  // The max over i and k is at (1, j, 3): row-major index 1 * 4 + 3 = 7 over (i, k).
  auto m = ops::max_with_indices(x, {0, 2});
  require_close(m.values, {15, 19, 23});
  require_indices(m.indices, {7, 7, 7});
  require_indices(ops::argmin(x, {0, 2}), {0, 0, 0});
  require_indices(ops::argmax(x, {1}), {2, 2, 2, 2, 2, 2, 2, 2});

  auto dy = Tensor<double>::from_vector({1, 2, 3}, {3});
  auto ds = ops::sum_backward(dy, x.shape(), {0, 2});
  CHECK(ds.shape() == x.shape());
  CHECK(ds(0, 0, 0) == 1);
  CHECK(ds(1, 2, 3) == 3);
  CHECK(ds(1, 1, 0) == 2);
  auto dm = ops::mean_backward(dy, x.shape(), {0, 2});
  CHECK(dm(1, 2, 1) == Approx(3.0 / 8));
  auto dmax = ops::max_backward(dy, m.indices, x.shape(), {0, 2});
  double total = 0;
  for (double v : dmax.to_vector()) total += v;
  CHECK(total == 6);
  CHECK(dmax(1, 0, 3) == 1);
  CHECK(dmax(1, 2, 3) == 3);
  CHECK(dmax(0, 2, 3) == 0);
}

TEST_CASE("reduce: ties go to the first element, NaN wins max and min", "[reduce]") {
  auto x = Tensor<double>::from_vector({1, 3, 3, 0, 0}, {5});
  require_indices(ops::argmax(x), {1});
  require_indices(ops::argmin(x), {3});
  // last: the last of equal values, over one axis or several (row-major over the reduced axes).
  require_indices(ops::argmax(x, {}, false, true), {2});
  require_indices(ops::argmin(x, {}, false, true), {4});
  auto t = Tensor<float>::from_vector({5, 1, 5, 2, 0, 2, 7, 7, 7, 0, 4, 0}, {2, 2, 3});
  require_indices(ops::argmax(t, {2}, false, true), {2, 2, 2, 1});
  require_indices(ops::argmin(t, {2}, true, true), {1, 1, 2, 2});
  require_indices(ops::argmax(t, {1, 2}, false, true), {2, 2});  // 5s at 0 and 2; 7s at 0, 1, 2
  require_indices(ops::argmax(t, {0, 2}, false, true), {5, 4});  // row-major over [2, 3]: 7s at 3-5; 4 at 4
  CHECK(ops::argmax(t, {1}, false, true).shape() == Shape{2, 3});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto y = Tensor<double>::from_vector({1, nan, 5, nan}, {4});
  auto m = ops::max_with_indices(y);
  CHECK(std::isnan(m.values.flat(0)));
  require_indices(m.indices, {1});
  require_indices(ops::argmin(y), {1});

  // The gradient of a max goes to the first of equal maxima only.
  auto p = autograd::parameter(Tensor<double>::from_vector({2, 7, 7, 1}, {4}));
  autograd::max(p).backward();
  require_close(p.grad(), {0, 1, 0, 0});
  auto q = autograd::parameter(Tensor<double>::from_vector({2, 1, 7, 1}, {4}));
  autograd::min(q).backward();
  require_close(q.grad(), {0, 1, 0, 0});
}

namespace {
enum class Op { sum, mean, max, min, var_unbiased, var_biased, norm2, norm1, norm3 };

const char* op_name(Op op) {
  switch (op) {
    case Op::sum: return "sum";
    case Op::mean: return "mean";
    case Op::max: return "max";
    case Op::min: return "min";
    case Op::var_unbiased: return "var(correction 1)";
    case Op::var_biased: return "var(correction 0)";
    case Op::norm2: return "norm(p 2)";
    case Op::norm1: return "norm(p 1)";
    case Op::norm3: return "norm(p 3)";
  }
  return "?";
}

Tensor<double> forward(Op op, const Tensor<double>& x, const Axes& axes, bool keepdim) {
  switch (op) {
    case Op::sum: return ops::sum(x, axes, keepdim);
    case Op::mean: return ops::mean(x, axes, keepdim);
    case Op::max: return ops::max(x, axes, keepdim);
    case Op::min: return ops::min(x, axes, keepdim);
    case Op::var_unbiased: return ops::var(x, axes, 1.0, keepdim);
    case Op::var_biased: return ops::var(x, axes, 0.0, keepdim);
    case Op::norm2: return ops::norm(x, 2.0, axes, keepdim);
    case Op::norm1: return ops::norm(x, 1.0, axes, keepdim);
    case Op::norm3: return ops::norm(x, 3.0, axes, keepdim);
  }
  return {};
}

autograd::Var<double> forward(Op op, const autograd::Var<double>& x, const Axes& axes, bool keepdim) {
  switch (op) {
    case Op::sum: return autograd::sum(x, axes, keepdim);
    case Op::mean: return autograd::mean(x, axes, keepdim);
    case Op::max: return autograd::max(x, axes, keepdim);
    case Op::min: return autograd::min(x, axes, keepdim);
    case Op::var_unbiased: return autograd::var(x, axes, 1.0, keepdim);
    case Op::var_biased: return autograd::var(x, axes, 0.0, keepdim);
    case Op::norm2: return autograd::norm(x, 2.0, axes, keepdim);
    case Op::norm1: return autograd::norm(x, 1.0, axes, keepdim);
    case Op::norm3: return autograd::norm(x, 3.0, axes, keepdim);
  }
  return {};
}

// The autograd gradient of <r, op(x)> against central differences, x a view into `x_value`.
void check_op_gradient(Op op, Tensor<double> x_value, const Axes& axes, bool keepdim, Rng& rng) {
  const std::string name = std::string(op_name(op)) + " of " + x_value.describe() + " axes " +
                           cutrain::detail::axes_str(axes) + (keepdim ? " keepdim" : "");
  auto x = autograd::parameter(std::move(x_value));
  auto y = forward(op, x, axes, keepdim);
  CHECK(y.shape() == forward(op, x.value(), axes, keepdim).shape());
  auto r = random(y.shape(), rng);
  y.backward(r);
  REQUIRE(x.grad().defined());
  Tensor<double> grad = x.grad().clone();
  gradcheck(name, x.value(), [&] { return forward(op, x.value(), axes, keepdim); }, grad, r, 1e-6, 200);
}

constexpr Op all_ops[] = {Op::sum, Op::mean, Op::max, Op::min, Op::var_unbiased, Op::var_biased, Op::norm2, Op::norm1, Op::norm3};
}  // namespace

TEST_CASE("gradcheck: reductions, ranks 1-5, keepdim on and off", "[reduce]") {
  Rng rng(2024);
  struct Case {
    Shape shape;
    Axes axes;
  };
  const Case cases[] = {
      {{5}, {}},          {{5}, {0}},           {{3, 4}, {1}},         {{3, 4}, {0}},          {{3, 4}, {}},
      {{2, 3, 4}, {0, 2}}, {{2, 3, 4}, {-2}},   {{2, 3, 2, 3}, {1, 3}}, {{2, 3, 2, 3}, {0, 2, 3}},
      {{2, 1, 3, 2, 2}, {0, 3}}, {{2, 1, 3, 2, 2}, {1, 2, 4}},
  };
  for (Op op : all_ops)
    for (const Case& c : cases)
      for (bool keepdim : {false, true}) check_op_gradient(op, random(c.shape, rng), c.axes, keepdim, rng);
}

TEST_CASE("gradcheck: reductions of strided and NHWC inputs", "[reduce]") {
  Rng rng(7);
  for (Op op : all_ops) {
    for (bool keepdim : {false, true}) {
      // A column slice of [4, 7]: rows of 3 with a stride of 7.
      auto wide = random({4, 7}, rng);
      check_op_gradient(op, wide.slice(1, 2, 5), {1}, keepdim, rng);
      auto wide3 = random({3, 5, 4}, rng);
      check_op_gradient(op, wide3.slice(1, 1, 4), {0, 1}, keepdim, rng);
      check_op_gradient(op, random({2, 3, 2, 2}, rng, Layout::nhwc), {1, 2}, keepdim, rng);
    }
  }
  // Strided results equal those of a contiguous copy.
  auto wide = random({5, 6, 7}, rng);
  auto s = wide.slice(2, 1, 6).slice(0, 1, 4);
  auto c = s.clone();
  for (Op op : all_ops) {
    INFO(op_name(op));
    require_close(forward(op, s, {0, 2}, false), forward(op, c, {0, 2}, false).to_vector(), 1e-12);
  }
}

TEST_CASE("reduce: f32 agrees with f64", "[reduce]") {
  Rng rng(11);
  auto xd = random({3, 5, 4}, rng);
  auto v = xd.to_vector();
  auto xf = Tensor<float>::from_vector(std::vector<float>(v.begin(), v.end()), xd.shape());
  auto check = [](const Tensor<float>& a, const Tensor<double>& b) { require_close(a, b.to_vector(), 1e-5); };
  check(ops::sum(xf, {0, 2}), ops::sum(xd, {0, 2}));
  check(ops::mean(xf, {1}, true), ops::mean(xd, {1}, true));
  check(ops::max(xf, {2}), ops::max(xd, {2}));
  check(ops::min(xf), ops::min(xd));
  check(ops::var(xf, {0, 1}), ops::var(xd, {0, 1}));
  check(ops::norm(xf, 2.0, {2}), ops::norm(xd, 2.0, {2}));
  REQUIRE(ops::argmax(xf, {1}).to_vector() == ops::argmax(xd, {1}).to_vector());
}

TEST_CASE("reduce: empty tensors", "[reduce]") {
  // Reducing an axis of size 0: the sum and the norm are 0; mean, max, min and var are undefined.
  auto x = Tensor<double>({2, 0, 3});
  require_close(ops::sum(x, {1}), {0, 0, 0, 0, 0, 0});
  CHECK(ops::sum(x, {1}).shape() == (Shape{2, 3}));
  require_close(ops::norm(x, 2.0, {1}, true), {0, 0, 0, 0, 0, 0});
  require_close(ops::sum(x), {0});
  CUTRAIN_REQUIRE_THROWS_OP(ops::mean(x, {1}), InvalidArgument, "[2,0,3]");
  CUTRAIN_REQUIRE_THROWS_OP(ops::max(x, {1}), InvalidArgument, "cutrain::max");
  CUTRAIN_REQUIRE_THROWS_OP(ops::argmin(x), InvalidArgument, "[2,0,3]");
  CUTRAIN_REQUIRE_THROWS_OP(ops::var(x, {1}), InvalidArgument, "cutrain::var");
  // No outputs: every op gives an empty result.
  CHECK(ops::max(x, {2}).shape() == (Shape{2, 0}));
  CHECK(ops::mean(x, {0}, true).shape() == (Shape{1, 0, 3}));
  CHECK(ops::var(x, {2}).numel() == 0);
  CHECK(ops::argmax(x, {0, 2}).shape() == (Shape{0}));
  CHECK(ops::sum_backward(Tensor<double>({2, 0}), x.shape(), {2}).shape() == x.shape());
  // One element: unbiased var is undefined, biased var is 0.
  auto one = Tensor<double>::from_vector({4, 5}, {2, 1});
  CUTRAIN_REQUIRE_THROWS_OP(ops::var(one, {1}), InvalidArgument, "[2,1]");
  require_close(ops::var(one, {1}, 0.0), {0, 0});
  // Zero norm: gradient 0, not NaN.
  auto z = autograd::parameter(Tensor<double>::zeros({3}));
  autograd::norm(z).backward();
  require_close(z.grad(), {0, 0, 0});
  // A rank-0 tensor reduces over no axes to itself.
  auto s = Tensor<double>::from_vector({2.5}, Shape{});
  require_close(ops::sum(s), {2.5});
  require_close(ops::max(s), {2.5});
}

TEST_CASE("reduce: bad input names the op and the shape", "[reduce][bad_input]") {
  auto x = iota({2, 3});
  CUTRAIN_REQUIRE_THROWS_OP(ops::sum(x, {2}), InvalidArgument, "cutrain::sum");
  CUTRAIN_REQUIRE_THROWS_OP(ops::sum(x, {2}), InvalidArgument, "[2,3]");
  CUTRAIN_REQUIRE_THROWS_OP(ops::mean(x, {-3}), InvalidArgument, "cutrain::mean");
  CUTRAIN_REQUIRE_THROWS_OP(ops::mean(x, {-3}), InvalidArgument, "[2,3]");
  CUTRAIN_REQUIRE_THROWS_OP(ops::max(x, {1, -1}), InvalidArgument, "cutrain::max");
  CUTRAIN_REQUIRE_THROWS_OP(ops::max(x, {1, -1}), InvalidArgument, "named twice");
  CUTRAIN_REQUIRE_THROWS_OP(ops::argmax(x, {0, 0}), InvalidArgument, "[2,3]");
  CUTRAIN_REQUIRE_THROWS_OP(ops::min(x, {5}), InvalidArgument, "cutrain::min");
  CUTRAIN_REQUIRE_THROWS_OP(ops::var(x, {7}), InvalidArgument, "cutrain::var");
  CUTRAIN_REQUIRE_THROWS_OP(ops::var(x, {1}, -1.0), InvalidArgument, "correction");
  CUTRAIN_REQUIRE_THROWS_OP(ops::var(x, {1}, 3.0), InvalidArgument, "[2,3]");
  CUTRAIN_REQUIRE_THROWS_OP(ops::norm(x, 2.0, {-9}), InvalidArgument, "cutrain::norm");
  CUTRAIN_REQUIRE_THROWS_OP(ops::norm(x, 0.5), InvalidArgument, "cutrain::norm");
  CUTRAIN_REQUIRE_THROWS_OP(ops::norm(x, std::numeric_limits<double>::infinity()), InvalidArgument, "p must be");
  CUTRAIN_REQUIRE_THROWS_OP(ops::sum(Tensor<double>{}), InvalidArgument, "cutrain::sum");
  CUTRAIN_REQUIRE_THROWS_OP(ops::sum(Tensor<double>({1, 1, 1, 1, 1, 1, 1, 1, 1})), InvalidArgument, "[1,1,1,1,1,1,1,1,1]");

  auto dy = Tensor<double>({3});
  CUTRAIN_REQUIRE_THROWS_OP(ops::sum_backward(dy, x.shape(), {1}), InvalidArgument, "cutrain::sum_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::sum_backward(dy, x.shape(), {1}), InvalidArgument, "[2,3]");
  CUTRAIN_REQUIRE_THROWS_OP(ops::mean_backward(dy, x.shape(), {1}, true), InvalidArgument, "cutrain::mean_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::sum_backward(dy, Shape{-1, 3}, {0}), InvalidArgument, "[-1,3]");
  CUTRAIN_REQUIRE_THROWS_OP(ops::var_backward(x, dy, {1}), InvalidArgument, "cutrain::var_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::norm_backward(x, dy, dy, 2.0, {1}), InvalidArgument, "cutrain::norm_backward");
  auto idx = Tensor<std::int32_t>({2});
  CUTRAIN_REQUIRE_THROWS_OP(ops::max_backward(Tensor<double>({2}), idx, x.shape(), {0}), InvalidArgument,
                            "cutrain::max_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::min_backward(Tensor<double>({3}), idx, x.shape(), {0}), InvalidArgument, "indices");
  // f16 on the CPU: not an element type the CPU computes in.
  CUTRAIN_REQUIRE_THROWS_OP(ops::sum(Tensor<half>({2})), NotImplemented, "cutrain::sum");
}

}  // namespace cutrain_test_reduce
