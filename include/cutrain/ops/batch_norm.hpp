// batch_norm_forward_training / batch_norm_forward_inference / batch_norm_backward: validate,
// then dispatch on the tensors' device.
#pragma once

#include <cstdint>
#include <string_view>

#include "cutrain/cpu/batch_norm.hpp"
#include "cutrain/ops/dispatch.hpp"

namespace cutrain::ops {

namespace detail {
// x must be [N,C] or [N,C,H,W] with no zero dimension; returns C.
template <class T>
std::int64_t batch_norm_check_x(std::string_view op, const Tensor<T>& x) {
  check::defined(op, x, "x");
  CUTRAIN_REQUIRE(x.rank() == 2 || x.rank() == 4, InvalidArgument, op, "x must be [N,C] or [N,C,H,W], got ",
                  x.describe());
  check::non_empty(op, x, "x");
  return x.dim(1);
}
}  // namespace detail

template <class T>
BatchNormForward<T> batch_norm_forward_training(const Tensor<T>& x, const Tensor<T>& gamma, const Tensor<T>& beta,
                                                Tensor<T>& running_mean, Tensor<T>& running_var,
                                                const BatchNormParams& p) {
  constexpr std::string_view op = "batch_norm_forward_training";
  const Shape c{detail::batch_norm_check_x(op, x)};
  check::shape(op, gamma, c, "gamma");
  check::shape(op, beta, c, "beta");
  check::shape(op, running_mean, c, "running_mean");
  check::shape(op, running_var, c, "running_var");
  cutrain::detail::norm_check_eps(op, p.eps);
  cutrain::detail::norm_check_momentum(op, p.momentum);
  const std::int64_t per_channel = x.numel() / x.dim(1);
  CUTRAIN_REQUIRE(per_channel > 1, InvalidArgument, op, "x ", x.describe(),
                  " has one value per channel (N*H*W == 1): the unbiased variance for running_var is undefined");
  if (detail::use_cpu(op, x, gamma, beta, running_mean, running_var)) {
    if constexpr (CpuFloat<T>) return cpu::batch_norm_forward_training(x, gamma, beta, running_mean, running_var, p);
    else detail::cpu_dtype_unsupported<T>(op);
  }
  return {};
}

template <class T>
Tensor<T> batch_norm_forward_inference(const Tensor<T>& x, const Tensor<T>& gamma, const Tensor<T>& beta,
                                       const Tensor<T>& running_mean, const Tensor<T>& running_var,
                                       double eps = 1e-5) {
  constexpr std::string_view op = "batch_norm_forward_inference";
  const Shape c{detail::batch_norm_check_x(op, x)};
  check::shape(op, gamma, c, "gamma");
  check::shape(op, beta, c, "beta");
  check::shape(op, running_mean, c, "running_mean");
  check::shape(op, running_var, c, "running_var");
  cutrain::detail::norm_check_eps(op, eps);
  if (detail::use_cpu(op, x, gamma, beta, running_mean, running_var)) {
    if constexpr (CpuFloat<T>) return cpu::batch_norm_forward_inference(x, gamma, beta, running_mean, running_var, eps);
    else detail::cpu_dtype_unsupported<T>(op);
  }
  return {};
}

template <class T>
NormBackward<T> batch_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<T>& gamma,
                                    const Tensor<T>& save_mean, const Tensor<T>& save_inv_std) {
  constexpr std::string_view op = "batch_norm_backward";
  const Shape c{detail::batch_norm_check_x(op, x)};
  check::shape(op, dy, x.shape(), "dy");
  check::shape(op, gamma, c, "gamma");
  check::shape(op, save_mean, c, "save_mean");
  check::shape(op, save_inv_std, c, "save_inv_std");
  if (detail::use_cpu(op, x, dy, gamma, save_mean, save_inv_std)) {
    if constexpr (CpuFloat<T>) return cpu::batch_norm_backward(x, dy, gamma, save_mean, save_inv_std);
    else detail::cpu_dtype_unsupported<T>(op);
  }
  return {};
}

}  // namespace cutrain::ops
