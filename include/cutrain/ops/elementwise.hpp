// add / multiply / scale and their backwards: dispatch on the tensors' device.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>

#include "cutrain/cpu/elementwise.hpp"
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

// a + b; same shapes, any layouts; the output takes a's layout.
template <class T>
Tensor<T> add(const Tensor<T>& a, const Tensor<T>& b) {
  constexpr std::string_view op = "add";
  detail::check_elementwise_pair(op, a, "a", b, "b");
  return detail::dispatch<Tensor<T>>(
      op, [](const auto& a, const auto& b) { return cpu::add(a, b); },
      CUTRAIN_IF_CUDA([](const auto& a, const auto& b) {
        Tensor<T> y = detail::device_output<T>(a.shape(), a);
        cuda::kernels::add(a, b, y);
        return y;
      }),
      a, b);
}

// a * b elementwise; the output takes a's layout.
template <class T>
Tensor<T> multiply(const Tensor<T>& a, const Tensor<T>& b) {
  constexpr std::string_view op = "multiply";
  detail::check_elementwise_pair(op, a, "a", b, "b");
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

// da = dy * b (in a's layout), db = dy * a (in b's layout).
template <class T>
BinaryBackward<T> multiply_backward(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& dy) {
  constexpr std::string_view op = "multiply_backward";
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
