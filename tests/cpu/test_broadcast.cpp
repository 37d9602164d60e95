// Broadcasting elementwise ops on the CPU: values against a naive reference (index arithmetic
// on plain vectors) for every op, shape pair and input layout (transposed, sliced, stride-0
// expand views); f64 gradient checks of every backward, through ops:: and through autograd;
// comparisons and where; bad input.
#include "bad_input.hpp"
#include "gradcheck.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/ops/broadcast.hpp"
#include "cutrain/ops/elementwise.hpp"

namespace cutrain_test_broadcast {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {
// The logical row-major index into `in` (its shape aligned right under `out`) of output element i.
std::size_t source_index(const Shape& out, const Shape& in, std::int64_t i) {
  std::int64_t idx = 0, mul = 1;
  for (int d = out.rank() - 1; d >= 0; --d) {
    const std::int64_t c = i % out[d];
    i /= out[d];
    const int di = d - (out.rank() - in.rank());
    if (di < 0) continue;
    idx += (in[di] == 1 ? 0 : c) * mul;
    mul *= in[di];
  }
  return static_cast<std::size_t>(idx);
}

double ref_binary(BinaryOp op, double a, double b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::minimum: return std::isnan(a) || std::isnan(b) ? NAN : (b < a ? b : a);
    case BinaryOp::maximum: return std::isnan(a) || std::isnan(b) ? NAN : (b > a ? b : a);
    case BinaryOp::pow: return std::pow(a, b);
  }
  return 0;
}

std::vector<double> reference(BinaryOp op, const Tensor<double>& a, const Tensor<double>& b, const Shape& out) {
  const auto va = a.to_vector(), vb = b.to_vector();
  std::vector<double> r(static_cast<std::size_t>(out.numel()));
  for (std::int64_t i = 0; i < out.numel(); ++i)
    r[static_cast<std::size_t>(i)] = ref_binary(op, va[source_index(out, a.shape(), i)], vb[source_index(out, b.shape(), i)]);
  return r;
}

// Random values whose magnitude is in [0.5, 1.5] (safe divisors), or positive ones.
Tensor<double> away_from_zero(const Shape& s, Rng& rng, bool positive = false) {
  auto t = Tensor<double>::uniform(s, rng, 0.5, 1.5);
  if (!positive)
    for (std::int64_t i = 0; i < t.numel(); ++i) t.flat(i) *= (i % 3 == 1) ? -1.0 : 1.0;
  return t;
}

struct Pair {
  Shape a, b, out;
};
const std::vector<Pair> pairs = {
    {{3, 1, 4}, {2, 1}, {3, 2, 4}}, {{2, 1}, {3, 1, 4}, {3, 2, 4}}, {{4}, {2, 3, 4}, {2, 3, 4}},
    {{}, {2, 3}, {2, 3}},           {{2, 3}, {}, {2, 3}},           {{1}, {5}, {5}},
    {{5, 1, 1, 3}, {1, 4, 2, 1}, {5, 4, 2, 3}}, {{2, 3}, {2, 3}, {2, 3}}, {{}, {}, {}},
    {{0, 3}, {1, 3}, {0, 3}},
};
const BinaryOp all_binary[] = {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::minimum,
                               BinaryOp::maximum};
}  // namespace

TEST_CASE("broadcast: binary values against the reference, every shape pair") {
  Rng rng(1);
  for (const auto& p : pairs) {
    auto a = away_from_zero(p.a, rng), b = away_from_zero(p.b, rng);
    for (BinaryOp op : all_binary) {
      INFO(to_string(op) << " " << p.a << " " << p.b);
      auto y = ops::binary(op, a, b);
      CHECK(y.shape() == p.out);
      CHECK(y.is_contiguous());
      require_close(y, reference(op, a, b, p.out), 1e-15);
    }
    require_close(ops::add(a, b), reference(BinaryOp::add, a, b, p.out), 1e-15);
    require_close(ops::multiply(a, b), reference(BinaryOp::mul, a, b, p.out), 1e-15);
    require_close(ops::sub(a, b), reference(BinaryOp::sub, a, b, p.out), 1e-15);
    require_close(ops::mul(a, b), reference(BinaryOp::mul, a, b, p.out), 1e-15);
    require_close(ops::div(a, b), reference(BinaryOp::div, a, b, p.out), 1e-15);
    require_close(ops::minimum(a, b), reference(BinaryOp::minimum, a, b, p.out), 1e-15);
    require_close(ops::maximum(a, b), reference(BinaryOp::maximum, a, b, p.out), 1e-15);
  }
}

