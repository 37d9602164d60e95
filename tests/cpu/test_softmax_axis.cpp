// Softmax and log-softmax along any axis of rank 1-4 tensors: against the last-axis [N, C] path
// on a transposed copy, gradient checks in f64 (axes 0, 1, -1, strided views), the autograd
// versions, and bad axes.
#include "gradcheck.hpp"

#include <cmath>
#include <vector>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/ops/softmax.hpp"

namespace cutrain_test_softmax_axis {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {
// softmax along axis computed another way: move the axis last (a transposed copy), take the
// rows of [N, C] with the last-axis path, move it back.
Tensor<double> reference(const Tensor<double>& x, int axis, bool log) {
  const int r = x.rank(), a = axis < 0 ? axis + r : axis;
  auto moved = transpose(x, a, r - 1).contiguous(Layout::row_major);
  const std::int64_t C = moved.dim(r - 1);
  auto rows = moved.reshape({moved.numel() / C, C});
  auto y = log ? ops::log_softmax_forward(rows) : ops::softmax_forward(rows);
  return transpose(y.reshape(moved.shape()), a, r - 1).contiguous(Layout::row_major);
}

struct Case {
  Shape shape;
  int axis;
};

const std::vector<Case> cases = {
    {{7}, 0},          {{7}, -1},          {{4, 5}, 0},       {{4, 5}, 1},        {{4, 5}, -1},
    {{3, 4, 5}, 0},    {{3, 4, 5}, 1},     {{3, 4, 5}, -1},   {{2, 3, 4, 5}, 0},  {{2, 3, 4, 5}, 1},
    {{2, 3, 4, 5}, 2}, {{2, 3, 4, 5}, -1}, {{2, 1, 3, 1}, 1}, {{2, 3, 4, 5}, -3},
};
}  // namespace

TEST_CASE("softmax axis: matches the last-axis path on a transposed copy") {
  for (const bool log : {false, true}) {
    for (const Case& k : cases) {
      Rng rng(500 + static_cast<std::uint64_t>(k.shape.numel() + k.axis));
      auto x = Tensor<double>::uniform(k.shape, rng, -5.0, 5.0);
      INFO((log ? "log_softmax " : "softmax ") << x.describe() << " axis " << k.axis);
      auto y = log ? ops::log_softmax_forward(x, k.axis) : ops::softmax_forward(x, k.axis);
      CHECK(y.shape() == k.shape);
      require_close(y, reference(x, k.axis, log).to_vector(), 1e-12);
      if (!log) {  // each row sums to 1
        auto s = ops::sum(y, {k.axis});
        for (double v : s.to_vector()) REQUIRE(v == Approx(1.0).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("gradcheck: softmax and log_softmax along axes 0, 1, -1 of rank 1-4") {
  for (const bool log : {false, true}) {
    for (const Case& k : cases) {
      Rng rng(600 + static_cast<std::uint64_t>(k.shape.numel() * 3 + k.axis));
      auto x = random(k.shape, rng);
      auto r = random(k.shape, rng);
      auto fwd = [&] { return log ? ops::log_softmax_forward(x, k.axis) : ops::softmax_forward(x, k.axis); };
      auto y = fwd();
      auto dx = log ? ops::log_softmax_backward(y, r, k.axis) : ops::softmax_backward(y, r, k.axis);
      gradcheck(detail::cat(log ? "log_softmax " : "softmax ", k.shape, " axis ", k.axis), x, fwd, dx, r);
    }
  }
}

TEST_CASE("gradcheck: softmax along an axis of strided views (transposed, sliced)") {
  Rng rng(700);
  auto base = random({4, 3, 6}, rng);
  auto t = transpose(base, 0, 2);          // [6, 3, 4], strided
  auto s = base.slice(2, 1, 5);            // [4, 3, 4], strided
  for (Tensor<double>* v : {&t, &s}) {
    REQUIRE(v->layout() == Layout::strided);
    for (int axis : {0, 1, -1}) {
      for (const bool log : {false, true}) {
        auto r = random(v->shape(), rng);
        auto fwd = [&] { return log ? ops::log_softmax_forward(*v, axis) : ops::softmax_forward(*v, axis); };
        auto y = fwd();
        require_close(y, reference(v->contiguous(Layout::row_major), axis, log).to_vector(), 1e-12);
        // dy strided too: the backward reads it through its strides
        auto rt = transpose(transpose(r, 0, 1).contiguous(Layout::row_major), 0, 1);
        auto dx = log ? ops::log_softmax_backward(y, rt, axis) : ops::softmax_backward(y, rt, axis);
        gradcheck(detail::cat(log ? "log_softmax" : "softmax", " strided ", v->shape(), " axis ", axis), *v, fwd, dx, r);
      }
    }
  }
}

TEST_CASE("autograd: softmax and log_softmax along an axis") {
  for (const bool log : {false, true}) {
    for (int axis : {0, 1, -1}) {
      Rng rng(800 + static_cast<std::uint64_t>(axis + 3));
      auto xv = random({3, 4, 5}, rng);
      auto dy = random({3, 4, 5}, rng);
      autograd::Var<double> x(xv.clone(), true);
      auto y = log ? autograd::log_softmax(x, axis) : autograd::softmax(x, axis);
      auto y_ref = log ? ops::log_softmax_forward(xv, axis) : ops::softmax_forward(xv, axis);
      require_close(y.value(), y_ref.to_vector(), 1e-14);
      y.backward(dy);
      auto dx_ref = log ? ops::log_softmax_backward(y_ref, dy, axis) : ops::softmax_backward(y_ref, dy, axis);
      require_close(x.grad(), dx_ref.to_vector(), 1e-14);
      gradcheck(detail::cat("autograd ", log ? "log_softmax" : "softmax", " axis ", axis), xv,
                [&] { return log ? ops::log_softmax_forward(xv, axis) : ops::softmax_forward(xv, axis); }, x.grad(), dy);
    }
  }
  autograd::Var<double> s(Tensor<double>::zeros({2, 3}), true);
  CUTRAIN_REQUIRE_THROWS_OP(autograd::softmax(s, 2), InvalidArgument, "softmax_forward");
  CUTRAIN_REQUIRE_THROWS_OP(autograd::log_softmax(autograd::Var<double>{}), InvalidArgument, "autograd::log_softmax");
}

TEST_CASE("softmax axis: bad axes name the op, the axis and the shape") {
  Rng rng(900);
  auto x = random({2, 3, 4}, rng);
  for (int axis : {3, -4, 100}) {
    try {
      (void)ops::softmax_forward(x, axis);
      FAIL("no throw for axis " << axis);
    } catch (const InvalidArgument& e) {
      const std::string w = e.what();
      CHECK(w.find("softmax_forward") != std::string::npos);
      CHECK(w.find(detail::cat("axis ", axis)) != std::string::npos);
      CHECK(w.find("[2,3,4]") != std::string::npos);
    }
  }
  auto y = ops::softmax_forward(x, 1);
  CUTRAIN_REQUIRE_THROWS_OP(ops::softmax_backward(y, random({2, 3, 5}, rng), 1), InvalidArgument, "softmax_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::log_softmax_backward(y, random({2, 3, 4}, rng), -5), InvalidArgument,
                            "log_softmax_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::softmax_forward(Tensor<double>::zeros({2, 0, 4}), 1), InvalidArgument,
                            "softmax_forward");
  // an empty non-softmax dim is fine: no rows
  CHECK(ops::softmax_forward(Tensor<double>::zeros({0, 4}), 1).shape() == Shape{0, 4});
}

}  // namespace cutrain_test_softmax_axis
