// Softmax and log-softmax along any axis of rank 1-4 tensors on the GPU against the CPU backend
// in f64, in f32, bf16 and f16, forward and backward: each kernel shape (rows for the last axis,
// strided rows for few long rows, columns for many rows), strided (transposed) inputs, outputs
// poisoned with NaN, the ops:: entry points, the autograd versions, and bad axes.
#include "parity.hpp"

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "cutrain/autograd/functions/softmax.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/cuda/kernels/softmax.hpp"
#include "cutrain/cuda/runtime.hpp"
#include "cutrain/ops/softmax.hpp"

namespace cutrain_test_softmax_axis_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
namespace kernels = cutrain::cuda::kernels;

namespace {

std::uint64_t seed_of(const std::string& tag) { return std::hash<std::string>{}(tag); }

// shape along axis; transposed: the input is transpose(a contiguous tensor, 0, rank - 1), strided.
template <class T>
void run_axis(const Shape& shape, int axis, bool transposed = false) {
  const std::string tag = cutrain::detail::cat("softmax axis ", dtype_of<T>, " ", shape, " axis ", axis,
                                               transposed ? " transposed" : "");
  Rng rng(seed_of(tag));
  const int r = shape.rank();
  Shape stored = shape;
  if (transposed) std::swap(stored[0], stored[r - 1]);
  auto [x0, xr0] = random_pair<T>(stored, rng, Layout::row_major);
  auto [dy0, dyr0] = random_pair<T>(stored, rng, Layout::row_major);
  auto view = [&](const auto& t) { return transposed ? transpose(t, 0, r - 1) : t.view(); };
  const Tensor<T> x = view(x0), dy = view(dy0);
  const Tensor<double> xr = view(xr0), dyr = view(dyr0);
  if (transposed && shape[0] > 1 && shape[r - 1] > 1) REQUIRE(x.layout() == Layout::strided);
  for (const bool log : {false, true}) {
    const std::string name = tag + (log ? " log_softmax" : " softmax");
    const auto y_ref = log ? ops::log_softmax_forward(xr, axis) : ops::softmax_forward(xr, axis);
    auto y = poisoned<T>(shape, Layout::row_major);
    if (log) kernels::log_softmax_forward(x, y, axis);
    else kernels::softmax_forward(x, y, axis);
    check_close(name + " forward (kernel)", y, y_ref);
    auto y2 = log ? ops::log_softmax_forward(x, axis) : ops::softmax_forward(x, axis);
    CHECK(y2.device() == Device::cuda(0));
    CHECK(y2.shape() == shape);
    check_close(name + " forward (ops)", y2, y_ref);

    // The backward starts from the GPU's own y, in f64 for the reference.
    const auto yr = cast<double>(y2).to(Device::cpu());
    const auto dx_ref = log ? ops::log_softmax_backward(yr, dyr, axis) : ops::softmax_backward(yr, dyr, axis);
    auto dx = poisoned<T>(shape, Layout::row_major);
    if (log) kernels::log_softmax_backward(y2, dy, dx, axis);
    else kernels::softmax_backward(y2, dy, dx, axis);
    check_close(name + " backward (kernel)", dx, dx_ref);
    auto dx2 = log ? ops::log_softmax_backward(y2, dy, axis) : ops::softmax_backward(y2, dy, axis);
    CHECK(dx2.device() == Device::cuda(0));
    check_close(name + " backward (ops)", dx2, dx_ref);
  }
  cuda::synchronize();
  std::printf("%-72s ok\n", tag.c_str());
}

template <class T>
void run_axis_all() {
  run_axis<T>({7}, 0);
  run_axis<T>({5000}, -1);
  run_axis<T>({13, 9}, 0);            // strided rows: 9 rows of 13, 9 apart
  run_axis<T>({13, 9}, -1);
  run_axis<T>({3, 4, 5}, 1);
  run_axis<T>({2, 3, 4, 5}, 0);
  run_axis<T>({2, 3, 4, 5}, 2);
  run_axis<T>({2, 3, 4, 5}, -1);
  run_axis<T>({64, 10, 128}, 1);      // columns: 8192 rows of 10, 128 apart
  run_axis<T>({1000, 3000}, 0);       // columns: 3000 rows of 1000
  run_axis<T>({4, 20000, 3}, 1);      // strided rows: 12 long rows, 3 apart
  run_axis<T>({8, 300, 200}, 1);      // strided rows or columns at the switch (1600 rows of 300)
  run_axis<T>({6, 5, 7}, 1, true);    // transposed inputs (strided), each axis
  run_axis<T>({6, 5, 7}, 0, true);
  run_axis<T>({6, 5, 7}, -1, true);
  run_axis<T>({40, 3, 200}, 0, true);
}

}  // namespace

TEST_CASE("gpu softmax and log-softmax along any axis match the CPU backend") {
  run_axis_all<float>();
  run_axis_all<cutrain::bfloat16>();
  run_axis_all<cutrain::half>();
}

TEST_CASE("gpu softmax along an axis: autograd, empty tensors, bad axes") {
  const auto cuda0 = Device::cuda(0);
  Rng rng(77);
  auto [x, xr] = random_pair<float>({4, 6, 5}, rng, Layout::row_major);
  auto [dy, dyr] = random_pair<float>({4, 6, 5}, rng, Layout::row_major);
  for (const bool log : {false, true}) {
    autograd::Var<float> v(x.clone(), true);
    auto y = log ? autograd::log_softmax(v, 1) : autograd::softmax(v, 1);
    y.backward(dy);
    const auto y_ref = log ? ops::log_softmax_forward(xr, 1) : ops::softmax_forward(xr, 1);
    const auto yr = cast<double>(y.value()).to(Device::cpu());
    check_close("autograd forward", y.value(), y_ref);
    check_close("autograd backward", v.grad(),
                log ? ops::log_softmax_backward(yr, dyr, 1) : ops::softmax_backward(yr, dyr, 1));
    CHECK(v.grad().device() == cuda0);
  }
  Tensor<float> e({3, 0, 4}, {.device = cuda0});
  CHECK(ops::softmax_forward(e, 0).shape() == Shape{3, 0, 4});
  CHECK(ops::log_softmax_backward(e, e, -1).shape() == Shape{3, 0, 4});
  CHECK_THROWS_AS(ops::softmax_forward(e, 1), InvalidArgument);  // the axis itself is empty
  CHECK_THROWS_AS(ops::softmax_forward(x, 3), InvalidArgument);
  CHECK_THROWS_AS(ops::log_softmax_backward(x, dy, -4), InvalidArgument);
  Tensor<float> y({4, 6, 5}, {.device = cuda0});
  CHECK_THROWS_AS(kernels::softmax_forward(x, y, 3), InvalidArgument);
  CHECK_THROWS_AS(kernels::log_softmax_backward(x, dy, y, -4), InvalidArgument);
  Tensor<float> nhwc({2, 3, 4, 5}, {.layout = Layout::nhwc, .device = cuda0});
  Tensor<float> x4({2, 3, 4, 5}, {.device = cuda0});
  x4.fill(0.5f);
  CHECK_THROWS_AS(kernels::softmax_forward(x4, nhwc, 1), InvalidArgument);  // the kernel writes row-major
  nhwc.fill(0.25f);  // an nhwc input is staged; every row of 3 is uniform
  for (float v : ops::softmax_forward(nhwc, 1).to_vector()) CHECK(v == Approx(1.0f / 3).epsilon(1e-6));
  std::printf("%-72s ok\n", "softmax axis autograd, empty and bad input");
}

}  // namespace cutrain_test_softmax_axis_gpu