TEST_CASE("broadcast: pow with a tensor exponent, values, gradients and PyTorch's zeros") {
  Rng rng(9);
  for (const auto& p : pairs) {
    // Positive bases (a negative one with a fractional exponent is NaN), exponents of both signs.
    auto a = away_from_zero(p.a, rng, /*positive=*/true), b = away_from_zero(p.b, rng);
    INFO("pow " << p.a << " " << p.b);
    require_close(ops::pow(a, b), reference(BinaryOp::pow, a, b, p.out), 1e-15);
    auto r = random(p.out, rng);
    auto g = ops::pow_backward(a, b, r);
    auto f = [&] { return ops::pow(a, b); };
    const std::string n = detail::cat("pow ", p.a, " vs ", p.b);
    gradcheck(n + " da", a, f, g.da, r);
    gradcheck(n + " db", b, f, g.db, r);
  }
  // 0^2, 0^0, 2^0, (-2)^3, (-2)^2: values as std::pow; da is 0 where b is 0, db 0 where a is 0
  // and b >= 0, and a^b log a (NaN for a negative a) elsewhere, as PyTorch.
  const auto a = Tensor<double>::from_vector({0, 0, 2, -2, -2}, {5});
  const auto b = Tensor<double>::from_vector({2, 0, 0, 3, 2}, {5});
  require_close(ops::pow(a, b), {0, 1, 1, -8, 4}, 0);
  const auto g = ops::pow_backward(a, b, Tensor<double>::full({5}, 1.0));
  require_close(g.da, {0, 0, 0, 12, -4}, 1e-15);
  const auto db = g.db.to_vector();
  CHECK(db[0] == 0);
  CHECK(db[1] == 0);
  CHECK(db[2] == Approx(std::log(2.0)).epsilon(1e-15));
  CHECK(std::isnan(db[3]));
  CHECK(std::isnan(db[4]));
  // Through autograd, both inputs get gradients.
  auto va = autograd::parameter(Tensor<double>::from_vector({1.5, 2.0}, {2}));
  auto vb = autograd::parameter(Tensor<double>::from_vector({2.0, -1.0}, {2}));
  autograd::pow(va, vb).backward(Tensor<double>::full({2}, 1.0));
  require_close(va.grad(), {2 * 1.5, -1.0 / 4.0}, 1e-15);
  require_close(vb.grad(), {2.25 * std::log(1.5), 0.5 * std::log(2.0)}, 1e-15);
  CUTRAIN_REQUIRE_THROWS_OP(ops::pow(Tensor<double>::zeros({2, 3}), Tensor<double>::zeros({4})), InvalidArgument,
                            "pow");
}

TEST_CASE("broadcast: strided inputs (transpose, step slice, expand views) read in place") {
  Rng rng(2);
  auto base = away_from_zero({4, 6}, rng);
  auto t = transpose(base, 0, 1);                // [6,4], strides (1,6)
  auto s = slice(base, 1, 1, slice_end, 2);      // [4,3], step 2
  auto col = away_from_zero({6, 1}, rng);
  auto e = expand(col, Shape{6, 4});             // stride 0 along dim 1
  auto row = away_from_zero({3}, rng);
  for (BinaryOp op : all_binary) {
    INFO(to_string(op));
    require_close(ops::binary(op, t, e), reference(op, t.contiguous(), e.contiguous(), {6, 4}), 1e-15);
    require_close(ops::binary(op, s, row), reference(op, s.contiguous(), row, {4, 3}), 1e-15);
    require_close(ops::binary(op, expand(row, Shape{4, 3}), s),
                  reference(op, expand(row, Shape{4, 3}).contiguous(), s.contiguous(), {4, 3}), 1e-15);
  }
}

