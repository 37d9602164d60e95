// add / multiply / scale and their backwards: dispatch on the tensors' device. add and multiply
// broadcast (NumPy rules): inputs of unequal shapes go to ops/broadcast.hpp.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>

#include "cutrain/cpu/elementwise.hpp"
#include "cutrain/ops/broadcast.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/elementwise.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
template <class T>
void check_elementwise_pair(std::string_view op, const Tensor<T>& a, std::string_view a_name, const Tensor<T>& b,
                      std::string_view b_name) {
  check::defined(op, a, a_name);
  check::defined(op, b, b_name);
  CUTRAIN_REQUIRE(a.shape() == b.shape(), InvalidArgument, op, a_name, " ", a.describe(), " and ", b_name, " ",
                  b.describe(), " differ in shape (no broadcasting)");
}

inline void check_elementwise_alpha(std::string_view op, double alpha) {
  CUTRAIN_REQUIRE(std::isfinite(alpha), InvalidArgument, op, "alpha must be finite, got ", alpha);
}
}  // namespace detail

// a + b, any layouts. Equal shapes: the output takes a's layout. Unequal ones broadcast
// (ops::binary): a new tensor of the broadcast shape, row-major unless a has that shape.
template <class T>
Tensor<T> add(const Tensor<T>& a, const Tensor<T>& b) {
  constexpr std::string_view op = "add";
  check::defined(op, a, "a");
  check::defined(op, b, "b");
  if (a.shape() != b.shape()) return binary(BinaryOp::add, a, b, op);
  return detail::dispatch<Tensor<T>>(
      op, [](const auto& a, const auto& b) { return cpu::add(a, b); },
      CUTRAIN_IF_CUDA([](const auto& a, const auto& b) {
        Tensor<T> y = detail::device_output<T>(a.shape(), a);
        cuda::kernels::add(a, b, y);
        return y;
      }),
      a, b);
}

// a * b elementwise, as add (ops::mul is the same op under its short name).
template <class T>
Tensor<T> multiply(const Tensor<T>& a, const Tensor<T>& b) {
  constexpr std::string_view op = "multiply";
  check::defined(op, a, "a");
  check::defined(op, b, "b");
  if (a.shape() != b.shape()) return binary(BinaryOp::mul, a, b, op);
  return detail::dispatch<Tensor<T>>(
      op, [](const auto& a, const auto& b) { return cpu::multiply(a, b); },
      CUTRAIN_IF_CUDA([](const auto& a, const auto& b) {
        Tensor<T> y = detail::device_output<T>(a.shape(), a);
        cuda::kernels::multiply(a, b, y);
        return y;
      }),
      a, b);
}

// alpha * a.
template <class T>
Tensor<T> scale(const Tensor<T>& a, double alpha) {
  constexpr std::string_view op = "scale";
  check::defined(op, a, "a");
  detail::check_elementwise_alpha(op, alpha);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& a) { return cpu::scale(a, alpha); },
      CUTRAIN_IF_CUDA([&](const auto& a) {
        Tensor<T> y = detail::device_output<T>(a.shape(), a);
        cuda::kernels::scale(a, alpha, y);
        return y;
      }),
      a);
}

// da = db = dy (two copies).
template <class T>
BinaryBackward<T> add_backward(const Tensor<T>& dy) {
  constexpr std::string_view op = "add_backward";
  check::defined(op, dy, "dy");
  return detail::dispatch<BinaryBackward<T>>(
      op, [](const auto& dy) { return cpu::add_backward(dy); },
      CUTRAIN_IF_CUDA([](const auto& dy) {
        BinaryBackward<T> g{detail::device_output<T>(dy.shape(), dy), detail::device_output<T>(dy.shape(), dy)};
        cuda::kernels::scale(dy, 1.0, g.da);  // exact copies, on the current stream
        cuda::kernels::scale(dy, 1.0, g.db);
        return g;
      }),
      dy);
}

// da = dy * b (in a's layout), db = dy * a (in b's layout). Unequal shapes of a and b:
// binary_backward (each summed back to its input's shape, row-major).
template <class T>
BinaryBackward<T> multiply_backward(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& dy) {
  constexpr std::string_view op = "multiply_backward";
  check::defined(op, a, "a");
  check::defined(op, b, "b");
  if (a.shape() != b.shape()) return binary_backward(BinaryOp::mul, a, b, dy, true, true, op);
  detail::check_elementwise_pair(op, a, "a", b, "b");
  detail::check_elementwise_pair(op, a, "a", dy, "dy");
  return detail::dispatch<BinaryBackward<T>>(
      op, [](const auto& a, const auto& b, const auto& dy) { return cpu::multiply_backward(a, b, dy); },
      CUTRAIN_IF_CUDA([](const auto& a, const auto& b, const auto& dy) {
        BinaryBackward<T> g{detail::device_output<T>(a.shape(), a), detail::device_output<T>(b.shape(), b)};
        cuda::kernels::multiply(dy, b, g.da);
        cuda::kernels::multiply(dy, a, g.db);
        return g;
      }),
      a, b, dy);
}

// da = alpha * dy.
template <class T>
Tensor<T> scale_backward(const Tensor<T>& dy, double alpha) {
  constexpr std::string_view op = "scale_backward";
  check::defined(op, dy, "dy");
  detail::check_elementwise_alpha(op, alpha);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& dy) { return cpu::scale_backward(dy, alpha); },
      CUTRAIN_IF_CUDA([&](const auto& dy) {
        Tensor<T> dx = detail::device_output<T>(dy.shape(), dy);
        cuda::kernels::scale(dy, alpha, dx);
        return dx;
      }),
      dy);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
