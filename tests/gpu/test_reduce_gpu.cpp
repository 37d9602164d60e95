// Reductions (sum, mean, max/argmax, min/argmin, var, norm) and their backwards on the GPU against
// the CPU backend in f64 on the same (rounded) random data, in f32, bf16 and f16: ranks 1-5,
// sizes 1-7 and a few large, keepdim on and off, contiguous, column-sliced (strided) and NHWC
// inputs; the kernels into NaN-poisoned outputs; argmax indices exactly; autograd on the device.
#include "parity.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "cutrain/autograd/functions/reduce.hpp"
#include "cutrain/cuda/kernels/reduce.hpp"
#include "cutrain/ops/reduce.hpp"

namespace cutrain_test_reduce_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
namespace kernels = cutrain::cuda::kernels;

namespace {

// The input as the GPU sees it (x on cuda:0) and the same values in f64 on the host (ref).
// layout: row_major, nhwc (4-d only) or strided: a slice [1, 1 + n) of the last axis of a tensor
// 3 wider there, so that neighbouring memory holds other values.
template <class T>
struct Input {
  Tensor<T> x;
  Tensor<double> ref;
};

template <class T>
Input<T> make_input(const Shape& s, Rng& rng, Layout l) {
  if (l != Layout::strided) {
    auto [x, ref] = random_pair<T>(s, rng, l);
    return {std::move(x), std::move(ref)};
  }
  std::vector<std::int64_t> wide_dims = s.dims();
  wide_dims.back() += 3;
  const Shape wide(wide_dims);
  auto host = cast<T>(Tensor<float>::uniform(wide, rng, -1.0, 1.0));
  const int last = s.rank() - 1;
  const std::int64_t n = s[last];
  Input<T> in{host.to(Device::cuda(0)).slice(last, 1, 1 + n), cast<double>(host).slice(last, 1, 1 + n)};
  return in;
}

template <class T>
Tensor<T> random_device(const Shape& s, Rng& rng, Tensor<double>& ref) {
  auto [t, r] = random_pair<T>(s, rng, Layout::row_major);
  ref = std::move(r);
  return std::move(t);
}

std::string axes_name(const Axes& axes) { return cutrain::detail::axes_str(axes); }

template <class T>
void check_case(const std::string& tag, const Shape& s, const Axes& axes, bool keepdim, Layout l, Rng& rng) {
  const std::string name = tag + " " + s.str() + " " + std::string(to_string(l)) + " axes " + axes_name(axes) +
                           (keepdim ? " keepdim" : "");
  INFO(name);
  const Input<T> in = make_input<T>(s, rng, l);
  const Tensor<T>& x = in.x;
  const Tensor<double>& xr = in.ref;
  const ReducePlan p = make_reduce_plan("test", s, axes, keepdim);

  // Forward through ops::.
  check_close(name + " sum", ops::sum(x, axes, keepdim), ops::sum(xr, axes, keepdim));
  check_close(name + " norm2", ops::norm(x, 2.0, axes, keepdim), ops::norm(xr, 2.0, axes, keepdim));
  check_close(name + " norm1", ops::norm(x, 1.0, axes, keepdim), ops::norm(xr, 1.0, axes, keepdim));
  check_close(name + " norm3", ops::norm(x, 3.0, axes, keepdim), ops::norm(xr, 3.0, axes, keepdim));
  const bool has_elements = p.n_red > 0 || p.n_out == 0;
  if (has_elements) {
    check_close(name + " mean", ops::mean(x, axes, keepdim), ops::mean(xr, axes, keepdim));
    const auto mx = ops::max_with_indices(x, axes, keepdim);
    const auto mxr = ops::max_with_indices(xr, axes, keepdim);
    check_close(name + " max", mx.values, mxr.values);
    CHECK(mx.indices.device() == Device::cuda(0));
    CHECK(mx.indices.to_vector() == mxr.indices.to_vector());
    const auto mn = ops::min_with_indices(x, axes, keepdim);
    const auto mnr = ops::min_with_indices(xr, axes, keepdim);
    check_close(name + " min", mn.values, mnr.values);
    CHECK(mn.indices.to_vector() == mnr.indices.to_vector());

    // Backward of max and min, each side with its own indices (equal, as checked above).
    Tensor<double> dyr;
    const Tensor<T> dy = random_device<T>(p.out_shape, rng, dyr);
    check_close(name + " max_backward", ops::max_backward(dy, mx.indices, s, axes, keepdim),
                ops::max_backward(dyr, mxr.indices, s, axes, keepdim));
    check_close(name + " min_backward", ops::min_backward(dy, mn.indices, s, axes, keepdim),
                ops::min_backward(dyr, mnr.indices, s, axes, keepdim));
    check_close(name + " mean_backward", ops::mean_backward(dy, s, axes, keepdim),
                ops::mean_backward(dyr, s, axes, keepdim));

    // The kernels into poisoned outputs: every element written.
    auto y = poisoned<T>(p.out_shape, Layout::row_major);
    auto idx = Tensor<std::int32_t>::full(p.out_shape, -7, {.device = Device::cuda(0)});
    kernels::reduce_arg(x, p, true, y, idx);
    check_close(name + " reduce_arg kernel", y, mxr.values);
    CHECK(idx.to_vector() == mxr.indices.to_vector());
  }
  for (double correction : {0.0, 1.0}) {
    if (p.n_out > 0 && static_cast<double>(p.n_red) <= correction) continue;
    const std::string vn = name + " var(correction " + std::to_string(static_cast<int>(correction)) + ")";
    check_close(vn, ops::var(x, axes, correction, keepdim), ops::var(xr, axes, correction, keepdim));
    Tensor<double> dyr;
    const Tensor<T> dy = random_device<T>(p.out_shape, rng, dyr);
    check_close(vn + " backward", ops::var_backward(x, dy, axes, correction, keepdim),
                ops::var_backward(xr, dyr, axes, correction, keepdim));
  }

  // Backward of sum and norm (the CPU gets the GPU's own norm output, as the backward would).
  Tensor<double> dyr;
  const Tensor<T> dy = random_device<T>(p.out_shape, rng, dyr);
  check_close(name + " sum_backward", ops::sum_backward(dy, s, axes, keepdim), ops::sum_backward(dyr, s, axes, keepdim));
  for (double pn : {1.0, 2.0, 3.0}) {
    const Tensor<T> y = ops::norm(x, pn, axes, keepdim);
    const Tensor<double> yr = cast<double>(y.to(Device::cpu()));
    check_close(name + " norm_backward p " + std::to_string(static_cast<int>(pn)), ops::norm_backward(x, y, dy, pn, axes, keepdim),
                ops::norm_backward(xr, yr, dyr, pn, axes, keepdim));
  }

  auto ys = poisoned<T>(p.out_shape, Layout::row_major);
  kernels::reduce_sum(x, p, 1.0, ys);
  check_close(name + " reduce_sum kernel", ys, ops::sum(xr, axes, keepdim));
  auto dx = poisoned<T>(s, Layout::row_major);
  kernels::reduce_sum_backward(dy, p, 1.0, dx);
  check_close(name + " reduce_sum_backward kernel", dx, ops::sum_backward(dyr, s, axes, keepdim));
}

struct Case {
  Shape shape;
  Axes axes;
};

// Ranks 1-5, sizes 1-7, single and several axes, all axes (empty list), and size-1 axes.
const std::vector<Case>& small_cases() {
  static const std::vector<Case> cases = {
      {{1}, {}},
      {{7}, {0}},
      {{5}, {}},
      {{3, 4}, {1}},
      {{3, 4}, {0}},
      {{1, 6}, {-1}},
      {{7, 1}, {0, 1}},
      {{2, 3, 5}, {0, 2}},
      {{4, 1, 3}, {1}},
      {{6, 5, 7}, {-2}},
      {{2, 3, 4, 5}, {1}},
      {{3, 2, 5, 4}, {1, 2, 3}},
      {{2, 7, 3, 3}, {0, 2}},
      {{1, 3, 2, 6}, {}},
      {{2, 3, 1, 4, 5}, {0, 3}},
      {{3, 1, 2, 5, 2}, {1, 2, 4}},
      {{2, 2, 3, 3, 7}, {4}},
  };
  return cases;
}

template <class T>
void check_all(const std::string& tag) {
  Rng rng(std::hash<std::string>{}(tag));
  for (const Case& c : small_cases()) {
    for (bool keepdim : {false, true}) {
      check_case<T>(tag, c.shape, c.axes, keepdim, Layout::row_major, rng);
      check_case<T>(tag, c.shape, c.axes, keepdim, Layout::strided, rng);
      if (c.shape.rank() == 4) check_case<T>(tag, c.shape, c.axes, keepdim, Layout::nhwc, rng);
    }
  }
}

}  // namespace

