// softmax / log_softmax over the last dimension of [N, C], forward and backward: dispatch on device.
#pragma once

#include "cutrain/core/abi.hpp"

#include "cutrain/cpu/softmax.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/softmax.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
template <class T>
void check_softmax_input(std::string_view op, const Tensor<T>& x, std::string_view name) {
  check::rank(op, x, 2, name);
  CUTRAIN_REQUIRE(x.dim(1) > 0, InvalidArgument, op, name, " ", x.describe(),
                  " has no classes (C == 0): softmax over an empty row is undefined");
}
}  // namespace detail

template <class T>
Tensor<T> softmax_forward(const Tensor<T>& x) {
  constexpr std::string_view op = "softmax_forward";
  detail::check_softmax_input(op, x, "x");
  return detail::dispatch<Tensor<T>>(
      op, [](const auto& x) { return cpu::softmax_forward(x); },
      CUTRAIN_IF_CUDA([](const auto& x) {
        Tensor<T> y = detail::device_output<T>(x.shape(), x);
        cuda::kernels::softmax_forward(x, y);
        return y;
      }),
      x);
}

// y is softmax_forward's output.
template <class T>
Tensor<T> softmax_backward(const Tensor<T>& y, const Tensor<T>& dy) {
  constexpr std::string_view op = "softmax_backward";
  detail::check_softmax_input(op, y, "y");
  check::shape(op, dy, y.shape(), "dy");
  return detail::dispatch<Tensor<T>>(
      op, [](const auto& y, const auto& dy) { return cpu::softmax_backward(y, dy); },
      CUTRAIN_IF_CUDA([](const auto& y, const auto& dy) {
        Tensor<T> dx = detail::device_output<T>(y.shape(), y);
        cuda::kernels::softmax_backward(y, dy, dx);
        return dx;
      }),
      y, dy);
}

template <class T>
Tensor<T> log_softmax_forward(const Tensor<T>& x) {
  constexpr std::string_view op = "log_softmax_forward";
  detail::check_softmax_input(op, x, "x");
  return detail::dispatch<Tensor<T>>(
      op, [](const auto& x) { return cpu::log_softmax_forward(x); },
      CUTRAIN_IF_CUDA([](const auto& x) {
        Tensor<T> y = detail::device_output<T>(x.shape(), x);
        cuda::kernels::log_softmax_forward(x, y);
        return y;
      }),
      x);
}

// y is log_softmax_forward's output.
template <class T>
Tensor<T> log_softmax_backward(const Tensor<T>& y, const Tensor<T>& dy) {
  constexpr std::string_view op = "log_softmax_backward";
  detail::check_softmax_input(op, y, "y");
  check::shape(op, dy, y.shape(), "dy");
  return detail::dispatch<Tensor<T>>(
      op, [](const auto& y, const auto& dy) { return cpu::log_softmax_backward(y, dy); },
      CUTRAIN_IF_CUDA([](const auto& y, const auto& dy) {
        Tensor<T> dx = detail::device_output<T>(y.shape(), y);
        cuda::kernels::log_softmax_backward(y, dy, dx);
        return dx;
      }),
      y, dy);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
