// Shape ops (ops/shape_ops.hpp, ops/index.hpp): concat, stack, split, chunk, index_select and
// gather against element-by-element references on the CPU (f32 and f64, strided inputs), the f64
// gradient check of each through autograd (autograd/functions/shape_ops.hpp), and bad input,
// each case asserting the exception type and that the message names the op and the shapes.
#include "bad_input.hpp"
#include "gradcheck.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cutrain/autograd.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/ops/index.hpp"
#include "cutrain/ops/shape_ops.hpp"

namespace cutrain_test_shape_ops {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {
template <class T = float>
Tensor<T> iota(const Shape& s, T start = 0) {
  std::vector<T> v(static_cast<std::size_t>(s.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<T>(static_cast<float>(i));
  return Tensor<T>::from_vector(v, s);
}

Tensor<std::int32_t> ints(const std::vector<std::int32_t>& v, const Shape& s) { return Tensor<std::int32_t>::from_vector(v, s); }
Tensor<std::int32_t> ints(const std::vector<std::int32_t>& v) { return ints(v, Shape{static_cast<std::int64_t>(v.size())}); }

// Random int32 values in [0, n) of shape s.
Tensor<std::int32_t> random_index(const Shape& s, std::int64_t n, Rng& rng) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(s.numel()));
  for (auto& e : v) e = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(n)));
  return ints(v, s);
}

// d <r, op(xs)> / d xs[i] through autograd against finite differences, for every input.
void check_grads(const std::string& name, const std::vector<Shape>& shapes,
                 const std::function<Var<double>(const std::vector<Var<double>>&)>& op, Rng& rng) {
  std::vector<Tensor<double>> xs;
  for (const Shape& s : shapes) xs.push_back(random(s, rng));
  std::vector<Var<double>> vs;
  for (const auto& x : xs) vs.emplace_back(x.view(), true);
  Var<double> y = op(vs);
  const Tensor<double> r = random(y.shape(), rng);
  y.backward(r);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    INFO(name << ": input " << i);
    REQUIRE(vs[i].grad().defined());
    CHECK(vs[i].grad().is_contiguous());
    const Tensor<double> analytic = vs[i].grad().clone();
    gradcheck(name + " input " + std::to_string(i), xs[i], [&] {
      autograd::NoGradGuard ng;
      std::vector<Var<double>> c;
      for (const auto& x : xs) c.emplace_back(x.view());
      return op(c).value().view();
    }, analytic, r);
  }
}
}  // namespace

TEST_CASE("concat and stack: values, strided inputs, every dim", "[shape_ops]") {
  Rng rng(31);
  const auto a = Tensor<double>::uniform({2, 3, 4}, rng, -1, 1);
  const auto b_full = Tensor<double>::uniform({4, 5, 2}, rng, -1, 1);
  const auto b = transpose(slice(b_full, 1, 0, 5, 2), 0, 2);  // [2, 3, 4], strided
  for (int dim : {0, 1, 2, -1}) {
    const int d = dim < 0 ? dim + 3 : dim;
    const Tensor<double> c = ops::concat({&a, &b, &a}, dim);
    CHECK(c.layout() == Layout::row_major);
    CHECK(c.dim(d) == 3 * a.dim(d));
    for (std::int64_t i = 0; i < c.dim(0); ++i)
      for (std::int64_t j = 0; j < c.dim(1); ++j)
        for (std::int64_t k = 0; k < c.dim(2); ++k) {
          std::int64_t idx[3] = {i, j, k};
          const std::int64_t piece = idx[d] / a.dim(d);
          idx[d] %= a.dim(d);
          const Tensor<double>& src = piece == 1 ? b : a;
          REQUIRE(c(i, j, k) == src(idx[0], idx[1], idx[2]));
        }
  }
  const Tensor<double> s = ops::stack({&a, &b}, 1);
  CHECK(s.shape() == Shape{2, 2, 3, 4});
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t j = 0; j < 3; ++j)
      for (std::int64_t k = 0; k < 4; ++k) {
        REQUIRE(s(i, 0, j, k) == a(i, j, k));
        REQUIRE(s(i, 1, j, k) == b(i, j, k));
      }
  CHECK(ops::stack({&a, &b}, -1).shape() == Shape{2, 3, 4, 2});
  // Hand-computed, with an empty piece and 0-d tensors stacked.
  const auto r12 = iota({1, 2}), r02 = Tensor<float>({0, 2}), r22 = iota({2, 2}, 10.f), r21 = iota({2, 1});
  require_close(ops::concat({&r12, &r02, &r22}, 0), {0, 1, 10, 11, 12, 13});
  require_close(ops::concat({&r21, &r22}, 1), {0, 10, 11, 1, 12, 13});
  const auto s3 = Tensor<float>::full({}, 3.f), s4 = Tensor<float>::full({}, 4.f);
  require_close(ops::stack({&s3, &s4}), {3, 4});
}