TEST_CASE("broadcast: layouts of the output") {
  Rng rng(3);
  auto a = Tensor<double>::uniform({2, 3, 4, 5}, rng, -1, 1, {.layout = Layout::nhwc});
  auto b = Tensor<double>::uniform({2, 3, 4, 5}, rng, -1, 1);
  CHECK(ops::sub(a, b).layout() == Layout::nhwc);  // equal shapes: a's layout
  CHECK(ops::add(a, b).layout() == Layout::nhwc);
  auto c = Tensor<double>::uniform({3, 1, 1}, rng, -1, 1);
  auto y = ops::add(a, c);                       // a has the output's shape: nhwc still
  CHECK(y.layout() == Layout::nhwc);
  require_close(y, reference(BinaryOp::add, a, c, a.shape()), 1e-15);
  CHECK(ops::add(c, a).layout() == Layout::nchw);  // row-major (nchw for 4-d)
  CHECK(ops::exp(a).layout() == Layout::nhwc);
}

TEST_CASE("broadcast: minimum and maximum on ties and NaN") {
  auto a = Tensor<double>::from_vector({1, 2, NAN, 3}, {4});
  auto b = Tensor<double>::from_vector({1, 5, 0, NAN}, {4});
  auto mn = ops::minimum(a, b).to_vector();
  CHECK(mn[0] == 1);
  CHECK(mn[1] == 2);
  CHECK(std::isnan(mn[2]));
  CHECK(std::isnan(mn[3]));
  auto g = ops::minimum_backward(a, b, Tensor<double>::full({4}, 1.0));
  require_close(g.da, {1, 1, 1, 0});  // a tie goes to a; a NaN is chosen where it is
  require_close(g.db, {0, 0, 0, 1});
  auto gm = ops::maximum_backward(a, b, Tensor<double>::full({4}, 1.0));
  require_close(gm.da, {1, 0, 1, 0});
  require_close(gm.db, {0, 1, 0, 1});
}

TEST_CASE("gradcheck: binary_backward of every op over broadcast shapes") {
  Rng rng(4);
  for (const auto& p : pairs) {
    if (p.out.numel() == 0) continue;
    for (BinaryOp op : all_binary) {
      auto a = away_from_zero(p.a, rng), b = away_from_zero(p.b, rng);
      auto r = random(p.out, rng);
      auto g = ops::binary_backward(op, a, b, r);
      CHECK(g.da.shape() == p.a);
      CHECK(g.db.shape() == p.b);
      auto f = [&] { return ops::binary(op, a, b); };
      const std::string n = detail::cat(to_string(op), " ", p.a, " vs ", p.b);
      gradcheck(n + " da", a, f, g.da, r);
      gradcheck(n + " db", b, f, g.db, r);
    }
  }
  // multiply_backward with unequal shapes broadcasts too.
  auto a = away_from_zero({3, 1}, rng), b = away_from_zero({4}, rng);
  auto r = random({3, 4}, rng);
  auto g = ops::multiply_backward(a, b, r);
  gradcheck("multiply_backward [3,1] vs [4] da", a, [&] { return ops::multiply(a, b); }, g.da, r);
  gradcheck("multiply_backward [3,1] vs [4] db", b, [&] { return ops::multiply(a, b); }, g.db, r);
  auto gb = ops::binary_backward(BinaryOp::div, a, b, r, false, true);
  CHECK_FALSE(gb.da.defined());
  CHECK(gb.db.defined());
}

