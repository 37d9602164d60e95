// rms_norm_forward / rms_norm_backward over the trailing dims of x (gamma's shape, any rank):
// validate and view x as [rows, d] as ops/layer_norm.hpp does, then dispatch on the tensors'
// device (docs/ops/normalization.md, "RMS norm").
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <string_view>
#include <utility>

#include "cutrain/cpu/rms_norm.hpp"
#include "cutrain/ops/broadcast.hpp"
#include "cutrain/ops/cast.hpp"
#include "cutrain/ops/dispatch.hpp"
#include "cutrain/ops/elementwise.hpp"
#include "cutrain/ops/layer_norm.hpp"
#include "cutrain/ops/reduce.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/api.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
// Where cuDNN has no engine for the rmsnorm node, the op is composed from cutrain's GPU ops on x
// as [rows, d] (row-major), in f32 whatever x's type, with the formulas of cpu/rms_norm.hpp.
// eps becomes a [1, 1] device tensor as exp(0) * eps: made on the device's stream, with no host
// copy, so the fallback can be captured in a CUDA graph as the cuDNN path can.
inline Tensor<float> rms_norm_eps_tensor(double eps, Device dev) {
  return ops::scale(ops::exp(Tensor<float>::zeros(Shape{1, 1}, {.device = dev})), eps);
}

template <class T>
RmsNormForward<T, float> rms_norm_composed_forward(const Tensor<T>& x2, const Tensor<float>& gamma, double eps) {
  const std::int64_t d = x2.dim(1);
  const Tensor<float> xf = ops::cast<float>(x2);
  const Tensor<float> ms = ops::mean(ops::mul(xf, xf), {1}, true);                              // [rows, 1]
  Tensor<float> inv = ops::rsqrt(ops::add(ms, rms_norm_eps_tensor(eps, x2.device())));          // [rows, 1]
  const Tensor<float> yf = ops::mul(ops::mul(xf, inv), gamma.reshape({1, d}));
  return {ops::cast<T>(yf), inv.reshape({x2.dim(0)})};
}

template <class T>
RmsNormBackward<T, float> rms_norm_composed_backward(const Tensor<T>& x2, const Tensor<T>& dy2,
                                                     const Tensor<float>& gamma, const Tensor<float>& inv_rms) {
  const std::int64_t rows = x2.dim(0), d = x2.dim(1);
  const Tensor<float> xf = ops::cast<float>(x2), dyf = ops::cast<float>(dy2);
  const Tensor<float> inv = inv_rms.reshape({rows, 1});
  const Tensor<float> xhat = ops::mul(xf, inv);
  const Tensor<float> g = ops::mul(dyf, gamma.reshape({1, d}));
  const Tensor<float> m = ops::mean(ops::mul(g, xhat), {1}, true);  // [rows, 1]
  const Tensor<float> dxf = ops::mul(ops::sub(g, ops::mul(xhat, m)), inv);
  return {ops::cast<T>(dxf), ops::sum(ops::mul(dyf, xhat), {0})};
}

template <class T, class S>
RmsNormForward<T, S> rms_norm_rows_forward(std::string_view op, const Tensor<T>& x, const Tensor<S>& gamma, double eps) {
  return dispatch<RmsNormForward<T, S>, NormDtypes<T, S>>(
      op, [&](const auto& x, const auto& gamma) { return cpu::rms_norm_forward(x, gamma, eps); },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& gamma) {
        const Device dev = x.device();
        // Row-major, 16-byte aligned copies for cuDNN, as for layer norm; y goes back to x's layout.
        const auto xs = contiguous_aligned(x, Layout::row_major);
        const auto gs = contiguous_aligned(gamma, Layout::row_major);
        RmsNormForward<T, S> r{Tensor<T>(x.shape(), {.device = dev}), Tensor<S>(Shape{x.dim(0)}, {.device = dev})};
        if (!cuda::cudnn::rms_norm_forward(xs, gs, eps, r.y, r.inv_rms)) {
          const std::int64_t n = x.dim(0);
          RmsNormForward<T, S> c = rms_norm_composed_forward(xs.reshape({n, x.numel() / n}), gs.reshape({gs.numel()}), eps);
          r = {c.y.reshape(x.shape()), std::move(c.inv_rms)};
        }
        if (elementwise_layout(x) == Layout::nhwc) r.y = r.y.contiguous(Layout::nhwc);
        return r;
      }),
      x, gamma);
}