TEST_CASE("split and chunk: views with PyTorch's piece sizes", "[shape_ops]") {
  auto x = iota({7, 2});
  auto p = ops::split(x, std::int64_t{3}, 0);
  REQUIRE(p.size() == 3);
  CHECK(p[0].shape() == Shape{3, 2});
  CHECK(p[2].shape() == Shape{1, 2});
  CHECK(p[2](0, 1) == 13);
  p[1](0, 0) = -1;  // a view
  CHECK(x(3, 0) == -1);
  auto q = ops::split(x, {2, 0, 5}, 0);
  REQUIRE(q.size() == 3);
  CHECK(q[1].numel() == 0);
  CHECK(q[2](0, 0) == 4);
  auto cols = ops::split(x, {1, 1}, -1);
  CHECK(cols[1].shape() == Shape{7, 1});
  CHECK(cols[1](6, 0) == 13);
  CHECK(ops::chunk(x, 3, 0).size() == 3);   // 3, 3, 1
  CHECK(ops::chunk(iota({6}), 4).size() == 3);  // 2, 2, 2: fewer than asked, as PyTorch
  CHECK(ops::chunk(iota({6}), 4)[2](1) == 5);
  CHECK(ops::chunk(iota({2}), 5).size() == 2);
  // concat undoes split.
  auto back = ops::concat(ops::split(x, std::int64_t{2}, 0), 0);
  CHECK(back.to_vector() == x.to_vector());
}

TEST_CASE("index_select and gather: values vs element-wise references", "[shape_ops][index]") {
  Rng rng(32);
  const auto full = Tensor<double>::uniform({5, 4, 6}, rng, -1, 1);
  const auto x = transpose(full, 0, 2);  // [6, 4, 5], strided
  for (int d = 0; d < 3; ++d) {
    const auto idx = random_index({7}, x.dim(d), rng);
    const Tensor<double> y = ops::index_select(x, d, idx);
    Shape want = x.shape();
    want[d] = 7;
    REQUIRE(y.shape() == want);
    for (std::int64_t i = 0; i < y.dim(0); ++i)
      for (std::int64_t j = 0; j < y.dim(1); ++j)
        for (std::int64_t k = 0; k < y.dim(2); ++k) {
          std::int64_t c[3] = {i, j, k};
          c[d] = idx(c[d]);
          REQUIRE(y(i, j, k) == x(c[0], c[1], c[2]));
        }
    Shape is = x.shape();
    is[d] = 3;
    is[(d + 1) % 3] -= 1;  // smaller than x in another dim
    const auto gi = random_index(is, x.dim(d), rng);
    const Tensor<double> g = ops::gather(x, d, gi);
    REQUIRE(g.shape() == is);
    for (std::int64_t i = 0; i < g.dim(0); ++i)
      for (std::int64_t j = 0; j < g.dim(1); ++j)
        for (std::int64_t k = 0; k < g.dim(2); ++k) {
          std::int64_t c[3] = {i, j, k};
          c[d] = gi(i, j, k);
          REQUIRE(g(i, j, k) == x(c[0], c[1], c[2]));
        }
  }
  // Hand-computed, f32, repeated indices, and the backwards adding repeats up.
  const auto e = iota({3, 2});  // rows [0 1] [2 3] [4 5]
  require_close(ops::index_select(e, 0, ints({2, 0, 2})), {4, 5, 0, 1, 4, 5});
  require_close(ops::index_select_backward(iota({3, 2}, 1.f), {3, 2}, 0, ints({2, 0, 2})), {3, 4, 0, 0, 1 + 5, 2 + 6});
  require_close(ops::gather(e, 1, ints({1, 1, 0, 1, 0, 0}, {3, 2})), {1, 1, 2, 3, 4, 4});
  require_close(ops::gather_backward(iota({3, 2}, 1.f), {3, 2}, 1, ints({1, 1, 0, 1, 0, 0}, {3, 2})), {0, 3, 3, 4, 11, 0});
  require_close(ops::index_select(e, 1, ints(std::vector<std::int32_t>{}, Shape{0})), {});
}

