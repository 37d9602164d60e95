// Views on cuda tensors (core/view.hpp) against the same views of the CPU reference, in f32,
// bf16 and f16, from NCHW and NHWC inputs: the views stay on the device and share its storage,
// contiguous() copies them on the device (bit for bit), and the backward of every view through
// autograd (expand's through ops::sum_to) matches the CPU's in f64; reversed views (negative
// strides) in ops, and argmax/argmin of the last tie. sum_to itself over
// strided inputs, long sums, more outputs than one grid holds, and a scalar target.
#include "parity.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "cutrain/autograd.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/ops/conv2d.hpp"
#include "cutrain/ops/elementwise.hpp"
#include "cutrain/ops/matmul.hpp"
#include "cutrain/ops/reduce.hpp"
#include "cutrain/ops/sum_to.hpp"

namespace cutrain_test_views_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {

// fn applied to the cuda tensor x and to its f64 host copy ref: the view stays a view of x on the
// device; its values (read back directly, and after contiguous() on the device) equal the CPU's.
template <class T, class Fn>
void check_view(const std::string& what, const Tensor<T>& x, const Tensor<double>& ref, Fn fn) {
  INFO(what << " of " << x.describe());
  const Tensor<T> v = fn(x);
  const Tensor<double> want = fn(ref);
  REQUIRE(v.shape() == want.shape());
  CHECK(v.device() == x.device());
  check_close(what + " (view)", v, want, 0.0);
  const Tensor<T> c = v.contiguous();
  CHECK(c.device() == x.device());
  CHECK(c.is_contiguous());
  check_close(what + " (contiguous)", c, want, 0.0);
  const Tensor<T> r = reshape(v, {-1});
  CHECK(r.device() == x.device());
  check_close(what + " (reshape -1)", r, reshape(want, {-1}), 0.0);
}

template <class T>
void views_forward(std::uint64_t seed) {
  // contiguous() of a cuda tensor runs on the device: the backend's strided copy is installed.
  REQUIRE(cutrain::detail::device_backend_slot().strided_copy != nullptr);
  Rng rng(seed);
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    auto [x, ref] = random_pair<T>({2, 3, 4, 5}, rng, l);
    check_view("transpose", x, ref, [](const auto& t) { return transpose(t, 1, 3); });
    check_view("permute", x, ref, [](const auto& t) { return permute(t, {3, 1, 0, 2}); });
    check_view("slice step", x, ref, [](const auto& t) { return slice(t, 2, 1, slice_end, 2); });
    check_view("slice negative", x, ref, [](const auto& t) { return slice(t, -1, -4, -1, 2); });
    check_view("slice of transpose", x, ref, [](const auto& t) { return slice(transpose(t, 0, 2), 1, 1, 3); });
    check_view("squeeze unsqueeze", x, ref, [](const auto& t) { return unsqueeze(squeeze(slice(t, 0, 1, 2)), 1); });
    check_view("expand", x, ref, [](const auto& t) { return expand(unsqueeze(slice(t, 1, 0, 1), 0), {3, 2, 4, 4, 5}); });
    check_view("reshape", x, ref, [](const auto& t) { return reshape(transpose(t, 0, 1), {6, -1}); });
    check_view("view", x, ref, [](const auto& t) { return view(contiguous(t), {2, 3, 20}); });
    check_view("flip", x, ref, [](const auto& t) { return flip(t, {1, 3}); });
    check_view("slice step -2", x, ref, [](const auto& t) { return slice(t, 2, -1, 0, -2); });
    check_view("flip of transpose", x, ref, [](const auto& t) { return flip(transpose(t, 0, 2), {0}); });
  }
}

