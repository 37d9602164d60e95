// softmax / log_softmax along any axis of a tensor of rank >= 1 (default the last, the [N, C]
// rows of the loss), forward and backward: dispatch on device (docs/ops/softmax_cross_entropy.md).
#pragma once

#include "cutrain/core/abi.hpp"

#include <string_view>

#include "cutrain/cpu/softmax.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/softmax.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
// x defined, rank >= 1, axis in [-rank, rank) and non-empty: the axis in [0, rank).
template <class T>
int check_softmax_input(std::string_view op, const Tensor<T>& x, int axis, std::string_view name) {
  check::defined(op, x, name);
  const int r = x.rank();
  CUTRAIN_REQUIRE(r >= 1, InvalidArgument, op, name, " ", x.describe(),
                  " is a scalar: softmax needs rank >= 1 (an axis to normalize along)");
  CUTRAIN_REQUIRE(axis >= -r && axis < r, InvalidArgument, op, "axis ", axis, " out of range for ", name, " ",
                  x.describe(), " (rank ", r, ": axes ", -r, " to ", r - 1, ")");
  const int a = axis < 0 ? axis + r : axis;
  CUTRAIN_REQUIRE(x.dim(a) > 0, InvalidArgument, op, name, " ", x.describe(), " has no classes along axis ", axis,
                  " (C == 0): softmax over an empty row is undefined");
  return a;
}

template <class T>
Tensor<T> softmax_fwd(std::string_view op, const Tensor<T>& x, int axis, bool log) {
  const int a = check_softmax_input(op, x, axis, "x");
  return dispatch<Tensor<T>>(
      op, [&](const auto& x) { return log ? cpu::log_softmax_forward(x, a) : cpu::softmax_forward(x, a); },
      CUTRAIN_IF_CUDA([&](const auto& x) {
        Tensor<T> y(x.shape(), {.device = x.device()});  // row-major, as the kernel writes
        if (log) cuda::kernels::log_softmax_forward(x, y, a);
        else cuda::kernels::softmax_forward(x, y, a);
        return y;
      }),
      x);
}

template <class T>
Tensor<T> softmax_bwd(std::string_view op, const Tensor<T>& y, const Tensor<T>& dy, int axis, bool log) {
  const int a = check_softmax_input(op, y, axis, "y");
  check::shape(op, dy, y.shape(), "dy");
  return dispatch<Tensor<T>>(
      op,
      [&](const auto& y, const auto& dy) {
        return log ? cpu::log_softmax_backward(y, dy, a) : cpu::softmax_backward(y, dy, a);
      },
      CUTRAIN_IF_CUDA([&](const auto& y, const auto& dy) {
        Tensor<T> dx(y.shape(), {.device = y.device()});
        if (log) cuda::kernels::log_softmax_backward(y, dy, dx, a);
        else cuda::kernels::softmax_backward(y, dy, dx, a);
        return dx;
      }),
      y, dy);
}
}  // namespace detail

// y = exp(x - max) / sum exp(x - max) along axis (negative counts from the end).
template <class T>
Tensor<T> softmax_forward(const Tensor<T>& x, int axis = -1) {
  return detail::softmax_fwd("softmax_forward", x, axis, false);
}

// y is softmax_forward's output along the same axis.
template <class T>
Tensor<T> softmax_backward(const Tensor<T>& y, const Tensor<T>& dy, int axis = -1) {
  return detail::softmax_bwd("softmax_backward", y, dy, axis, false);
}

// y = x - max - log(sum exp(x - max)) along axis.
template <class T>
Tensor<T> log_softmax_forward(const Tensor<T>& x, int axis = -1) {
  return detail::softmax_fwd("log_softmax_forward", x, axis, true);
}

// y is log_softmax_forward's output along the same axis.
template <class T>
Tensor<T> log_softmax_backward(const Tensor<T>& y, const Tensor<T>& dy, int axis = -1) {
  return detail::softmax_bwd("log_softmax_backward", y, dy, axis, true);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
