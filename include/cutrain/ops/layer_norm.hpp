// layer_norm_forward / layer_norm_backward over the trailing dims of x (gamma's shape, any rank):
// validate, view x as [rows, d], then dispatch on the tensors' device (docs/ops/normalization.md).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <string_view>
#include <vector>

#include "cutrain/cpu/layer_norm.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/api.hpp"
#include "cutrain/cuda/kernels/layer_norm.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
// x viewed as [rows, d]: rows = the product of the leading dims (lead), d = that of the trailing
// normalized dims (gamma's shape). legacy: gamma has every dim but the first (x as [N, ...]),
// which the CPU and cuDNN paths take as they are.
struct LayerNormGeometry {
  Shape lead;
  std::int64_t rows = 1, d = 1;
  bool legacy = false;
};

// x rank >= 1, no zero dim; gamma of rank 1 to x's, equal to x's trailing dims.
template <class T, class S>
LayerNormGeometry layer_norm_geometry(std::string_view op, const Tensor<T>& x, const Tensor<S>& gamma) {
  check::defined(op, x, "x");
  check::defined(op, gamma, "gamma");
  const int r = x.rank(), k = gamma.rank();
  CUTRAIN_REQUIRE(r >= 1, InvalidArgument, op, "x must have at least 1 dim, got ", x.describe());
  check::non_empty(op, x, "x");
  CUTRAIN_REQUIRE(k >= 1 && k <= r, InvalidArgument, op, "gamma ", gamma.describe(),
                  " is the normalized shape: it must have 1 to ", r, " dims, the trailing dims of x ", x.describe());
  const auto& xd = x.shape().dims();
  const Shape trailing(std::vector<std::int64_t>(xd.end() - k, xd.end()));
  CUTRAIN_REQUIRE(trailing == gamma.shape(), InvalidArgument, op, "gamma ", gamma.describe(),
                  " must equal the trailing ", k, " dims of x ", x.describe(), " (", trailing, ")");
  LayerNormGeometry g;
  g.lead = Shape(std::vector<std::int64_t>(xd.begin(), xd.end() - k));
  g.rows = g.lead.numel();
  g.d = gamma.numel();
  g.legacy = k == r - 1;
  return g;
}

// t (x's shape) as [rows, d], row-major: a view when t is row-major, else a copy on its device.
template <class T>
Tensor<T> layer_norm_rows(const Tensor<T>& t, const LayerNormGeometry& g) {
  return g.legacy ? t.view() : t.contiguous(Layout::row_major).reshape({g.rows, g.d});
}

// A parameter (gamma's shape) or statistic (lead's shape) flattened to `n`.
template <class S>
Tensor<S> layer_norm_flat(const Tensor<S>& t, const LayerNormGeometry& g, std::int64_t n) {
  return g.legacy ? t.view() : t.contiguous(Layout::row_major).reshape({n});
}

// A [rows, d] result back in like's shape, NHWC when like is.
template <class T, class U>
Tensor<T> layer_norm_unrows(Tensor<T> t, const Tensor<U>& like, const LayerNormGeometry& g) {
  if (g.legacy) return t;
  Tensor<T> v = t.reshape(like.shape());
  return elementwise_layout(like) == Layout::nhwc ? v.contiguous(Layout::nhwc) : std::move(v);
}

template <class T, class S>
LayerNormForward<T, S> layer_norm_rows_forward(std::string_view op, const Tensor<T>& x, const Tensor<S>& gamma,
                                               const Tensor<S>& beta, double eps) {
  return dispatch<LayerNormForward<T, S>, NormDtypes<T, S>>(
      op, [&](const auto& x, const auto& gamma, const auto& beta) { return cpu::layer_norm_forward(x, gamma, beta, eps); },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& gamma, const auto& beta) {
        const Device dev = x.device();
        // cutrain's kernel (cuda/kernels/layer_norm.hpp says why not cuDNN's) on a row-major copy
        // of an NHWC x; y goes back to x's layout.
        const auto xs = contiguous_aligned(x, Layout::row_major);
        LayerNormForward<T, S> r{Tensor<T>(x.shape(), {.device = dev}), Tensor<S>(Shape{x.dim(0)}, {.device = dev}),
                                 Tensor<S>(Shape{x.dim(0)}, {.device = dev})};
        cuda::kernels::layer_norm_forward(xs, gamma.contiguous(Layout::row_major), beta.contiguous(Layout::row_major),
                                          eps, r.y, &r.mean, &r.inv_std);
        if (elementwise_layout(x) == Layout::nhwc) r.y = r.y.contiguous(Layout::nhwc);
        return r;
      }),
      x, gamma, beta);
}