template <class T, class S>
RmsNormBackward<T, S> rms_norm_rows_backward(std::string_view op, const Tensor<T>& x, const Tensor<T>& dy,
                                             const Tensor<S>& gamma, const Tensor<S>& inv_rms) {
  return dispatch<RmsNormBackward<T, S>, NormDtypes<T, S>>(
      op,
      [](const auto& x, const auto& dy, const auto& gamma, const auto& inv_rms) {
        return cpu::rms_norm_backward(x, dy, gamma, inv_rms);
      },
      CUTRAIN_IF_CUDA([](const auto& x, const auto& dy, const auto& gamma, const auto& inv_rms) {
        const Device dev = x.device();
        const auto xs = contiguous_aligned(x, Layout::row_major), dys = contiguous_aligned(dy, Layout::row_major);
        const auto gs = contiguous_aligned(gamma, Layout::row_major);
        const auto is = contiguous_aligned(inv_rms, Layout::row_major);
        RmsNormBackward<T, S> r{Tensor<T>(x.shape(), {.device = dev}), Tensor<S>(gamma.shape(), {.device = dev})};
        if (!cuda::cudnn::rms_norm_backward(xs, dys, gs, is, r.dx, r.dgamma)) {
          const std::int64_t n = x.dim(0), d = x.numel() / n;
          RmsNormBackward<T, S> c =
              rms_norm_composed_backward(xs.reshape({n, d}), dys.reshape({n, d}), gs.reshape({d}), is);
          r = {c.dx.reshape(x.shape()), c.dgamma.reshape(gamma.shape())};
        }
        if (elementwise_layout(dy) == Layout::nhwc) r.dx = r.dx.contiguous(Layout::nhwc);
        return r;
      }),
      x, dy, gamma, inv_rms);
}

}  // namespace detail

// RMS normalization (torch.nn.RMSNorm) of x over its trailing dims, gamma.shape() (1 to x.rank()
// of them), per element of the leading dims: y = gamma * x * inv_rms with
// inv_rms = 1 / sqrt(mean(x^2) + eps). inv_rms has the leading dims' shape ({} when gamma has
// every dim of x). x of any rank and layout; y takes x's layout (NHWC stays NHWC).
template <class T, class S>
RmsNormForward<T, S> rms_norm_forward(const Tensor<T>& x, const Tensor<S>& gamma, double eps = 1e-5) {
  constexpr std::string_view op = "rms_norm_forward";
  const detail::LayerNormGeometry g = detail::layer_norm_geometry(op, x, gamma);
  cutrain::detail::norm_check_eps(op, eps);
  RmsNormForward<T, S> r = detail::rms_norm_rows_forward(op, detail::layer_norm_rows(x, g),
                                                         detail::layer_norm_flat(gamma, g, g.d), eps);
  if (!g.legacy) {
    r.y = detail::layer_norm_unrows(std::move(r.y), x, g);
    r.inv_rms = r.inv_rms.reshape(g.lead);
  }
  return r;
}

// The gradients of rms_norm_forward from its saved inv_rms (the leading dims' shape): dx in dy's
// layout (NHWC stays NHWC), dgamma of gamma's shape.
template <class T, class S>
RmsNormBackward<T, S> rms_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<S>& gamma,
                                        const Tensor<S>& inv_rms) {
  constexpr std::string_view op = "rms_norm_backward";
  const detail::LayerNormGeometry g = detail::layer_norm_geometry(op, x, gamma);
  check::shape(op, dy, x.shape(), "dy");
  check::shape(op, inv_rms, g.lead, "inv_rms");
  RmsNormBackward<T, S> r = detail::rms_norm_rows_backward(
      op, detail::layer_norm_rows(x, g), detail::layer_norm_rows(dy, g), detail::layer_norm_flat(gamma, g, g.d),
      detail::layer_norm_flat(inv_rms, g, g.rows));
  if (!g.legacy) {
    r.dx = detail::layer_norm_unrows(std::move(r.dx), dy, g);
    r.dgamma = r.dgamma.reshape(gamma.shape());
  }
  return r;
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
