// Views (core/view.hpp): transpose, permute, view / reshape, contiguous, slice with a step,
// squeeze / unsqueeze and expand on hand-computed cases and every dtype; sum_to; the f64
// gradient check of each view's backward through autograd (autograd/functions/view.hpp); and
// bad input, each case asserting the exception type and that the message names the op.
#include "gradcheck.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "cutrain/autograd.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/ops/sum_to.hpp"

namespace cutrain_test_views {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {

// 0, 1, 2, ... in logical order.
template <class T = float>
Tensor<T> iota(const Shape& s) {
  std::vector<T> v(static_cast<std::size_t>(s.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(static_cast<float>(i));
  return Tensor<T>::from_vector(v, s);
}

std::vector<float> floats(std::initializer_list<float> v) { return v; }

// The message of the InvalidArgument that fn throws (empty, and a failed check, when none).
template <class Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  FAIL_CHECK("no InvalidArgument thrown");
  return {};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("views: transpose and permute swap shape and strides, share storage", "[views]") {
  auto a = iota({2, 3, 4});
  auto t = transpose(a, 0, 2);
  CHECK(t.shape() == Shape{4, 3, 2});
  CHECK(t.strides() == Strides{1, 4, 12});
  CHECK(t.layout() == Layout::strided);
  CHECK(t(3, 1, 1) == a(1, 1, 3));
  t(0, 2, 1) = -5;
  CHECK(a(1, 2, 0) == -5);
  CHECK(transpose(a, -1, 0).strides() == t.strides());
  auto p = permute(a, {1, 2, 0});
  CHECK(p.shape() == Shape{3, 4, 2});
  CHECK(p.strides() == Strides{4, 1, 12});
  CHECK(p(2, 3, 1) == a(1, 2, 3));
  CHECK(permute(a, {-2, -1, 0}).strides() == p.strides());
  CHECK(permute(p, {2, 0, 1}).to_vector() == a.to_vector());
  auto m = iota({2, 3});
  CHECK(transpose(m, 0, 1).to_vector() == floats({0, 3, 1, 4, 2, 5}));
  CHECK(transpose(m, 1, 1).strides() == m.strides());
}

TEST_CASE("views: view merges and splits dims where the strides allow, -1 inferred", "[views]") {
  auto a = iota({2, 3, 4});
  auto v = view(a, {6, -1});
  CHECK(v.shape() == Shape{6, 4});
  CHECK(v.data() == a.data());
  CHECK(view(a, {-1}).to_vector() == a.to_vector());
  // [4, 3, 2] transposed: dims 1 and 2 (3 and 2 with strides 4 and 12) cannot merge, but the
  // last dim can split and size-1 dims come and go.
  auto t = transpose(a, 0, 2);
  auto s = view(t, {2, 2, 3, 1, 2});
  CHECK(s.strides()[0] == 2);  // dim 3 has size 1: its stride is never used
  CHECK(s.strides()[1] == 1);
  CHECK(s.strides()[2] == 4);
  CHECK(s.strides()[4] == 12);
  CHECK(s.to_vector() == t.to_vector());
  // A column slice keeps rows separate: [2, 3, 2] from [:, :, 1:3] views as [6, 2] but not [12].
  auto c = slice(a, 2, 1, 3);
  auto rows = view(c, {6, 2});
  CHECK(rows.to_vector() == c.to_vector());
  CHECK(rows.strides() == Strides{4, 1});
  const std::string msg = message_of([&] { (void)view(c, {12}); });
  CHECK(contains(msg, "cutrain::view"));
  CHECK(contains(msg, "[2,3,2]"));
  CHECK(contains(msg, "strides [12,4,1]"));
  CHECK(contains(msg, "as [12]"));
  CHECK(contains(msg, "reshape()"));
  // Rank 0 and empty tensors.
  auto scalar = Tensor<float>::full(Shape{}, 7.0f);
  CHECK(view(scalar, {1, 1}).to_vector() == floats({7}));
  CHECK(view(view(scalar, {1, 1}), {}).shape() == Shape{});
  auto empty = Tensor<float>::zeros({0, 3});
  CHECK(view(empty, {3, 0}).shape() == Shape{3, 0});
  CHECK(view(empty, {5, 0, 7}).shape() == Shape{5, 0, 7});
  CHECK_THROWS_AS(view(empty, {-1, 0, 5}), InvalidArgument);  // the -1 could be anything
}

TEST_CASE("views: reshape is a view when it can be, else a row-major copy", "[views]") {
  auto a = iota({2, 3, 4});
  auto r = reshape(a, {4, 6});
  CHECK(r.data() == a.data());
  auto t = transpose(a, 0, 2);
  auto flat = reshape(t, {-1});
  CHECK(flat.shape() == Shape{24});
  CHECK(flat.layout() == Layout::row_major);
  CHECK(flat.data() != a.data());
  CHECK(flat.to_vector() == t.to_vector());
  // nhwc is contiguous but not row-major: a reshape across c and h copies, in logical order.
  Rng rng(3);
  auto n = random({2, 3, 2, 2}, rng, Layout::nhwc);
  auto nf = reshape(n, {2, 12});
  CHECK(nf.to_vector() == n.to_vector());
  CHECK(nf.layout() == Layout::row_major);
}

TEST_CASE("views: contiguous is a view of a contiguous tensor, else a row-major copy", "[views]") {
  auto a = iota({3, 4});
  CHECK(contiguous(a).data() == a.data());
  CHECK(a.contiguous().data() == a.data());
  Rng rng(4);
  auto n = random({1, 2, 3, 3}, rng, Layout::nhwc);
  CHECK(n.contiguous().layout() == Layout::nhwc);
  CHECK(n.contiguous().data() == n.data());
  auto t = transpose(a, 0, 1);
  auto c = contiguous(t);
  CHECK(c.layout() == Layout::row_major);
  CHECK(c.strides() == Strides{3, 1});
  CHECK(c.to_vector() == t.to_vector());
  c(0, 0) = 99;
  CHECK(a(0, 0) == 0);
}

TEST_CASE("views: slice on any dim with a step, Python's clamping of start and stop", "[views]") {
  auto a = iota({3, 10});
  auto s = slice(a, 1, 1, 8, 3);  // columns 1, 4, 7
  CHECK(s.shape() == Shape{3, 3});
  CHECK(s.strides() == Strides{10, 3});
  CHECK(s.to_vector() == floats({1, 4, 7, 11, 14, 17, 21, 24, 27}));
  CHECK(slice(a, 1, 1, 9, 3).shape() == Shape{3, 3});
  CHECK(slice(a, 1, 1, 10, 3).shape() == Shape{3, 3});
  CHECK(slice(a, 1, 0, slice_end, 4).to_vector() == floats({0, 4, 8, 10, 14, 18, 20, 24, 28}));
  CHECK(slice(a, -1, -3).to_vector() == floats({7, 8, 9, 17, 18, 19, 27, 28, 29}));
  CHECK(slice(a, 0, -100, 100).to_vector() == a.to_vector());
  CHECK(slice(a, 0, 1, -1).to_vector() == slice(a, 0, 1, 2).to_vector());
  CHECK(slice(a, 0, 5, 100).shape() == Shape{0, 10});
  CHECK(slice(a, 1, 7, 3).shape() == Shape{3, 0});
  CHECK(slice(a, 0, 2).to_vector() == floats({20, 21, 22, 23, 24, 25, 26, 27, 28, 29}));
  // A slice of a slice, and writes through it.
  auto ss = slice(slice(a, 1, 1, slice_end, 2), 1, 1, slice_end, 2);  // columns 3, 7
  CHECK(ss.to_vector() == floats({3, 7, 13, 17, 23, 27}));
  ss(2, 1) = -1;
  CHECK(a(2, 7) == -1);
}

TEST_CASE("views: a negative step walks backwards (flip), Python's rules; gradients; ops read it", "[views]") {
  auto a = iota({3, 4});
  const auto r = slice(a, 1, -1, slice_end, -1);  // each row reversed, no copy
  CHECK(r.shape() == Shape{3, 4});
  CHECK(r.strides() == Strides{4, -1});
  CHECK(r.to_vector() == floats({3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8}));
  CHECK(slice(a, 1, 3, 1, -2).to_vector() == floats({3, 7, 11}));  // [3:1:-2]: 3 only
  CHECK(slice(a, 1, 3, slice_end, -2).to_vector() == floats({3, 1, 7, 5, 11, 9}));
  CHECK(slice(a, 0, 100, -100, -1).to_vector() == flip(a, {0}).to_vector());  // clamped to [-1, 2]
  CHECK(slice(a, 0, 1, 1, -1).shape() == Shape{0, 4});
  CHECK(slice(a, 0, -1, -2, -1).to_vector() == floats({8, 9, 10, 11}));
  CHECK(flip(a, {0, 1}).to_vector() == floats({11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  CHECK(flip(flip(a, {1}), {1}).to_vector() == a.to_vector());
  // Writes through it land in a; ops and copies read it as any strided view.
  auto w = flip(a, {1});
  w(0, 0) = -3;
  CHECK(a(0, 3) == -3);
  CHECK(w.contiguous(Layout::row_major).to_vector() == w.to_vector());
  CHECK(ops::add(w, a).to_vector() == ops::add(w.contiguous(Layout::row_major), a).to_vector());
  CHECK(ops::sum(w, {1}).to_vector() == ops::sum(a, {1}).to_vector());
  CHECK(ops::matmul(w, transpose(w, 0, 1)).to_vector() ==
        ops::matmul(w.contiguous(Layout::row_major), transpose(w, 0, 1).contiguous(Layout::row_major)).to_vector());
}

TEST_CASE("views: squeeze and unsqueeze", "[views]") {
  auto a = iota({1, 3, 1, 2});
  CHECK(squeeze(a).shape() == Shape{3, 2});
  CHECK(squeeze(a).data() == a.data());
  CHECK(squeeze(a, 2).shape() == Shape{1, 3, 2});
  CHECK(squeeze(a, -4).shape() == Shape{3, 1, 2});
  CHECK(squeeze(Tensor<float>::zeros({1, 1})).shape() == Shape{});
  auto b = iota({3, 2});
  CHECK(unsqueeze(b, 0).shape() == Shape{1, 3, 2});
  CHECK(unsqueeze(b, 1).shape() == Shape{3, 1, 2});
  CHECK(unsqueeze(b, 2).shape() == Shape{3, 2, 1});
  CHECK(unsqueeze(b, -1).shape() == Shape{3, 2, 1});
  CHECK(unsqueeze(b, -3).shape() == Shape{1, 3, 2});
  CHECK(unsqueeze(b, 1).strides() == Strides{2, 2, 1});
  CHECK(unsqueeze(b, 1).layout() == Layout::row_major);
  auto t = transpose(b, 0, 1);
  CHECK(unsqueeze(t, 1).to_vector() == t.to_vector());
  CHECK(unsqueeze(Tensor<float>::full(Shape{}, 2.0f), 0).shape() == Shape{1});
}

TEST_CASE("views: expand broadcasts with stride 0", "[views]") {
  auto a = Tensor<float>::from_vector({1, 2, 3}, {3, 1});
  auto e = expand(a, {2, 3, 4});
  CHECK(e.shape() == Shape{2, 3, 4});
  CHECK(e.strides() == Strides{0, 1, 0});
  CHECK(e.layout() == Layout::strided);
  CHECK(e.to_vector() == floats({1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}));
  CHECK(expand(a, {-1, 2}).to_vector() == floats({1, 1, 2, 2, 3, 3}));
  CHECK(expand(a, {3, 0}).shape() == Shape{3, 0});
  CHECK(expand(a, {3, 1}).strides() == a.strides());
  auto c = e.contiguous();
  CHECK(c.layout() == Layout::row_major);
  CHECK(c.to_vector() == e.to_vector());
  auto s = Tensor<float>::full(Shape{}, 5.0f);
  CHECK(expand(s, {2, 2}).to_vector() == floats({5, 5, 5, 5}));
  // A view of an expanded tensor: the stride-0 dims split and merge too.
  CHECK(view(e, {2, 3, 2, 2}).strides() == Strides{0, 1, 0, 0});
}

TEST_CASE("views: every dtype, metadata only; contiguous copies in logical order", "[views]") {
  auto check_dtype = [](auto tag) {
    using T = decltype(tag);
    auto a = iota<T>({2, 3, 4});
    auto p = permute(slice(a, 2, 1, slice_end, 2), {2, 0, 1});  // [2, 2, 3]
    auto c = p.contiguous();
    REQUIRE(c.shape() == Shape{2, 2, 3});
    const auto got = c.to_vector();
    std::vector<float> want;
    for (std::int64_t i = 0; i < 2; ++i)
      for (std::int64_t j = 0; j < 2; ++j)
        for (std::int64_t k = 0; k < 3; ++k) want.push_back(static_cast<float>(j * 12 + k * 4 + 1 + 2 * i));
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(static_cast<float>(got[i]) == want[i]);
    CHECK(expand(unsqueeze(a, 0), {2, 2, 3, 4}).contiguous().numel() == 48);
    CHECK(reshape(transpose(a, 0, 1), {6, 4}).to_vector().size() == 24);
  };
  check_dtype(float{});
  check_dtype(double{});
  check_dtype(std::int32_t{});
  check_dtype(std::uint8_t{});
  check_dtype(bfloat16{});
  check_dtype(half{});
}

TEST_CASE("views: sum_to sums the broadcast dims", "[views]") {
  auto x = iota<double>({2, 3, 4});
  require_close(ops::sum_to(x, {3, 1}), {0 + 1 + 2 + 3 + 12 + 13 + 14 + 15, 4 + 5 + 6 + 7 + 16 + 17 + 18 + 19,
                                          8 + 9 + 10 + 11 + 20 + 21 + 22 + 23});
  require_close(ops::sum_to(x, {4}), {60, 66, 72, 78});
  require_close(ops::sum_to(x, {}), {276});
  require_close(ops::sum_to(x, {1, 1, 1}), {276});
  CHECK(ops::sum_to(x, {2, 3, 4}).to_vector() == x.to_vector());
  require_close(ops::sum_to(transpose(x, 0, 2), {4, 1, 1}), {60, 66, 72, 78});
  require_close(ops::sum_to(Tensor<double>::zeros({0, 2}), {1, 2}), {0, 0});
  CUTRAIN_REQUIRE_THROWS_OP(ops::sum_to(x, {3}), InvalidArgument, "sum_to");
  CUTRAIN_REQUIRE_THROWS_OP(ops::sum_to(x, {1, 2, 3, 4}), InvalidArgument, "sum_to");
  CUTRAIN_REQUIRE_THROWS_OP(ops::sum_to(x, {2, -1, 4}), InvalidArgument, "sum_to");
  CUTRAIN_REQUIRE_THROWS_OP(ops::sum_to(Tensor<double>{}, {1}), InvalidArgument, "sum_to");
}

// ---- gradients -----------------------------------------------------------------------------

namespace {
// d <r, op(x)> / dx through autograd against finite differences, for x in the given layout
// (x may also be a strided view: make_x builds it).
void check_view_grad(const std::string& name, Tensor<double> x,
                     const std::function<Var<double>(const Var<double>&)>& op, Rng& rng) {
  Var<double> xv(x.view(), true);
  Var<double> y = op(xv);
  const Tensor<double> r = random(y.shape(), rng);
  y.backward(r);
  REQUIRE(xv.grad().defined());
  CHECK(xv.grad().is_contiguous());
  const Tensor<double> analytic = xv.grad().clone();
  gradcheck(name, x, [&] {
    autograd::NoGradGuard ng;
    return op(Var<double>(x.view())).value().view();
  }, analytic, r);
}
}  // namespace

TEST_CASE("gradcheck: reversed slices (negative steps) and flip", "[views][autograd]") {
  Rng rng(23);
  check_view_grad("slice step -2", random({3, 5}, rng),
                  [](const Var<double>& x) { return autograd::slice(x, 1, -1, slice_end, -2); }, rng);
  check_view_grad("flip 0, 2", random({2, 3, 4}, rng), [](const Var<double>& x) { return autograd::flip(x, {0, 2}); }, rng);
  check_view_grad("flip of a transpose", random({3, 4}, rng),
                  [](const Var<double>& x) { return autograd::flip(autograd::transpose(x, 0, 1), {1}); }, rng);
}

TEST_CASE("gradcheck: transpose, permute, view, reshape, contiguous", "[views][autograd]") {
  Rng rng(21);
  check_view_grad("transpose", random({2, 3, 4}, rng), [](const Var<double>& x) { return autograd::transpose(x, 0, 2); }, rng);
  check_view_grad("permute", random({2, 3, 4}, rng), [](const Var<double>& x) { return autograd::permute(x, {1, 2, 0}); }, rng);
  check_view_grad("permute nhwc", random({2, 3, 2, 2}, rng, Layout::nhwc),
                  [](const Var<double>& x) { return autograd::permute(x, {0, 2, 3, 1}); }, rng);
  check_view_grad("view", random({2, 3, 4}, rng), [](const Var<double>& x) { return autograd::view(x, {4, -1}); }, rng);
  check_view_grad("reshape (copies)", random({2, 3, 4}, rng),
                  [](const Var<double>& x) { return autograd::reshape(autograd::transpose(x, 0, 1), {-1}); }, rng);
  check_view_grad("contiguous", random({3, 4}, rng),
                  [](const Var<double>& x) { return autograd::contiguous(autograd::transpose(x, 0, 1)); }, rng);
}

TEST_CASE("gradcheck: slice, squeeze, unsqueeze, expand", "[views][autograd]") {
  Rng rng(22);
  check_view_grad("slice step 2", random({3, 7}, rng), [](const Var<double>& x) { return autograd::slice(x, 1, 1, slice_end, 2); }, rng);
  check_view_grad("slice negative", random({5, 3}, rng), [](const Var<double>& x) { return autograd::slice(x, -2, -2, 100, 3); }, rng);
  check_view_grad("slice of slice nhwc", random({2, 3, 4, 2}, rng, Layout::nhwc),
                  [](const Var<double>& x) { return autograd::slice(autograd::slice(x, 2, 1, 4, 2), 1, 0, 2); }, rng);
  check_view_grad("squeeze", random({1, 3, 1, 2}, rng), [](const Var<double>& x) { return autograd::squeeze(x); }, rng);
  check_view_grad("squeeze dim", random({3, 1, 2}, rng), [](const Var<double>& x) { return autograd::squeeze(x, 1); }, rng);
  check_view_grad("unsqueeze", random({3, 2}, rng), [](const Var<double>& x) { return autograd::unsqueeze(x, -1); }, rng);
  check_view_grad("expand", random({3, 1}, rng), [](const Var<double>& x) { return autograd::expand(x, {2, 3, 4}); }, rng);
  check_view_grad("expand scalar", random({}, rng), [](const Var<double>& x) { return autograd::expand(x, {2, 3}); }, rng);
  check_view_grad("expand transposed", random({1, 4, 1}, rng),
                  [](const Var<double>& x) { return autograd::expand(autograd::transpose(x, 0, 1), {4, 3, 2}); }, rng);
  check_view_grad("chain", random({2, 3, 4}, rng), [](const Var<double>& x) {
    Var<double> t = autograd::transpose(x, 1, 2);                  // [2, 4, 3]
    Var<double> s = autograd::slice(t, 1, 0, slice_end, 2);        // [2, 2, 3]
    Var<double> e = autograd::expand(autograd::unsqueeze(s, 0), {3, 2, 2, 3});
    return autograd::multiply(autograd::reshape(e, {6, 6}), autograd::reshape(e, {6, 6}));
  }, rng);
}

TEST_CASE("autograd: a view's gradient reaches a parameter, contiguous in its layout", "[views][autograd]") {
  auto w = autograd::parameter(Tensor<double>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}));
  Var<double> y = autograd::transpose(w, 0, 1);
  y.backward(Tensor<double>::from_vector({10, 40, 20, 50, 30, 60}, {3, 2}));
  CHECK(w.grad().layout() == Layout::row_major);
  CHECK(w.grad().to_vector() == std::vector<double>{10, 20, 30, 40, 50, 60});
  auto b = autograd::parameter(Tensor<double>::from_vector({1, 2}, {2}));
  Var<double> e = autograd::expand(b, {3, 2});
  e.backward(Tensor<double>::full({3, 2}, 1.0));
  CHECK(b.grad().to_vector() == std::vector<double>{3, 3});
  // No input requires grad: no node.
  Var<double> c(Tensor<double>::zeros({2, 2}));
  CHECK(autograd::transpose(c, 0, 1).is_leaf());
  CHECK_FALSE(autograd::slice(c, 0, 0, 1).requires_grad());
}

// ---- bad input -----------------------------------------------------------------------------

TEST_CASE("views: bad input throws InvalidArgument naming the op and the shapes", "[views][bad-input]") {
  auto a = iota({2, 3, 4});
  const Tensor<float> undefined;
  // transpose
  CUTRAIN_REQUIRE_THROWS_OP(transpose(a, 0, 3), InvalidArgument, "transpose");
  CUTRAIN_REQUIRE_THROWS_OP(transpose(a, -4, 0), InvalidArgument, "transpose");
  CUTRAIN_REQUIRE_THROWS_OP(transpose(Tensor<float>::zeros({}), 0, 0), InvalidArgument, "transpose");
  CUTRAIN_REQUIRE_THROWS_OP(transpose(undefined, 0, 1), InvalidArgument, "transpose");
  CHECK(contains(message_of([&] { (void)transpose(a, 0, 3); }), "dim 3 out of range for shape [2,3,4]"));
  // permute
  CUTRAIN_REQUIRE_THROWS_OP(permute(a, {0, 1}), InvalidArgument, "permute");
  CUTRAIN_REQUIRE_THROWS_OP(permute(a, {0, 1, 2, 3}), InvalidArgument, "permute");
  CUTRAIN_REQUIRE_THROWS_OP(permute(a, {0, 1, 1}), InvalidArgument, "permute");
  CUTRAIN_REQUIRE_THROWS_OP(permute(a, {0, -3, 2}), InvalidArgument, "permute");
  CUTRAIN_REQUIRE_THROWS_OP(permute(a, {0, 1, 5}), InvalidArgument, "permute");
  CUTRAIN_REQUIRE_THROWS_OP(permute(undefined, {}), InvalidArgument, "permute");
  CHECK(contains(message_of([&] { (void)permute(a, {0, 2, 2}); }), "name dim 2 twice"));
  // view / reshape
  CUTRAIN_REQUIRE_THROWS_OP(view(a, {5, 5}), InvalidArgument, "view");
  CUTRAIN_REQUIRE_THROWS_OP(view(a, {-1, -1}), InvalidArgument, "view");
  CUTRAIN_REQUIRE_THROWS_OP(view(a, {-1, 5}), InvalidArgument, "view");
  CUTRAIN_REQUIRE_THROWS_OP(view(a, {-2, -12}), InvalidArgument, "view");
  CUTRAIN_REQUIRE_THROWS_OP(view(transpose(a, 0, 1), {24}), InvalidArgument, "view");
  CUTRAIN_REQUIRE_THROWS_OP(view(expand(unsqueeze(a, 0), {2, 2, 3, 4}), {48}), InvalidArgument, "view");
  CUTRAIN_REQUIRE_THROWS_OP(view(Tensor<float>::zeros({0, 3}), {-1, 0}), InvalidArgument, "view");
  CUTRAIN_REQUIRE_THROWS_OP(view(a, {1ll << 40, 1ll << 40}), InvalidArgument, "view");
  CUTRAIN_REQUIRE_THROWS_OP(view(undefined, {1}), InvalidArgument, "view");
  CUTRAIN_REQUIRE_THROWS_OP(reshape(a, {7, -1}), InvalidArgument, "reshape");
  CUTRAIN_REQUIRE_THROWS_OP(reshape(a, {25}), InvalidArgument, "reshape");
  CUTRAIN_REQUIRE_THROWS_OP(reshape(undefined, {1}), InvalidArgument, "reshape");
  CHECK(contains(message_of([&] { (void)view(a, {5, 5}); }), "f32[2,3,4]"));
  CHECK(contains(message_of([&] { (void)reshape(a, {7, -1}); }), "cannot infer the -1 of [7,-1]"));
  CUTRAIN_REQUIRE_THROWS_OP(contiguous(undefined), InvalidArgument, "contiguous");
  // slice
  CUTRAIN_REQUIRE_THROWS_OP(slice(a, 3, 0, 1), InvalidArgument, "slice");
  CUTRAIN_REQUIRE_THROWS_OP(slice(a, -4, 0, 1), InvalidArgument, "slice");
  CUTRAIN_REQUIRE_THROWS_OP(slice(a, 0, 0, 1, 0), InvalidArgument, "slice");
  CUTRAIN_REQUIRE_THROWS_OP(slice(undefined, 0, 0, 1), InvalidArgument, "slice");
  CHECK(contains(message_of([&] { (void)slice(a, 1, 0, 2, 0); }), "step must be nonzero (and above -2^63), got 0 (dim 1 of f32[2,3,4]"));
  // squeeze / unsqueeze
  CUTRAIN_REQUIRE_THROWS_OP(squeeze(a, 1), InvalidArgument, "squeeze");
  CUTRAIN_REQUIRE_THROWS_OP(squeeze(a, 3), InvalidArgument, "squeeze");
  CUTRAIN_REQUIRE_THROWS_OP(squeeze(undefined), InvalidArgument, "squeeze");
  CUTRAIN_REQUIRE_THROWS_OP(unsqueeze(a, 4), InvalidArgument, "unsqueeze");
  CUTRAIN_REQUIRE_THROWS_OP(unsqueeze(a, -5), InvalidArgument, "unsqueeze");
  CUTRAIN_REQUIRE_THROWS_OP(unsqueeze(undefined, 0), InvalidArgument, "unsqueeze");
  CHECK(contains(message_of([&] { (void)squeeze(a, 1); }), "dim 1 of f32[2,3,4]"));
  // expand
  CUTRAIN_REQUIRE_THROWS_OP(expand(a, {3, 4}), InvalidArgument, "expand");
  CUTRAIN_REQUIRE_THROWS_OP(expand(a, {2, 5, 4}), InvalidArgument, "expand");
  CUTRAIN_REQUIRE_THROWS_OP(expand(a, {-1, 2, 3, 4}), InvalidArgument, "expand");
  CUTRAIN_REQUIRE_THROWS_OP(expand(unsqueeze(a, 0), {-2, 2, 3, 4}), InvalidArgument, "expand");
  CUTRAIN_REQUIRE_THROWS_OP(expand(undefined, {1}), InvalidArgument, "expand");
  CHECK(contains(message_of([&] { (void)expand(a, {2, 5, 4}); }), "dim 1 has size 3"));
  // as_strided stays inside the storage
  CUTRAIN_REQUIRE_THROWS_OP(a.as_strided({2, 3, 5}, {12, 4, 1}, 0), InvalidArgument, "Tensor::as_strided");
  CUTRAIN_REQUIRE_THROWS_OP(a.as_strided({2}, {1}, 23), InvalidArgument, "Tensor::as_strided");
  CUTRAIN_REQUIRE_THROWS_OP(a.as_strided({2}, {-1}, 0), InvalidArgument, "Tensor::as_strided");
  CUTRAIN_REQUIRE_THROWS_OP(a.as_strided({2}, {1, 1}, 0), InvalidArgument, "Tensor::as_strided");
  CUTRAIN_REQUIRE_THROWS_OP(a.as_strided({3}, {1ll << 62}, 0), InvalidArgument, "Tensor::as_strided");
  CUTRAIN_REQUIRE_THROWS_OP(a.as_strided({0}, {1}, 25), InvalidArgument, "Tensor::as_strided");
  CUTRAIN_REQUIRE_THROWS_OP(undefined.as_strided({1}, {1}, 0), InvalidArgument, "Tensor::as_strided");
  CHECK(a.as_strided({0}, {1}, 24).numel() == 0);
  CHECK(a.as_strided({2}, {-1}, 23).to_vector() == floats({23, 22}));
  // autograd: an undefined Var names the op
  CUTRAIN_REQUIRE_THROWS_OP(autograd::transpose(Var<double>{}, 0, 1), InvalidArgument, "transpose");
  CUTRAIN_REQUIRE_THROWS_OP(autograd::expand(Var<double>{}, {1}), InvalidArgument, "expand");
  CUTRAIN_REQUIRE_THROWS_OP(autograd::slice(Var<double>(Tensor<double>::zeros({2})), 1, 0), InvalidArgument, "slice");
}

}  // namespace cutrain_test_views