// Ops read reversed views (negative strides) as the CPU does: elementwise, a reduction, a matmul,
// a convolution of horizontally flipped images (augmentation), and argmax / argmin of the last of
// equal values.
template <class T>
void reversed_views_in_ops(std::uint64_t seed) {
  Rng rng(seed);
  auto [x, ref] = random_pair<T>({2, 3, 8, 8}, rng, Layout::nchw);
  const auto fx = flip(x, {3});
  const auto fr = flip(ref, {3});
  check_close("add", ops::add(fx, x), ops::add(fr, ref));
  check_close("sum", ops::sum(fx, {0, 3}), ops::sum(fr, {0, 3}));
  auto [a, a_ref] = random_pair<T>({16, 24}, rng, Layout::row_major);
  check_close("matmul", ops::matmul(flip(a, {0, 1}), transpose(a, 0, 1)),
              ops::matmul(flip(a_ref, {0, 1}), transpose(a_ref, 0, 1)), 50 * tolerance<T>);
  auto [w, w_ref] = random_pair<T>({4, 3, 3, 3}, rng, Layout::nchw);
  const Conv2dParams cp = Conv2dParams::make(1, 1);
  check_close("conv2d of flipped images", ops::conv2d_forward(fx, w, cp), ops::conv2d_forward(fr, w_ref, cp),
              50 * tolerance<T>);
  // Ties: small integers.
  std::vector<float> v(2 * 3 * 40);
  for (auto& e : v) e = static_cast<float>(rng.below(4));
  const auto tf = Tensor<float>::from_vector(v, {2, 3, 40});
  const auto t = cast<T>(tf).to(Device::cuda(0));
  for (const Axes& axes : {Axes{2}, Axes{0, 2}, Axes{}}) {
    CHECK(ops::argmax(t, axes, false, true).to(Device::cpu()).to_vector() ==
          ops::argmax(tf, axes, false, true).to_vector());
    CHECK(ops::argmin(t, axes, true, true).to(Device::cpu()).to_vector() ==
          ops::argmin(tf, axes, true, true).to_vector());
  }
}

// The backward of a chain of views on the GPU against the CPU's in f64; the gradient of the
// leaf is on the device, contiguous, in the leaf's layout.
template <class T, class Fn>
void check_view_grad(const std::string& what, Rng& rng, Layout l, Fn fn) {
  INFO(what << " in " << l);
  auto [x, ref] = random_pair<T>({2, 3, 4, 5}, rng, l);
  Var<T> xv(std::move(x), true);
  Var<double> rv(std::move(ref), true);
  Var<T> y = fn(xv);
  Var<double> yr = fn(rv);
  REQUIRE(y.shape() == yr.shape());
  auto [seed, seed_ref] = random_pair<T>(y.shape(), rng, Layout::row_major);
  y.backward(seed);
  yr.backward(seed_ref);
  const Tensor<T>& g = xv.grad();
  REQUIRE(g.defined());
  CHECK(g.device() == Device::cuda(0));
  CHECK(g.is_contiguous());
  CHECK((g.layout() == Layout::nhwc) == (l == Layout::nhwc));
  check_close(what + " dx", g, rv.grad());
}

template <class T>
void views_backward(std::uint64_t seed) {
  Rng rng(seed);
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    check_view_grad<T>("transpose", rng, l, [](const auto& x) { return autograd::transpose(x, 1, 3); });
    check_view_grad<T>("permute", rng, l, [](const auto& x) { return autograd::permute(x, {2, 0, 3, 1}); });
    check_view_grad<T>("reshape", rng, l, [](const auto& x) { return autograd::reshape(autograd::transpose(x, 0, 1), {-1}); });
    check_view_grad<T>("slice", rng, l, [](const auto& x) { return autograd::slice(x, 3, 1, slice_end, 2); });
    check_view_grad<T>("squeeze unsqueeze", rng, l,
                       [](const auto& x) { return autograd::unsqueeze(autograd::squeeze(autograd::slice(x, 1, 2, 3)), -1); });
    check_view_grad<T>("expand", rng, l, [](const auto& x) {
      return autograd::expand(autograd::unsqueeze(autograd::slice(x, 2, 0, 1), 0), {6, 2, 3, 7, 5});
    });
    check_view_grad<T>("flip", rng, l, [](const auto& x) { return autograd::flip(x, {0, 3}); });
    check_view_grad<T>("slice step -3", rng, l, [](const auto& x) { return autograd::slice(x, 2, -1, slice_end, -3); });
    check_view_grad<T>("chain", rng, l, [](const auto& x) {
      auto t = autograd::slice(autograd::permute(x, {0, 2, 3, 1}), 1, 0, slice_end, 3);  // [2, 2, 5, 3]
      return autograd::contiguous(autograd::expand(autograd::unsqueeze(t, 1), {2, 4, 2, 5, 3}));
    });
  }
}