TEST_CASE("gradcheck: concat, stack, split, chunk", "[shape_ops][autograd]") {
  Rng rng(33);
  check_grads("concat dim 1", {{2, 3, 2}, {2, 1, 2}, {2, 4, 2}},
              [](const std::vector<Var<double>>& v) { return autograd::concat(v, 1); }, rng);
  check_grads("concat dim -1 of transposed", {{3, 2}, {4, 2}}, [](const std::vector<Var<double>>& v) {
    return autograd::concat<double>({autograd::transpose(v[0], 0, 1), autograd::transpose(v[1], 0, 1)}, -1);
  }, rng);
  check_grads("stack dim 2", {{2, 3}, {2, 3}, {2, 3}},
              [](const std::vector<Var<double>>& v) { return autograd::stack(v, 2); }, rng);
  check_grads("stack dim 0", {{4}, {4}},
              [](const std::vector<Var<double>>& v) { return autograd::stack(v, 0); }, rng);
  // split: pieces used in another order, one twice, one not at all (its gradient is zero).
  check_grads("split", {{7, 3}}, [](const std::vector<Var<double>>& v) {
    auto p = autograd::split(v[0], {2, 1, 4}, 0);
    return autograd::concat<double>({p[2], p[0], autograd::multiply(p[0], p[0])}, 0);
  }, rng);
  check_grads("split int dim 1", {{2, 5}}, [](const std::vector<Var<double>>& v) {
    auto p = autograd::split(v[0], std::int64_t{2}, 1);
    return autograd::stack<double>({p[1], p[0]}, 0);
  }, rng);
  check_grads("chunk", {{3, 6}}, [](const std::vector<Var<double>>& v) {
    auto p = autograd::chunk(v[0], 4, -1);  // 2, 2, 2
    REQUIRE(p.size() == 3);
    return autograd::multiply(p[2], p[1]);
  }, rng);
}

TEST_CASE("gradcheck: index_select and gather", "[shape_ops][index][autograd]") {
  Rng rng(34);
  for (int d = 0; d < 3; ++d) {
    const Shape xs{3, 4, 5};
    const auto idx = random_index({6}, xs[d], rng);  // 6 > size 3 or 4 or 5: repeats
    check_grads("index_select dim " + std::to_string(d), {xs},
                [&](const std::vector<Var<double>>& v) { return autograd::index_select(v[0], d, idx); }, rng);
    Shape is = xs;
    is[d] = 7;
    is[(d + 2) % 3] -= 1;
    const auto gi = random_index(is, xs[d], rng);
    check_grads("gather dim " + std::to_string(d), {xs},
                [&](const std::vector<Var<double>>& v) { return autograd::gather(v[0], d, gi); }, rng);
  }
  // A strided index (a column of an int matrix) and an embedding-style lookup.
  const auto m = random_index({5, 3}, 4, rng);
  const auto col = slice(m, 1, 1, 2);
  const auto col1 = squeeze(col, 1);
  check_grads("index_select strided index", {{4, 3}},
              [&](const std::vector<Var<double>>& v) { return autograd::index_select(v[0], 0, col1); }, rng);
  check_grads("gather strided index", {{5, 4}},
              [&](const std::vector<Var<double>>& v) { return autograd::gather(v[0], 1, col); }, rng);
}

