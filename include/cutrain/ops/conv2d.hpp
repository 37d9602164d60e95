// conv2d_forward / conv2d_backward_data / conv2d_backward_filter / conv2d_backward_bias:
// validate, then dispatch on the tensors' device.
#pragma once

#include "cutrain/core/abi.hpp"

#include "cutrain/cpu/conv2d.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/api.hpp"
#include "cutrain/cuda/kernels/bias_grad.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
template <class T>
void conv2d_check_bias(std::string_view op, const Tensor<T>& bias, std::int64_t K) {
  if (!bias.defined()) return;  // undefined means: no bias
  check::shape(op, bias, Shape{K}, "bias");
}

// dy must be exactly the output that x_shape and w_shape give.
template <class T>
void conv2d_check_dy(std::string_view op, const Tensor<T>& dy, const Shape& x_shape, const Shape& w_shape,
                     const Conv2dParams& p) {
  check::rank(op, dy, 4, "dy");
  const Shape y = conv2d_output_shape(x_shape, w_shape, p, op);
  CUTRAIN_REQUIRE(dy.shape() == y, InvalidArgument, op, "dy must have the output shape ", y, " of x ", x_shape,
                  " and w ", w_shape, " with ", p, ", got ", dy.describe());
}

// A one-channel x on the GPU is handed to cuDNN with NHWC strides (the same memory) where the
// conv's other tensor (w, or dy) is channels-last (is_channels_last), and the output is then
// channels-last: a channels-last model stays so from its first layer, whose input may have one
// channel (Fashion-MNIST), where x's layout() cannot tell.
template <class T, class U>
bool one_channel_follows(const Tensor<T>& x, const Tensor<U>& other) {
  return x.dim(1) == 1 && x.layout() != Layout::strided && is_channels_last(other.shape(), other.strides());
}
template <class T, class U>
Tensor<T> one_channel_as(const Tensor<T>& x, const Tensor<U>& other) {
  if (!one_channel_follows(x, other)) return x.view();
  return x.as_strided(x.shape(), contiguous_strides(x.shape(), Layout::nhwc), x.offset());
}
template <class T, class U>
Tensor<T> conv_output(const Shape& shape, const Tensor<T>& x, const Tensor<U>& other) {
  if (one_channel_follows(x, other)) return Tensor<T>(shape, {.layout = Layout::nhwc, .device = x.device()});
  return device_output<T>(shape, x);
}
}  // namespace detail

template <class T>
Tensor<T> conv2d_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, const Conv2dParams& p) {
  constexpr std::string_view op = "conv2d_forward";
  check::rank(op, x, 4, "x");
  check::rank(op, w, 4, "w");
  conv2d_output_shape(x.shape(), w.shape(), p, op);
  detail::conv2d_check_bias(op, bias, w.dim(0));
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& x, const auto& w, const auto& bias) { return cpu::conv2d_forward(x, w, bias, p); },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& w, const auto& bias) {
        Tensor<T> y = detail::conv_output(conv2d_output_shape(x.shape(), w.shape(), p, op), x, w);
        cuda::cudnn::conv2d_forward(detail::one_channel_as(x, w), w, bias, p, y);
        return y;
      }),
      x, w, bias);
}

template <class T>
Tensor<T> conv2d_forward(const Tensor<T>& x, const Tensor<T>& w, const Conv2dParams& p) {
  return conv2d_forward(x, w, Tensor<T>{}, p);
}

// y = act(conv(x, w) + bias): on the GPU one fused cuDNN graph, on the CPU the bias and the
// activation applied to each sample's GEMM output (cpu::conv2d_fused_forward).
// bias may be undefined. The backward is conv2d_backward_* after activation_backward(conv out).
template <class T>
Tensor<T> conv2d_bias_activation_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias,
                                         const ActivationParams& act, const Conv2dParams& p) {
  constexpr std::string_view op = "conv2d_bias_activation_forward";
  cutrain::detail::check_activation(op, act);
  check::rank(op, x, 4, "x");
  check::rank(op, w, 4, "w");
  [[maybe_unused]] const Shape ys = conv2d_output_shape(x.shape(), w.shape(), p, op);
  detail::conv2d_check_bias(op, bias, w.dim(0));
  return detail::dispatch<Tensor<T>>(
      op,
      [&](const auto& x, const auto& w, const auto& bias) {
        return cpu::conv2d_fused_forward(x, w, bias, std::decay_t<decltype(x)>{}, act, p);
      },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& w, const auto& bias) {
        Tensor<T> y = detail::conv_output(ys, x, w);
        const Tensor<T> xv = detail::one_channel_as(x, w);
        try {
          cuda::cudnn::conv2d_forward(xv, w, bias, p, y, act);
        } catch (const CudnnError&) {
          // cuDNN has no fused engine for every activation, dtype and layout (f32 NCHW + gelu, for
          // one): run the conv (+ bias) graph, then the activation graph. The failed build is
          // remembered, so this costs one exception per call, not a new build.
          cuda::cudnn::conv2d_forward(xv, w, bias, p, y);
          return activation_forward(y, act);
        }
        return y;
      }),
      x, w, bias);
}

