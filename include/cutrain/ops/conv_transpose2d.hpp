// conv_transpose2d_forward / _backward_data / _backward_filter: validate, then dispatch on the
// tensors' device. Each is a convolution primitive with the roles swapped: forward is conv2d's
// dgrad, backward data conv2d's fprop, backward filter conv2d's wgrad with x and dy exchanged
// (on the GPU one cuDNN graph each). The bias gradient is conv2d_backward_bias(dy).
#pragma once

#include "cutrain/core/abi.hpp"

#include "cutrain/cpu/conv_transpose2d.hpp"
#include "cutrain/ops/conv2d.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/core/view.hpp"
#include "cutrain/cuda/api.hpp"
#include "cutrain/ops/elementwise.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
// dy must be exactly the output that x_shape and w_shape give.
template <class T>
void conv_transpose2d_check_dy(std::string_view op, const Tensor<T>& dy, const Shape& x_shape, const Shape& w_shape,
                               const ConvTranspose2dParams& p) {
  check::rank(op, dy, 4, "dy");
  const Shape y = conv_transpose2d_output_shape(x_shape, w_shape, p, op);
  CUTRAIN_REQUIRE(dy.shape() == y, InvalidArgument, op, "dy must have the output shape ", y, " of x ", x_shape,
                  " and w ", w_shape, " with ", p, ", got ", dy.describe());
}
}  // namespace detail

// y [N, Cout, Ho, Wo] from x [N, Cin, H, W] and w [Cin, Cout/groups, R, S]; bias [Cout] may be
// undefined. y takes x's layout.
template <class T>
Tensor<T> conv_transpose2d_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias,
                                   const ConvTranspose2dParams& p) {
  constexpr std::string_view op = "conv_transpose2d_forward";
  check::rank(op, x, 4, "x");
  check::rank(op, w, 4, "w");
  const Shape ys = conv_transpose2d_output_shape(x.shape(), w.shape(), p, op);
  detail::conv2d_check_bias(op, bias, ys[1]);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& x, const auto& w, const auto& bias) { return cpu::conv_transpose2d_forward(x, w, bias, p); },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& w, const auto& bias) {
        Tensor<T> y = detail::device_output<T>(ys, x);
        if (!bias.defined()) {
          cuda::cudnn::conv2d_backward_data(x, w, p.conv(), y);
          return y;
        }
        try {
          cuda::cudnn::conv_transpose2d_forward(x, w, bias.contiguous(), p.conv(), y);
        } catch (const CudnnError&) {
          // No engine fuses the bias add behind this dgrad: the dgrad graph, then an add of the
          // bias broadcast over [N, Cout, Ho, Wo]. The failed build is remembered (one exception per call).
          cuda::cudnn::conv2d_backward_data(x, w, p.conv(), y);
          return add(y, cutrain::expand(cutrain::reshape(bias, Shape{1, ys[1], 1, 1}), ys));
        }
        return y;
      }),
      x, w, bias);
}

template <class T>
Tensor<T> conv_transpose2d_forward(const Tensor<T>& x, const Tensor<T>& w, const ConvTranspose2dParams& p) {
  return conv_transpose2d_forward(x, w, Tensor<T>{}, p);
}

// dx (x_shape, dy's layout) = conv2d_forward(dy, w) with p.conv().
template <class T>
Tensor<T> conv_transpose2d_backward_data(const Tensor<T>& dy, const Tensor<T>& w, const Shape& x_shape,
                                         const ConvTranspose2dParams& p) {
  constexpr std::string_view op = "conv_transpose2d_backward_data";
  check::rank(op, w, 4, "w");
  detail::conv_transpose2d_check_dy(op, dy, x_shape, w.shape(), p);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& dy, const auto& w) { return cpu::conv_transpose2d_backward_data(dy, w, p); },
      CUTRAIN_IF_CUDA([&](const auto& dy, const auto& w) {
        Tensor<T> dx = detail::device_output<T>(x_shape, dy);
        cuda::cudnn::conv2d_forward(dy, w, Tensor<T>{}, p.conv(), dx);
        return dx;
      }),
      dy, w);
}

// dw (w_shape [Cin, Cout/groups, R, S], dy's layout) = conv2d's filter gradient of x := dy, dy := x.
template <class T>
Tensor<T> conv_transpose2d_backward_filter(const Tensor<T>& dy, const Tensor<T>& x, const Shape& w_shape,
                                           const ConvTranspose2dParams& p) {
  constexpr std::string_view op = "conv_transpose2d_backward_filter";
  check::rank(op, x, 4, "x");
  detail::conv_transpose2d_check_dy(op, dy, x.shape(), w_shape, p);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& dy, const auto& x) { return cpu::conv_transpose2d_backward_filter(dy, x, w_shape, p); },
      CUTRAIN_IF_CUDA([&](const auto& dy, const auto& x) {
        Tensor<T> dw = detail::device_output<T>(w_shape, dy);
        cuda::cudnn::conv2d_backward_filter(x, dy, p.conv(), dw);
        return dw;
      }),
      dy, x);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