TEST_CASE("gpu reduce: every op and backward against the CPU, f32", "[gpu][reduce]") { check_all<float>("f32"); }
TEST_CASE("gpu reduce: every op and backward against the CPU, bf16", "[gpu][reduce]") { check_all<bfloat16>("bf16"); }
TEST_CASE("gpu reduce: every op and backward against the CPU, f16", "[gpu][reduce]") { check_all<cutrain::half>("f16"); }

TEST_CASE("gpu reduce: large reductions and many outputs", "[gpu][reduce]") {
  Rng rng(99);
  // Long rows (256 threads, many elements each), many short outputs (grid-stride over outputs
  // beyond 2^20 blocks), and a reduction over a leading axis (strided reads).
  check_case<float>("f32 large", {3, 200003}, {1}, false, Layout::row_major, rng);
  check_case<float>("f32 large", {1100000, 3}, {1}, true, Layout::row_major, rng);
  check_case<float>("f32 large", {1031, 517}, {0}, false, Layout::strided, rng);
  check_case<bfloat16>("bf16 large", {2, 3000, 7}, {0, 1}, false, Layout::row_major, rng);
  // Sums over leading axes with many outputs: one thread per output (cutrain_reduce_sum_columns),
  // a position embedding's gradient among them ({1031, 517} above keeps a block per output).
  check_case<bfloat16>("bf16 columns", {16, 1024, 768}, {0}, false, Layout::row_major, rng);
  check_case<float>("f32 columns", {40, 70001}, {0}, true, Layout::row_major, rng);
  check_case<float>("f32 columns", {6, 7, 9000}, {0, 1}, false, Layout::strided, rng);
  // 68640 elements: their sum of |x| (about 34000) stays below f16's largest value (65504).
  check_case<cutrain::half>("f16 large", {32, 33, 65}, {}, true, Layout::row_major, rng);
}