template <class T>
Tensor<T> conv2d_backward_data(const Tensor<T>& dy, const Tensor<T>& w, const Shape& x_shape, const Conv2dParams& p) {
  constexpr std::string_view op = "conv2d_backward_data";
  check::rank(op, w, 4, "w");
  detail::conv2d_check_dy(op, dy, x_shape, w.shape(), p);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& dy, const auto& w) { return cpu::conv2d_backward_data(dy, w, x_shape, p); },
      CUTRAIN_IF_CUDA([&](const auto& dy, const auto& w) {
        Tensor<T> dx = detail::device_output<T>(x_shape, dy);
        cuda::cudnn::conv2d_backward_data(dy, w, p, dx);
        return dx;
      }),
      dy, w);
}

// d(act_x) = act'(act_x) * conv2d_backward_data(dy, w): the data gradient of a conv whose input
// was act(act_x), through the activation. On the GPU one fused cuDNN graph (dgrad + activation
// backward) where cuDNN has an engine, else the two graphs in turn; on the CPU the two ops.
template <class T>
Tensor<T> conv2d_backward_data_activation(const Tensor<T>& dy, const Tensor<T>& w, const Tensor<T>& act_x,
                                          const ActivationParams& act, const Conv2dParams& p) {
  constexpr std::string_view op = "conv2d_backward_data_activation";
  cutrain::detail::check_activation(op, act);
  check::rank(op, w, 4, "w");
  check::rank(op, act_x, 4, "act_x");
  detail::conv2d_check_dy(op, dy, act_x.shape(), w.shape(), p);
  return detail::dispatch<Tensor<T>>(
      op,
      [&](const auto& dy, const auto& w, const auto& act_x) {
        return cpu::activation_backward(act_x, cpu::conv2d_backward_data(dy, w, act_x.shape(), p), act);
      },
      CUTRAIN_IF_CUDA([&](const auto& dy, const auto& w, const auto& act_x) {
        Tensor<T> dx = detail::device_output<T>(act_x.shape(), dy);
        try {
          cuda::cudnn::conv2d_backward_data(dy, w, p, dx, act, act_x);
        } catch (const CudnnError&) {
          // No fused engine for this activation, dtype or layout: dgrad graph, then activation graph.
          cuda::cudnn::conv2d_backward_data(dy, w, p, dx);
          return activation_backward(act_x, dx, act);
        }
        return dx;
      }),
      dy, w, act_x);
}

template <class T>
Tensor<T> conv2d_backward_filter(const Tensor<T>& dy, const Tensor<T>& x, const Shape& w_shape,
                                 const Conv2dParams& p) {
  constexpr std::string_view op = "conv2d_backward_filter";
  check::rank(op, x, 4, "x");
  detail::conv2d_check_dy(op, dy, x.shape(), w_shape, p);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& dy, const auto& x) { return cpu::conv2d_backward_filter(dy, x, w_shape, p); },
      CUTRAIN_IF_CUDA([&](const auto& dy, const auto& x) {
        // dw as the weights were laid out: x's layout, or dy's for a one-channel x (detail::conv_output)
        Tensor<T> dw = detail::conv_output(w_shape, x, dy);
        cuda::cudnn::conv2d_backward_filter(dy, detail::one_channel_as(x, dy), p, dw);
        return dw;
      }),
      dy, x);
}

template <class T>
Tensor<T> conv2d_backward_bias(const Tensor<T>& dy) {
  constexpr std::string_view op = "conv2d_backward_bias";
  check::rank(op, dy, 4, "dy");
  cutrain::detail::conv2d_check_dims(op, dy.shape(), "dy");
  return detail::dispatch<Tensor<T>>(
      op, [](const auto& dy) { return cpu::conv2d_backward_bias(dy); },
      // An NVRTC reduction, not cuDNN's: cuDNN 9.19's graph reduction had no engine for this on the
      // H200 except f32 NHWC (2026-11-29).
      CUTRAIN_IF_CUDA([](const auto& dy) {
        Tensor<T> db = detail::device_output<T>(Shape{dy.dim(1)}, dy);
        cuda::kernels::bias_grad(dy, db);
        return db;
      }),
      dy);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