TEST_CASE("gradcheck: binary ops through expand and transpose views of the inputs") {
  Rng rng(5);
  auto base = away_from_zero({2, 1}, rng);
  auto other = away_from_zero({4, 3}, rng);
  for (BinaryOp op : all_binary) {
    auto r = random({4, 2, 3}, rng);
    auto fo = [&] { return ops::binary(op, expand(base, Shape{4, 2, 3}), unsqueeze(other, 1)); };
    auto g = ops::binary_backward(op, expand(base, Shape{4, 2, 3}), unsqueeze(other, 1), r);
    gradcheck(detail::cat(to_string(op), " expand-view a"), base, fo, ops::sum_to(g.da, base.shape()), r);
    gradcheck(detail::cat(to_string(op), " unsqueezed b"), other, fo, reshape(g.db, other.shape()), r);
    // b transposed: [3,4] viewed from a [4,3] storage.
    auto bt = away_from_zero({3, 4}, rng);
    auto ftt = [&] { return ops::binary(op, transpose(bt, 0, 1), slice(base, 0, 0, 1)); };
    auto r2 = random({4, 3}, rng);
    auto g2 = ops::binary_backward(op, transpose(bt, 0, 1), slice(base, 0, 0, 1), r2);
    gradcheck(detail::cat(to_string(op), " transposed a"), bt, ftt, transpose(g2.da, 0, 1), r2);
  }
}

TEST_CASE("unary: values and gradient checks") {
  Rng rng(6);
  const std::vector<std::pair<UnaryOp, double>> ops_p = {
      {UnaryOp::exp, 0},  {UnaryOp::log, 0},   {UnaryOp::sqrt, 0},  {UnaryOp::rsqrt, 0}, {UnaryOp::neg, 0},
      {UnaryOp::abs, 0},  {UnaryOp::pow, 3.0}, {UnaryOp::pow, 2.5}, {UnaryOp::pow, -1.5}, {UnaryOp::pow, 0.0}};
  for (auto [op, p] : ops_p) {
    const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt ||
                          (op == UnaryOp::pow && p != 3.0 && p != 0.0);
    for (const Shape& s : {Shape{}, Shape{7}, Shape{2, 3, 4}}) {
      auto x = away_from_zero(s, rng, positive);
      auto y = ops::unary(op, x, p);
      std::vector<double> want;
      for (double v : x.to_vector()) {
        switch (op) {
          case UnaryOp::exp: want.push_back(std::exp(v)); break;
          case UnaryOp::log: want.push_back(std::log(v)); break;
          case UnaryOp::sqrt: want.push_back(std::sqrt(v)); break;
          case UnaryOp::rsqrt: want.push_back(1 / std::sqrt(v)); break;
          case UnaryOp::neg: want.push_back(-v); break;
          case UnaryOp::abs: want.push_back(std::fabs(v)); break;
          case UnaryOp::pow: want.push_back(std::pow(v, p)); break;
        }
      }
      require_close(y, want, 1e-14);
      auto r = random(s, rng);
      gradcheck(detail::cat(to_string(op), " ", p, " ", s), x, [&] { return ops::unary(op, x, p); },
                ops::unary_backward(op, x, r, p), r);
    }
    // A transposed input, read in place.
    auto base = away_from_zero({3, 5}, rng, positive);
    auto r = random({5, 3}, rng);
    auto f = [&] { return ops::unary(op, transpose(base, 0, 1), p); };
    gradcheck(detail::cat(to_string(op), " transposed"), base, f,
              transpose(ops::unary_backward(op, transpose(base, 0, 1), r, p), 0, 1), r);
  }
  auto x = Tensor<double>::from_vector({4, -9, 0.25}, {3});
  require_close(ops::abs(ops::neg(x)), {4, 9, 0.25});
  require_close(ops::sqrt(ops::abs(x)), {2, 3, 0.5});
  require_close(ops::rsqrt(ops::abs(x)), {0.5, 1.0 / 3, 2});
  require_close(ops::pow(x, 2.0), {16, 81, 0.0625});
  require_close(ops::pow_backward(x, Tensor<double>::full({3}, 1.0), 2.0), {8, -18, 0.5});
  require_close(ops::unary_backward(UnaryOp::abs, Tensor<double>::zeros({1}), Tensor<double>::full({1}, 1.0)), {0});
  CHECK(std::isnan(ops::log(x).to_vector()[1]));  // outside the domain: NaN, no error
}