TEST_CASE("gpu reduce: empty tensors and autograd on the device", "[gpu][reduce]") {
  auto x = Tensor<float>::zeros({2, 0, 3}, {.device = Device::cuda(0)});
  auto s = ops::sum(x, {1});
  CHECK(s.device() == Device::cuda(0));
  CHECK(s.to_vector() == std::vector<float>(6, 0.0f));
  CHECK(ops::max(x, {2}).shape() == (Shape{2, 0}));
  CHECK(ops::sum_backward(Tensor<float>({2, 0}, {.device = Device::cuda(0)}), x.shape(), {2}).numel() == 0);
  CHECK_THROWS_AS(ops::max(x, {1}), InvalidArgument);
  CHECK_THROWS_WITH(ops::max(x, {1}), Catch::Contains("cutrain::max") && Catch::Contains("[2,0,3]"));

  Rng rng(5);
  auto [xd, xr] = random_pair<float>({3, 4}, rng, Layout::row_major);
  auto v = autograd::parameter(std::move(xd));
  auto loss = autograd::sum(autograd::norm(v, 2.0, {1}));
  loss.backward();
  REQUIRE(v.grad().defined());
  CHECK(v.grad().device() == Device::cuda(0));
  auto ones = Tensor<double>::full({3}, 1.0);
  check_close("autograd norm grad", v.grad(), ops::norm_backward(xr, ops::norm(xr, 2.0, {1}), ones, 2.0, {1}));
}

}  // namespace cutrain_test_reduce_gpu
