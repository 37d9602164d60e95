// layer_norm_forward / layer_norm_backward: validate, then dispatch on the tensors' device.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <string_view>
#include <vector>

#include "cutrain/cpu/layer_norm.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/cudnn/norm.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

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
  return detail::dispatch<LayerNormForward<T, S>, detail::NormDtypes<T, S>>(
      op, [&](const auto& x, const auto& gamma, const auto& beta) { return cpu::layer_norm_forward(x, gamma, beta, eps); },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& gamma, const auto& beta) {
        const Device dev = x.device();
        // cuDNN's layer norm (9.19, H200) gave wrong results for NHWC x and has no NHWC backward:
        // it runs on a row-major (NCHW) copy, and y goes back to x's layout.
        const auto xs = x.contiguous(Layout::row_major);
        LayerNormForward<T, S> r{Tensor<T>(x.shape(), {.device = dev}), Tensor<S>(Shape{x.dim(0)}, {.device = dev}),
                                 Tensor<S>(Shape{x.dim(0)}, {.device = dev})};
        cuda::cudnn::layer_norm_forward(xs, gamma.contiguous(Layout::row_major), beta.contiguous(Layout::row_major),
                                        eps, r.y, r.mean, r.inv_std);
        if (detail::elementwise_layout(x) == Layout::nhwc) r.y = r.y.contiguous(Layout::nhwc);
        return r;
      }),
      x, gamma, beta);
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
  return detail::dispatch<NormBackward<T, S>, detail::NormDtypes<T, S>>(
      op,
      [](const auto& x, const auto& dy, const auto& gamma, const auto& mean, const auto& inv_std) {
        return cpu::layer_norm_backward(x, dy, gamma, mean, inv_std);
      },
      CUTRAIN_IF_CUDA([](const auto& x, const auto& dy, const auto& gamma, const auto& mean, const auto& inv_std) {
        const Device dev = x.device();
        // Row-major (NCHW) only, as in the forward.
        const auto xs = x.contiguous(Layout::row_major), dys = dy.contiguous(Layout::row_major);
        NormBackward<T, S> r{Tensor<T>(x.shape(), {.device = dev}), Tensor<S>(gamma.shape(), {.device = dev}),
                             Tensor<S>(gamma.shape(), {.device = dev})};
        cuda::cudnn::layer_norm_backward(xs, dys, gamma.contiguous(Layout::row_major), mean, inv_std, r.dx, r.dgamma,
                                         r.dbeta);
        if (detail::elementwise_layout(dy) == Layout::nhwc) r.dx = r.dx.contiguous(Layout::nhwc);
        return r;
      }),
      x, dy, gamma, mean, inv_std);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