TEST_CASE("comparisons and where: values, broadcasting, NaN") {
  auto a = Tensor<double>::from_vector({1, 2, 3, NAN}, {4, 1});
  auto b = Tensor<double>::from_vector({2, 3}, {2});
  const std::vector<std::uint8_t> lt{1, 1, 0, 1, 0, 0, 0, 0}, eq{0, 0, 1, 0, 0, 1, 0, 0};
  CHECK(ops::lt(a, b).shape() == Shape{4, 2});
  CHECK(ops::lt(a, b).to_vector() == lt);
  CHECK(ops::eq(a, b).to_vector() == eq);
  CHECK(ops::ne(a, b).to_vector() == std::vector<std::uint8_t>{1, 1, 0, 1, 1, 0, 1, 1});
  CHECK(ops::le(a, b).to_vector() == std::vector<std::uint8_t>{1, 1, 1, 1, 0, 1, 0, 0});
  CHECK(ops::gt(a, b).to_vector() == std::vector<std::uint8_t>{0, 0, 0, 0, 1, 0, 0, 0});
  CHECK(ops::ge(a, b).to_vector() == std::vector<std::uint8_t>{0, 0, 1, 0, 1, 1, 0, 0});

  auto c = ops::gt(a, b);  // [4,2]
  auto x = Tensor<double>::from_vector({10, 20, 30, 40}, {4, 1});
  auto y = Tensor<double>::from_vector({-1, -2}, {2});
  require_close(ops::where(c, x, y), {-1, -2, -1, -2, 30, -2, -1, -2});
  // cond itself broadcast: [2] against [3,1] and a scalar.
  auto c2 = Tensor<std::uint8_t>::from_vector({1, 0}, {2});
  require_close(ops::where(c2, Tensor<double>::from_vector({1, 2, 3}, {3, 1}), Tensor<double>::full(Shape{}, 9.0)),
                {1, 9, 2, 9, 3, 9});

  Rng rng(7);
  for (const auto& [cs, as, bs] : std::vector<std::tuple<Shape, Shape, Shape>>{
           {{3, 1, 4}, {2, 1}, {4}}, {{2}, {3, 1}, {}}, {{2, 3}, {2, 3}, {2, 3}}, {{1}, {5}, {1}}}) {
    const Shape out = broadcast_shape("test", {&cs, &as, &bs});
    std::vector<std::uint8_t> cv(static_cast<std::size_t>(cs.numel()));
    for (auto& v : cv) v = static_cast<std::uint8_t>(rng.below(2));
    auto cond = Tensor<std::uint8_t>::from_vector(cv, cs);
    auto ta = random(as, rng), tb = random(bs, rng), r = random(out, rng);
    auto g = ops::where_backward(cond, as, bs, r);
    auto f = [&] { return ops::where(cond, ta, tb); };
    gradcheck(detail::cat("where da ", cs, as, bs), ta, f, g.da, r);
    gradcheck(detail::cat("where db ", cs, as, bs), tb, f, g.db, r);
  }
}

TEST_CASE("gradcheck: autograd graph of broadcasting ops", "[autograd]") {
  Rng rng(8);
  auto a = autograd::parameter(away_from_zero({3, 1, 4}, rng));
  auto b = autograd::parameter(away_from_zero({2, 1}, rng));
  auto c = autograd::parameter(away_from_zero({4}, rng, true));
  auto loss_fn = [&] {
    Var<double> t = (a - b) / c * autograd::maximum(a, b) + autograd::minimum(b, -a);
    Var<double> u = autograd::where(autograd::gt(a, b), autograd::exp(a), autograd::pow(b, 2.0));
    Var<double> v = autograd::sqrt(c) + autograd::log(c) + autograd::rsqrt(c) + autograd::abs(b * a);
    return autograd::sum(t * u + v + autograd::neg(autograd::multiply(a, c)) + autograd::add(b, c));
  };
  for (auto* leaf : {&a, &b, &c}) leaf->zero_grad();
  loss_fn().backward();
  int k = 0;
  for (auto* leaf : {&a, &b, &c}) {
    REQUIRE(leaf->grad().defined());
    CHECK(leaf->grad().shape() == leaf->value().shape());
    Tensor<double> analytic = leaf->grad().clone();
    auto one = Tensor<double>::full(Shape{}, 1.0);
    gradcheck(detail::cat("autograd leaf ", k++), leaf->value(), [&] {
      autograd::NoGradGuard ng;
      return loss_fn().value().view();
    }, analytic, one);
  }
}

