// linear_forward / linear_backward: dispatch on the tensors' device.
#pragma once

#include "cutrain/cpu/linear.hpp"
#include "cutrain/ops/dispatch.hpp"

namespace cutrain::ops {

namespace detail {
inline constexpr std::string_view linear_shapes = "x [N, in], w [out, in], bias [out]";

template <class T>
void check_linear_inputs(std::string_view op, const Tensor<T>& x, const Tensor<T>& w) {
  check::rank(op, x, 2, "x");
  check::rank(op, w, 2, "w");
  CUTRAIN_REQUIRE(x.dim(1) == w.dim(1), InvalidArgument, op, "x ", x.describe(), " has ", x.dim(1),
                  " features but w ", w.describe(), " expects ", w.dim(1), " (", linear_shapes, ")");
}
}  // namespace detail

// y = x w^T + bias; bias may be an undefined tensor (no bias).
template <class T>
Tensor<T> linear_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias) {
  constexpr std::string_view op = "linear_forward";
  detail::check_linear_inputs(op, x, w);
  if (bias.defined()) check::shape(op, bias, Shape{w.dim(0)}, "bias");
  const bool cpu = bias.defined() ? detail::use_cpu(op, x, w, bias) : detail::use_cpu(op, x, w);
  if (cpu) {
    if constexpr (CpuFloat<T>) return cpu::linear_forward(x, w, bias);
    else detail::cpu_dtype_unsupported<T>(op);
  }
  return {};
}

template <class T>
Tensor<T> linear_forward(const Tensor<T>& x, const Tensor<T>& w) {
  return linear_forward(x, w, Tensor<T>{});
}

// dx [N, in], dw [out, in] and, when has_bias, db [out] from dy [N, out].
template <class T>
LinearBackward<T> linear_backward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& dy, bool has_bias = true) {
  constexpr std::string_view op = "linear_backward";
  detail::check_linear_inputs(op, x, w);
  check::shape(op, dy, Shape{x.dim(0), w.dim(0)}, "dy");
  if (detail::use_cpu(op, x, w, dy)) {
    if constexpr (CpuFloat<T>) return cpu::linear_backward(x, w, dy, has_bias);
    else detail::cpu_dtype_unsupported<T>(op);
  }
  return {};
}

}  // namespace cutrain::ops
