// linear_forward / linear_backward / linear_activation_forward / linear_residual_forward:
// dispatch on the tensors' device (CPU: Eigen; CUDA: cuBLASLt with the bias and activation fused
// as epilogues, a residual read as its C operand).
#pragma once

#include "cutrain/core/abi.hpp"

#include "cutrain/cpu/activation.hpp"
#include "cutrain/cpu/elementwise.hpp"
#include "cutrain/cpu/linear.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/api.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
inline constexpr std::string_view linear_shapes = "x [N, in], w [out, in], bias [out]";

template <class T>
void check_linear_inputs(std::string_view op, const Tensor<T>& x, const Tensor<T>& w) {
  check::rank(op, x, 2, "x");
  check::rank(op, w, 2, "w");
  CUTRAIN_REQUIRE(x.dim(1) == w.dim(1), InvalidArgument, op, "x ", x.describe(), " has ", x.dim(1),
                  " features but w ", w.describe(), " expects ", w.dim(1), " (", linear_shapes, ")");
  CUTRAIN_REQUIRE(shape_fits(Shape{x.dim(0), w.dim(0)}, sizeof(T)), InvalidArgument, op, "the output ",
                  Shape{x.dim(0), w.dim(0)}, " of x ", x.describe(), " and w ", w.describe(),
                  " is too large: its byte count overflows int64");
}
}  // namespace detail

// y = x w^T + bias; bias may be an undefined tensor (no bias).
template <class T>
Tensor<T> linear_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias) {
  constexpr std::string_view op = "linear_forward";
  detail::check_linear_inputs(op, x, w);
  if (bias.defined()) check::shape(op, bias, Shape{w.dim(0)}, "bias");
  return detail::dispatch<Tensor<T>>(
      op, [](const auto& x, const auto& w, const auto& bias) { return cpu::linear_forward(x, w, bias); },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& w, const auto& bias) {
        Tensor<T> y = detail::device_output<T>(Shape{x.dim(0), w.dim(0)}, x);
        cuda::cublas::linear_forward(x, w, bias, Activation::identity, y, op);
        return y;
      }),
      x, w, bias);
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
  return detail::dispatch<LinearBackward<T>>(
      op, [&](const auto& x, const auto& w, const auto& dy) { return cpu::linear_backward(x, w, dy, has_bias); },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& w, const auto& dy) {
        LinearBackward<T> g{detail::device_output<T>(x.shape(), dy), detail::device_output<T>(w.shape(), dy),
                            has_bias ? detail::device_output<T>(Shape{w.dim(0)}, dy) : Tensor<T>{}};
        cuda::cublas::linear_backward(x, w, dy, has_bias, g.dx, g.dw, g.db, op);
        return g;
      }),
      x, w, dy);
}

// act(x w^T + bias); bias may be undefined. On the CPU: linear_forward, then activation_forward.
// On CUDA: one cuBLASLt matmul with the bias and activation as its epilogue, for identity, relu
// and gelu_tanh; other activations throw NotImplemented there (run the two ops instead).
template <class T>
Tensor<T> linear_activation_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias,
                                    const ActivationParams& act) {
  constexpr std::string_view op = "linear_activation_forward";
  cutrain::detail::check_activation(op, act);
  detail::check_linear_inputs(op, x, w);
  if (bias.defined()) check::shape(op, bias, Shape{w.dim(0)}, "bias");
  return detail::dispatch<Tensor<T>>(
      op,
      [&](const auto& x, const auto& w, const auto& bias) {
        return cpu::activation_forward(cpu::linear_forward(x, w, bias), act);
      },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& w, const auto& bias) {
        Tensor<T> y = detail::device_output<T>(Shape{x.dim(0), w.dim(0)}, x);
        cuda::cublas::linear_forward(x, w, bias, act.kind, y, op);
        return y;
      }),
      x, w, bias);
}

// x w^T + bias + residual (residual [N, out], any layout); bias may be undefined. On the CPU:
// linear_forward, then add. On CUDA: one cuBLASLt matmul that reads the residual as its C operand
// (beta 1) with the bias in its epilogue: a transformer's residual add in the projection's pass.
template <class T>
Tensor<T> linear_residual_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias,
                                  const Tensor<T>& residual) {
  constexpr std::string_view op = "linear_residual_forward";
  detail::check_linear_inputs(op, x, w);
  if (bias.defined()) check::shape(op, bias, Shape{w.dim(0)}, "bias");
  check::defined(op, residual, "residual");
  check::shape(op, residual, Shape{x.dim(0), w.dim(0)}, "residual");
  return detail::dispatch<Tensor<T>>(
      op,
      [](const auto& x, const auto& w, const auto& bias, const auto& r) {
        return cpu::add(cpu::linear_forward(x, w, bias), r);
      },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& w, const auto& bias, const auto& r) {
        Tensor<T> y = detail::device_output<T>(Shape{x.dim(0), w.dim(0)}, x);
        const Tensor<T> rows = r.contiguous(Layout::row_major);
        cuda::cublas::linear_forward(x, w, bias, Activation::identity, y, op, &rows);
        return y;
      }),
      x, w, bias, residual);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