TEST_CASE("bad input: broadcasting ops") {
  using F = Tensor<float>;
  auto z = [](const Shape& s) { return F::zeros(s); };
  auto u8 = [](const Shape& s) { return Tensor<std::uint8_t>::zeros(s); };
  run_cases({
      bad<InvalidArgument>("sub shapes", "sub", {"[2,3]", "[4]", "do not broadcast"}, [&] { (void)ops::sub(z({2, 3}), z({4})); }),
      bad<InvalidArgument>("add broadcast shapes", "add", {"[3,1,4]", "[2,3]"}, [&] { (void)ops::add(z({3, 1, 4}), z({2, 3})); }),
      bad<InvalidArgument>("multiply shapes", "multiply", {"[5]", "[4]"}, [&] { (void)ops::multiply(z({5}), z({4})); }),
      bad<InvalidArgument>("div undefined a", "div", {"a is an empty"}, [&] { (void)ops::div(F{}, z({2})); }),
      bad<InvalidArgument>("minimum undefined b", "minimum", {"b is an empty"}, [&] { (void)ops::minimum(z({2}), F{}); }),
      bad<InvalidArgument>("maximum shapes", "maximum", {"[2,2]", "[3]"}, [&] { (void)ops::maximum(z({2, 2}), z({3})); }),
      bad<InvalidArgument>("div_backward dy shape", "div_backward", {"[3,2]", "[2]"},
                           [&] { (void)ops::div_backward(z({3, 1}), z({2}), z({2})); }),
      bad<InvalidArgument>("binary_backward shapes", "sub_backward", {"[2]", "[3]"},
                           [&] { (void)ops::sub_backward(z({2}), z({3}), z({2})); }),
      bad<NotImplemented>("rank 9", "add", {"rank 9"},
                          [&] { (void)ops::add(z({1, 1, 1, 1, 1, 1, 1, 1, 2}), z({2})); }),
      bad<InvalidArgument>("exp undefined", "exp", {"x is an empty"}, [&] { (void)ops::exp(F{}); }),
      bad<InvalidArgument>("pow exponent", "pow", {"finite", "inf"},
                           [&] { (void)ops::pow(z({2}), std::numeric_limits<double>::infinity()); }),
      bad<InvalidArgument>("unary_backward shapes", "unary_backward", {"[3]", "[2]"},
                           [&] { (void)ops::unary_backward(UnaryOp::log, z({2}), z({3})); }),
      bad<InvalidArgument>("lt shapes", "lt", {"[2]", "[3]"}, [&] { (void)ops::lt(z({2}), z({3})); }),
      bad<InvalidArgument>("eq undefined", "eq", {"a is an empty"}, [&] { (void)ops::eq(F{}, z({3})); }),
      bad<InvalidArgument>("where shapes", "where", {"[2]", "[3]", "[1]"}, [&] { (void)ops::where(u8({2}), z({3}), z({1})); }),
      bad<InvalidArgument>("where undefined cond", "where", {"cond is an empty"},
                           [&] { (void)ops::where(Tensor<std::uint8_t>{}, z({3}), z({3})); }),
      bad<InvalidArgument>("where_backward dy", "where_backward", {"[2,3]", "[3]"},
                           [&] { (void)ops::where_backward(u8({2, 1}), Shape{3}, Shape{1}, z({3})); }),
      bad<InvalidArgument>("autograd::sub undefined", "autograd::sub", {"a is an undefined"},
                           [&] { (void)autograd::sub(Var<float>{}, Var<float>(z({2}))); }),
      bad<InvalidArgument>("autograd::pow undefined", "autograd::pow", {"x is an undefined"},
                           [&] { (void)autograd::pow(Var<float>{}, 2.0); }),
      bad<InvalidArgument>("autograd::where shapes", "where", {"[4]", "[2]"},
                           [&] { (void)autograd::where(u8({4}), Var<float>(z({2})), Var<float>(z({2}))); }),
  });
}

}  // namespace cutrain_test_broadcast