TEST_CASE("bad input: shape ops", "[shape_ops][bad_input]") {
  const auto a = Tensor<float>({2, 3}), b = Tensor<float>({2, 4}), c = Tensor<float>({2, 3, 1});
  const auto e = Tensor<float>({3, 2});
  run_cases({
      bad<InvalidArgument>("concat empty list", "concat", {"empty list"}, [] { ops::concat(std::vector<Tensor<float>>{}); }),
      bad<InvalidArgument>("concat shapes", "concat", {"tensor 2", "[2,4]", "[2,3]", "dim 1"},
                           [&] { ops::concat({&a, &a, &b}, 0); }),
      bad<InvalidArgument>("concat ranks", "concat", {"tensor 1", "[2,3,1]", "rank 3"}, [&] { ops::concat({&a, &c}, 0); }),
      bad<InvalidArgument>("concat bad dim", "concat", {"dim 2", "[2,3]"}, [&] { ops::concat({&a, &a}, 2); }),
      bad<InvalidArgument>("concat undefined", "concat", {"tensor 1", "undefined"}, [&] { const Tensor<float> u; ops::concat({&a, &u}, 0); }),
      bad<InvalidArgument>("concat 0-d", "concat", {"0-d"}, [] { const Tensor<float> z(Shape{}); ops::concat({&z}, 0); }),
      bad<InvalidArgument>("stack shapes", "stack", {"tensor 1", "[3,2]", "[2,3]"}, [&] { ops::stack({&a, &e}, 0); }),
      bad<InvalidArgument>("concat null", "concat", {"tensor 1", "null pointer"}, [&] { ops::concat({&a, static_cast<const Tensor<float>*>(nullptr)}); }),
      bad<InvalidArgument>("stack empty", "stack", {"empty list"}, [] { ops::stack(std::vector<Tensor<float>>{}); }),
      bad<InvalidArgument>("stack bad dim", "stack", {"dim 3", "[2,3]"}, [&] { ops::stack({&a, &a}, 3); }),
      bad<InvalidArgument>("split sum", "split", {"sum to 4", "dim 1", "[2,3]", "size 3"}, [&] { ops::split(a, {1, 3}, 1); }),
      bad<InvalidArgument>("split negative", "split", {"size 1 is -1"}, [&] { ops::split(a, {4, -1}, 1); }),
      bad<InvalidArgument>("split size 0", "split", {"positive", "0"}, [&] { ops::split(a, std::int64_t{0}, 1); }),
      bad<InvalidArgument>("chunk 0", "chunk", {"positive", "[2,3]"}, [&] { ops::chunk(a, 0, 1); }),
      bad<InvalidArgument>("index_select out of range", "index_select", {"index value 3", "dim 0 of size 3", "[3,2]"},
                           [&] { ops::index_select(e, 0, ints({0, 3, 1})); }),
      bad<InvalidArgument>("index_select negative", "index_select", {"index value -1", "dim 1 of size 2", "2 of the 3"},
                           [&] { ops::index_select(e, 1, ints({-1, 0, -2})); }),
      bad<InvalidArgument>("index_select 2-d index", "index_select", {"1-d", "[1,2]"},
                           [&] { ops::index_select(e, 0, ints({0, 1}, {1, 2})); }),
      bad<InvalidArgument>("index_select bad dim", "index_select", {"dim 2", "[3,2]"}, [&] { ops::index_select(e, 2, ints({0})); }),
      bad<InvalidArgument>("index_select_backward dy", "index_select_backward", {"[2,2]", "[3,2]"},
                           [&] { ops::index_select_backward(e, {3, 2}, 0, ints({0, 1})); }),
      bad<InvalidArgument>("gather rank", "gather", {"rank 2", "[3]"}, [&] { ops::gather(e, 0, ints({0, 1, 2})); }),
      bad<InvalidArgument>("gather larger index", "gather", {"[3,3]", "[3,2]", "dim 1"},
                           [&] { ops::gather(e, 0, ints(std::vector<std::int32_t>(9, 0), {3, 3})); }),
      bad<InvalidArgument>("gather out of range", "gather", {"index value 5", "dim 1 of size 2"},
                           [&] { ops::gather(e, 1, ints({0, 5}, {1, 2})); }),
      bad<InvalidArgument>("gather_backward out of range", "gather_backward", {"index value 2", "dim 1 of size 2"},
                           [&] { ops::gather_backward(Tensor<float>({1, 1}), {3, 2}, 1, ints({2}, {1, 1})); }),
      bad<InvalidArgument>("autograd concat undefined Var", "concat", {"Var 1", "undefined"},
                           [&] { autograd::concat<float>({Var<float>(a.view()), Var<float>()}); }),
  });
}

TEST_CASE("docs example: an embedding lookup, split and joined again", "[shape_ops][autograd]") {
  Rng rng(0);
  auto table = autograd::parameter(Tensor<float>::randn({1000, 64}, rng, 0.02));
  auto ids = Tensor<std::int32_t>::from_vector({5, 17, 5, 999}, {4});
  auto emb = autograd::index_select(table, 0, ids);
  auto halves = autograd::split(emb, std::int64_t{32}, 1);
  auto joined = autograd::concat<float>({halves[1], halves[0]}, 1);
  CHECK(joined.value()(0, 0) == table.value()(5, 32));
  CHECK(joined.value()(3, 40) == table.value()(999, 8));
  autograd::sum(joined).backward();
  const Tensor<float>& g = table.grad();
  CHECK(g(5, 0) == 2);
  CHECK(g(17, 63) == 1);
  CHECK(g(999, 10) == 1);
  CHECK(g(0, 0) == 0);
  CHECK(g(998, 5) == 0);
}

}  // namespace cutrain_test_shape_ops