template <class T>
void sum_to_parity(std::uint64_t seed) {
  Rng rng(seed);
  struct Case {
    Shape from, to;
    bool transposed;
  };
  const std::vector<Case> cases = {
      {{2, 3, 4}, {3, 1}, false},      {{2, 3, 4}, {4}, false},          {{2, 3, 4}, {}, false},
      {{5, 7}, {5, 1}, true},          {{4096, 3}, {1, 3}, false},       {{3, 70000}, {1, 70000}, false},
      {{6, 1, 5}, {1, 5}, false},      {{2, 3, 4}, {2, 3, 4}, false},    {{0, 4}, {1, 4}, false},
      {{2, 1, 3, 1, 2}, {1, 3, 1, 1}, true},
  };
  for (const auto& c : cases) {
    INFO("sum_to " << c.from << " -> " << c.to << (c.transposed ? " (strided input)" : ""));
    auto [x, ref] = random_pair<T>(c.from, rng, Layout::row_major);
    // A strided input: the values of x seen through a transposed copy, transposed back.
    Tensor<T> xs = c.transposed ? transpose(transpose(x, 0, -1).contiguous(), 0, -1) : x.view();
    REQUIRE(xs.shape() == c.from);
    const Tensor<T> y = ops::sum_to(xs, c.to);
    CHECK(y.device() == Device::cuda(0));
    CHECK(y.layout() != Layout::strided);
    // f32 sums of up to 4096 values rounded once to T: the relative error is T's rounding.
    check_close("sum_to", y, ops::sum_to(ref, c.to));
  }
}

}  // namespace

TEST_CASE("gpu views: f32 views stay on the device, contiguous() matches the CPU bit for bit") { views_forward<float>(101); }
TEST_CASE("gpu views: bf16 views stay on the device, contiguous() matches the CPU bit for bit") { views_forward<bfloat16>(102); }
TEST_CASE("gpu views: f16 views stay on the device, contiguous() matches the CPU bit for bit") { views_forward<cutrain::half>(103); }

TEST_CASE("gpu views: ops read reversed views (negative strides) as the CPU does, f32 and bf16") {
  reversed_views_in_ops<float>(121);
  reversed_views_in_ops<bfloat16>(122);
}

TEST_CASE("gpu views: f32 backward of every view matches the CPU") { views_backward<float>(111); }
TEST_CASE("gpu views: bf16 backward of every view matches the CPU") { views_backward<bfloat16>(112); }
TEST_CASE("gpu views: f16 backward of every view matches the CPU") { views_backward<cutrain::half>(113); }

TEST_CASE("gpu views: sum_to matches the CPU in f32, bf16, f16") {
  sum_to_parity<float>(121);
  sum_to_parity<bfloat16>(122);
  sum_to_parity<cutrain::half>(123);
}

TEST_CASE("gpu views: bad input on cuda tensors throws as on the CPU") {
  auto x = Tensor<float>::zeros({2, 3}, {.device = Device::cuda(0)});
  const auto throws_naming = [](auto fn, const std::string& op) {
    std::string msg;
    try {
      (void)fn();
    } catch (const InvalidArgument& e) {
      msg = e.what();
    }
    INFO("message: " << msg);
    CHECK(msg.find("cutrain::" + op + ":") != std::string::npos);
  };
  throws_naming([&] { return view(transpose(x, 0, 1), {6}); }, "view");
  throws_naming([&] { return expand(x, {2, 4}); }, "expand");
  throws_naming([&] { return ops::sum_to(x, {2}); }, "sum_to");  // [2, 3] sums to [3], not [2]
  throws_naming([&] { return slice(x, 0, 0, 1, 0); }, "slice");
}

}  // namespace cutrain_test_views_gpu
