// layer_norm_forward / layer_norm_backward: validate, then dispatch on the tensors' device.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "cutrain/cpu/layer_norm.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/cudnn/norm.hpp"
#endif

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

template <class T, class S>
LayerNormForward<T, S> layer_norm_forward(const Tensor<T>& x, const Tensor<S>& gamma, const Tensor<S>& beta,
                                          double eps = 1e-5) {
  constexpr std::string_view op = "layer_norm_forward";
  const Shape rest = detail::layer_norm_check_x(op, x);
  check::shape(op, gamma, rest, "gamma");
  check::shape(op, beta, rest, "beta");
  cutrain::detail::norm_check_eps(op, eps);
  if (detail::on_cpu(op, x, gamma, beta)) {
    if constexpr (CpuFloat<T> && std::same_as<T, S>) return cpu::layer_norm_forward(x, gamma, beta, eps);
    else detail::norm_dtypes_unsupported<T, S>(op, x.device());
  }
#ifdef CUTRAIN_WITH_CUDA
  if constexpr (cuda::GpuFloat<T> && std::same_as<S, float>) {
    const Device dev = x.device();
    // cuDNN's layer norm (9.19, H200) gave wrong results for NHWC x and has no NHWC backward:
    // it runs on a row-major (NCHW) copy, and y goes back to x's layout. The copies go through
    // the host until the CUDA copy kernel lands: a slow path, for NHWC only.
    const Tensor<T> xs = x.contiguous(Layout::row_major);
    LayerNormForward<T, S> r{Tensor<T>(x.shape(), {.device = dev}), Tensor<S>(Shape{x.dim(0)}, {.device = dev}),
                             Tensor<S>(Shape{x.dim(0)}, {.device = dev})};
    cuda::cudnn::layer_norm_forward(xs, gamma.contiguous(Layout::row_major), beta.contiguous(Layout::row_major), eps,
                                    r.y, r.mean, r.inv_std);
    if (detail::elementwise_layout(x) == Layout::nhwc) r.y = r.y.contiguous(Layout::nhwc);
    return r;
  } else {
    detail::norm_dtypes_unsupported<T, S>(op, x.device());
  }
#endif
  return {};
}

template <class T, class S>
NormBackward<T, S> layer_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<S>& gamma,
                                       const Tensor<S>& mean, const Tensor<S>& inv_std) {
  constexpr std::string_view op = "layer_norm_backward";
  const Shape rest = detail::layer_norm_check_x(op, x);
  check::shape(op, dy, x.shape(), "dy");
  check::shape(op, gamma, rest, "gamma");
  const Shape n{x.dim(0)};
  check::shape(op, mean, n, "mean");
  check::shape(op, inv_std, n, "inv_std");
  if (detail::on_cpu(op, x, dy, gamma, mean, inv_std)) {
    if constexpr (CpuFloat<T> && std::same_as<T, S>) return cpu::layer_norm_backward(x, dy, gamma, mean, inv_std);
    else detail::norm_dtypes_unsupported<T, S>(op, x.device());
  }
#ifdef CUTRAIN_WITH_CUDA
  if constexpr (cuda::GpuFloat<T> && std::same_as<S, float>) {
    const Device dev = x.device();
    // Row-major (NCHW) only, as in the forward.
    const Tensor<T> xs = x.contiguous(Layout::row_major), dys = dy.contiguous(Layout::row_major);
    NormBackward<T, S> r{Tensor<T>(x.shape(), {.device = dev}), Tensor<S>(gamma.shape(), {.device = dev}),
                         Tensor<S>(gamma.shape(), {.device = dev})};
    cuda::cudnn::layer_norm_backward(xs, dys, gamma.contiguous(Layout::row_major), mean, inv_std, r.dx, r.dgamma,
                                     r.dbeta);
    if (detail::elementwise_layout(dy) == Layout::nhwc) r.dx = r.dx.contiguous(Layout::nhwc);
    return r;
  } else {
    detail::norm_dtypes_unsupported<T, S>(op, x.device());
  }
#endif
  return {};
}

}  // namespace cutrain::ops
