// softmax / log_softmax over the last dimension of [N, C], forward and backward: dispatch on device.
#pragma once

#include "cutrain/cpu/softmax.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/softmax.hpp"
#endif

namespace cutrain::ops {

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
  if (detail::on_cpu(op, x)) {
    if constexpr (CpuFloat<T>) return cpu::softmax_forward(x);
    else detail::cpu_dtype_unsupported<T>(op);
  }
#ifdef CUTRAIN_WITH_CUDA
  if constexpr (cuda::GpuFloat<T>) {
    Tensor<T> y = detail::device_output<T>(x.shape(), x);
    cuda::kernels::softmax_forward(x, y);
    return y;
  } else {
    detail::gpu_dtype_unsupported<T>(op);
  }
#endif
  return {};
}

// y is softmax_forward's output.
template <class T>
Tensor<T> softmax_backward(const Tensor<T>& y, const Tensor<T>& dy) {
  constexpr std::string_view op = "softmax_backward";
  detail::check_softmax_input(op, y, "y");
  check::shape(op, dy, y.shape(), "dy");
  if (detail::on_cpu(op, y, dy)) {
    if constexpr (CpuFloat<T>) return cpu::softmax_backward(y, dy);
    else detail::cpu_dtype_unsupported<T>(op);
  }
#ifdef CUTRAIN_WITH_CUDA
  if constexpr (cuda::GpuFloat<T>) {
    Tensor<T> dx = detail::device_output<T>(y.shape(), y);
    cuda::kernels::softmax_backward(y, dy, dx);
    return dx;
  } else {
    detail::gpu_dtype_unsupported<T>(op);
  }
#endif
  return {};
}

template <class T>
Tensor<T> log_softmax_forward(const Tensor<T>& x) {
  constexpr std::string_view op = "log_softmax_forward";
  detail::check_softmax_input(op, x, "x");
  if (detail::on_cpu(op, x)) {
    if constexpr (CpuFloat<T>) return cpu::log_softmax_forward(x);
    else detail::cpu_dtype_unsupported<T>(op);
  }
#ifdef CUTRAIN_WITH_CUDA
  if constexpr (cuda::GpuFloat<T>) {
    Tensor<T> y = detail::device_output<T>(x.shape(), x);
    cuda::kernels::log_softmax_forward(x, y);
    return y;
  } else {
    detail::gpu_dtype_unsupported<T>(op);
  }
#endif
  return {};
}

// y is log_softmax_forward's output.
template <class T>
Tensor<T> log_softmax_backward(const Tensor<T>& y, const Tensor<T>& dy) {
  constexpr std::string_view op = "log_softmax_backward";
  detail::check_softmax_input(op, y, "y");
  check::shape(op, dy, y.shape(), "dy");
  if (detail::on_cpu(op, y, dy)) {
    if constexpr (CpuFloat<T>) return cpu::log_softmax_backward(y, dy);
    else detail::cpu_dtype_unsupported<T>(op);
  }
#ifdef CUTRAIN_WITH_CUDA
  if constexpr (cuda::GpuFloat<T>) {
    Tensor<T> dx = detail::device_output<T>(y.shape(), y);
    cuda::kernels::log_softmax_backward(y, dy, dx);
    return dx;
  } else {
    detail::gpu_dtype_unsupported<T>(op);
  }
#endif
  return {};
}

}  // namespace cutrain::ops