template <class T, class S>
NormBackward<T, S> layer_norm_rows_backward(std::string_view op, const Tensor<T>& x, const Tensor<T>& dy,
                                            const Tensor<S>& gamma, const Tensor<S>& mean, const Tensor<S>& inv_std) {
  return dispatch<NormBackward<T, S>, NormDtypes<T, S>>(
      op,
      [](const auto& x, const auto& dy, const auto& gamma, const auto& mean, const auto& inv_std) {
        return cpu::layer_norm_backward(x, dy, gamma, mean, inv_std);
      },
      CUTRAIN_IF_CUDA([](const auto& x, const auto& dy, const auto& gamma, const auto& mean, const auto& inv_std) {
        const Device dev = x.device();
        // Row-major (NCHW) only, as in the forward.
        const auto xs = contiguous_aligned(x, Layout::row_major), dys = contiguous_aligned(dy, Layout::row_major);
        NormBackward<T, S> r{Tensor<T>(x.shape(), {.device = dev}), Tensor<S>(gamma.shape(), {.device = dev}),
                             Tensor<S>(gamma.shape(), {.device = dev})};
        cuda::cudnn::layer_norm_backward(xs, dys, contiguous_aligned(gamma, Layout::row_major), aligned16(mean),
                                         aligned16(inv_std), r.dx, r.dgamma, r.dbeta);
        if (elementwise_layout(dy) == Layout::nhwc) r.dx = r.dx.contiguous(Layout::nhwc);
        return r;
      }),
      x, dy, gamma, mean, inv_std);
}

}  // namespace detail

// Normalizes x over its trailing dims, gamma.shape() (torch's normalized_shape: any 1 to
// x.rank() trailing dims), per element of the leading dims: y = gamma (x - mean) inv_std + beta.
// mean and inv_std have the leading dims' shape ([N] for x [N, ...] and gamma [...]; {} when
// gamma has every dim of x). x of any rank and layout: it is viewed as [rows, d] (a view of a
// row-major x, else a copy on its device) for the CPU and cuDNN paths.
template <class T, class S>
LayerNormForward<T, S> layer_norm_forward(const Tensor<T>& x, const Tensor<S>& gamma, const Tensor<S>& beta,
                                          double eps = 1e-5) {
  constexpr std::string_view op = "layer_norm_forward";
  const detail::LayerNormGeometry g = detail::layer_norm_geometry(op, x, gamma);
  check::shape(op, beta, gamma.shape(), "beta");
  cutrain::detail::norm_check_eps(op, eps);
  LayerNormForward<T, S> r =
      detail::layer_norm_rows_forward(op, detail::layer_norm_rows(x, g), detail::layer_norm_flat(gamma, g, g.d),
                                      detail::layer_norm_flat(beta, g, g.d), eps);
  if (!g.legacy) {
    r.y = detail::layer_norm_unrows(std::move(r.y), x, g);
    r.mean = r.mean.reshape(g.lead);
    r.inv_std = r.inv_std.reshape(g.lead);
  }
  return r;
}

// The gradients of layer_norm_forward from its saved mean and inv_std (the leading dims' shape).
template <class T, class S>
NormBackward<T, S> layer_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<S>& gamma,
                                       const Tensor<S>& mean, const Tensor<S>& inv_std) {
  constexpr std::string_view op = "layer_norm_backward";
  const detail::LayerNormGeometry g = detail::layer_norm_geometry(op, x, gamma);
  check::shape(op, dy, x.shape(), "dy");
  check::shape(op, mean, g.lead, "mean");
  check::shape(op, inv_std, g.lead, "inv_std");
  NormBackward<T, S> r = detail::layer_norm_rows_backward(
      op, detail::layer_norm_rows(x, g), detail::layer_norm_rows(dy, g), detail::layer_norm_flat(gamma, g, g.d),
      detail::layer_norm_flat(mean, g, g.rows), detail::layer_norm_flat(inv_std, g, g.rows));
  if (!g.legacy) {
    r.dx = detail::layer_norm_unrows(std::move(r.dx), dy, g);
    r.dgamma = r.dgamma.reshape(gamma.shape());
    r.dbeta = r.dbeta.reshape(gamma.shape());
  }
  return r;
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
