// layer_norm_forward / layer_norm_backward: validate, then dispatch on the tensors' device.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "cutrain/cpu/layer_norm.hpp"
#include "cutrain/ops/dispatch.hpp"

namespace cutrain::ops {

namespace detail {
// x must have rank >= 2 and no zero dimension; returns the shape gamma and beta must have.
template <class T>
Shape layer_norm_check_x(std::string_view op, const Tensor<T>& x) {
  check::defined(op, x, "x");
  CUTRAIN_REQUIRE(x.rank() >= 2, InvalidArgument, op, "x must have at least 2 dims [N, ...], got ", x.describe());
  check::non_empty(op, x, "x");
  return Shape(std::vector<std::int64_t>(x.shape().dims().begin() + 1, x.shape().dims().end()));
}
}  // namespace detail

template <class T>
LayerNormForward<T> layer_norm_forward(const Tensor<T>& x, const Tensor<T>& gamma, const Tensor<T>& beta,
                                       double eps = 1e-5) {
  constexpr std::string_view op = "layer_norm_forward";
  const Shape rest = detail::layer_norm_check_x(op, x);
  check::shape(op, gamma, rest, "gamma");
  check::shape(op, beta, rest, "beta");
  cutrain::detail::norm_check_eps(op, eps);
  if (detail::use_cpu(op, x, gamma, beta)) {
    if constexpr (CpuFloat<T>) return cpu::layer_norm_forward(x, gamma, beta, eps);
    else detail::cpu_dtype_unsupported<T>(op);
  }
  return {};
}

template <class T>
NormBackward<T> layer_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<T>& gamma,
                                    const Tensor<T>& mean, const Tensor<T>& inv_std) {
  constexpr std::string_view op = "layer_norm_backward";
  const Shape rest = detail::layer_norm_check_x(op, x);
  check::shape(op, dy, x.shape(), "dy");
  check::shape(op, gamma, rest, "gamma");
  const Shape n{x.dim(0)};
  check::shape(op, mean, n, "mean");
  check::shape(op, inv_std, n, "inv_std");
  if (detail::use_cpu(op, x, dy, gamma, mean, inv_std)) {
    if constexpr (CpuFloat<T>) return cpu::layer_norm_backward(x, dy, gamma, mean, inv_std);
    else detail::cpu_dtype_unsupported<T>(op);
  }
  return {};
}

}  // namespace cutrain::ops
