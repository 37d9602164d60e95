// Linear: hand-computed forward and backward, strided and empty inputs, gradient checks of dx, dw
// and db, float against double, and bad input.
#include "gradcheck.hpp"

#include "cutrain/ops/linear.hpp"

namespace cutrain_test_linear {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

TEST_CASE("linear: hand-computed 2x3 case, forward and backward") {
  auto x = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  auto w = Tensor<double>::from_vector({1, 0, -1, 0.5, 1, 2}, {2, 3});
  auto b = Tensor<double>::from_vector({0.5, -1}, {2});
  // x w^T: row 0: 1 - 3 = -2, 0.5 + 2 + 6 = 8.5; row 1: 4 - 6 = -2, 2 + 5 + 12 = 19
  require_close(ops::linear_forward(x, w), {-2, 8.5, -2, 19});
  // plus b = [0.5, -1]
  auto y = ops::linear_forward(x, w, b);
  CHECK(y.shape() == Shape{2, 2});
  require_close(y, {-1.5, 7.5, -1.5, 18});

  auto dy = Tensor<double>::from_vector({1, 2, -1, 1}, {2, 2});
  auto g = ops::linear_backward(x, w, dy);
  // dx = dy w: row 0: 1*[1,0,-1] + 2*[0.5,1,2] = [2,2,3]; row 1: -1*[1,0,-1] + [0.5,1,2] = [-0.5,1,3]
  require_close(g.dx, {2, 2, 3, -0.5, 1, 3});
  // dw = dy^T x: row 0: [1,2,3] - [4,5,6] = [-3,-3,-3]; row 1: 2*[1,2,3] + [4,5,6] = [6,9,12]
  require_close(g.dw, {-3, -3, -3, 6, 9, 12});
  // db = column sums of dy
  require_close(g.db, {0, 3});

  auto g_nb = ops::linear_backward(x, w, dy, false);
  CHECK_FALSE(g_nb.db.defined());
  require_close(g_nb.dx, {2, 2, 3, -0.5, 1, 3});
}

TEST_CASE("linear: strided inputs, empty batch and zero features") {
  // x is a column slice of a wider tensor: strided, not contiguous.
  auto wide = Tensor<double>::from_vector({9, 1, 2, 3, 9, 4, 5, 6}, {2, 4});
  auto x = wide.slice(1, 1, 4);
  REQUIRE(x.layout() == Layout::strided);
  auto w = Tensor<double>::from_vector({1, 0, -1, 0.5, 1, 2}, {2, 3});
  require_close(ops::linear_forward(x, w), {-2, 8.5, -2, 19});
  auto dy_wide = Tensor<double>::from_vector({1, 7, 2, -1, 7, 1}, {2, 3});
  auto dy = dy_wide.slice(1, 0, 3).slice(1, 0, 1);  // still strided: [[1], [-1]]
  auto w1 = w.slice(0, 0, 1);
  auto g = ops::linear_backward(x, w1, dy);
  require_close(g.dw, {-3, -3, -3});  // [1,2,3] - [4,5,6]
  require_close(g.dx, {1, 0, -1, -1, 0, 1});

  // N == 0: an empty [0, out] result; dw is zero and db is zero.
  auto x0 = Tensor<double>::zeros({0, 3});
  auto b = Tensor<double>::from_vector({0.5, -1}, {2});
  CHECK(ops::linear_forward(x0, w, b).shape() == Shape{0, 2});
  auto g0 = ops::linear_backward(x0, w, Tensor<double>::zeros({0, 2}));
  require_close(g0.dw, {0, 0, 0, 0, 0, 0});
  require_close(g0.db, {0, 0});
  // in == 0: y is the bias broadcast over the batch.
  auto xe = Tensor<double>::zeros({3, 0});
  auto we = Tensor<double>::zeros({2, 0});
  require_close(ops::linear_forward(xe, we, b), {0.5, -1, 0.5, -1, 0.5, -1});
}

TEST_CASE("gradcheck: linear_backward dx, dw, db") {
  struct Case { std::int64_t n, in, out; };
  for (Case c : {Case{1, 5, 3}, Case{4, 7, 2}, Case{3, 1, 9}, Case{1, 1, 1}}) {
    Rng rng(100 + static_cast<std::uint64_t>(c.n * 100 + c.in * 10 + c.out));
    auto x = random({c.n, c.in}, rng);
    auto w = random({c.out, c.in}, rng);
    auto b = random({c.out}, rng);
    auto r = random({c.n, c.out}, rng);
    auto g = ops::linear_backward(x, w, r);
    const auto tag = detail::cat("linear N", c.n, " in", c.in, " out", c.out);
    auto f = [&] { return ops::linear_forward(x, w, b); };
    gradcheck(tag + " dx", x, f, g.dx, r);
    gradcheck(tag + " dw", w, f, g.dw, r);
    gradcheck(tag + " db", b, f, g.db, r);
    // without a bias, dx and dw are the same
    auto g_nb = ops::linear_backward(x, w, r, false);
    CHECK_FALSE(g_nb.db.defined());
    gradcheck(tag + " dw (no bias)", w, [&] { return ops::linear_forward(x, w); }, g_nb.dw, r);
  }
}

TEST_CASE("linear: float matches double") {
  Rng rng(7);
  auto x = random({5, 6}, rng), w = random({4, 6}, rng), b = random({4}, rng), dy = random({5, 4}, rng);
  auto to_f = [](const Tensor<double>& t) {
    const auto v = t.to_vector();
    return Tensor<float>::from_vector(std::vector<float>(v.begin(), v.end()), t.shape());
  };
  auto xf = to_f(x), wf = to_f(w), bf = to_f(b), dyf = to_f(dy);
  require_close(ops::linear_forward(xf, wf, bf), ops::linear_forward(x, w, b).to_vector(), 1e-5);
  auto gd = ops::linear_backward(x, w, dy);
  auto gf = ops::linear_backward(xf, wf, dyf);
  require_close(gf.dx, gd.dx.to_vector(), 1e-5);
  require_close(gf.dw, gd.dw.to_vector(), 1e-5);
  require_close(gf.db, gd.db.to_vector(), 1e-5);
}

TEST_CASE("linear: bad input") {
  Rng rng(9);
  auto x = random({3, 4}, rng);
  auto w = random({2, 4}, rng);
  auto b = random({2}, rng);
  auto dy = random({3, 2}, rng);
  const char* fwd = "linear_forward";
  const char* bwd = "linear_backward";
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_forward(Tensor<double>{}, w, b), InvalidArgument, fwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_forward(x, Tensor<double>{}, b), InvalidArgument, fwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_forward(random({4}, rng), w, b), InvalidArgument, fwd);         // x 1-d
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_forward(random({1, 3, 4}, rng), w, b), InvalidArgument, fwd);   // x 3-d
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_forward(x, random({1, 2, 4}, rng), b), InvalidArgument, fwd);   // w 3-d
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_forward(x, random({2, 5}, rng), b), InvalidArgument, fwd);      // in differs
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_forward(x, random({2, 5}, rng)), InvalidArgument, fwd);         // no bias too
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_forward(x, w, random({3}, rng)), InvalidArgument, fwd);         // bias [out+1]
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_forward(x, w, random({1, 2}, rng)), InvalidArgument, fwd);      // bias 2-d
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_backward(x, w, Tensor<double>{}), InvalidArgument, bwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_backward(x, w, random({3, 3}, rng)), InvalidArgument, bwd);     // dy [N, out+1]
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_backward(x, w, random({2, 2}, rng)), InvalidArgument, bwd);     // dy [N-1, out]
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_backward(x, random({2, 3}, rng), dy), InvalidArgument, bwd);    // in differs
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_backward(random({3}, rng), w, dy), InvalidArgument, bwd);       // x 1-d
  auto xh = Tensor<half>::zeros({3, 4}), wh = Tensor<half>::zeros({2, 4}), dyh = Tensor<half>::zeros({3, 2});
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_forward(xh, wh), NotImplemented, fwd);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_backward(xh, wh, dyh), NotImplemented, bwd);
}

}  // namespace cutrain_test_linear
