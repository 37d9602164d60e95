// Elementwise add, multiply and scale on the CPU, forward and backward, any layouts.
#pragma once

#include "cutrain/core/abi.hpp"

#include <vector>

#include "cutrain/cpu/common.hpp"

namespace cutrain::inline CUTRAIN_ABI {

// Gradients of a binary elementwise op with respect to its two inputs.
template <class T>
struct BinaryBackward {
  Tensor<T> da, db;
};

}  // namespace cutrain::inline CUTRAIN_ABI

namespace cutrain::inline CUTRAIN_ABI::cpu {

namespace detail {
// out[i] = fn(a[i], b[i]) over logical indices; out is laid out like `like`.
template <class T, class Fn>
Tensor<T> elementwise_zip(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& like, Fn fn) {
  const auto av = a.to_vector(), bv = b.to_vector();
  std::vector<T> out(av.size());
  for (std::size_t i = 0; i < av.size(); ++i) out[i] = fn(av[i], bv[i]);
  Tensor<T> t = empty_like_layout(like.shape(), like);
  t.assign(out);
  return t;
}
}  // namespace detail

// The output takes a's layout.
template <CpuFloat T>
Tensor<T> add(const Tensor<T>& a, const Tensor<T>& b) {
  return detail::elementwise_zip(a, b, a, [](T x, T y) { return x + y; });
}

template <CpuFloat T>
Tensor<T> multiply(const Tensor<T>& a, const Tensor<T>& b) {
  return detail::elementwise_zip(a, b, a, [](T x, T y) { return x * y; });
}

template <CpuFloat T>
Tensor<T> scale(const Tensor<T>& a, double alpha) {
  const T s = static_cast<T>(alpha);
  return detail::elementwise_zip(a, a, a, [s](T x, T) { return s * x; });
}

// Both gradients are copies of dy (in dy's layout), so callers may accumulate into either.
template <CpuFloat T>
BinaryBackward<T> add_backward(const Tensor<T>& dy) {
  return {dy.clone(), dy.clone()};
}

// da = dy * b in a's layout, db = dy * a in b's layout.
template <CpuFloat T>
BinaryBackward<T> multiply_backward(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& dy) {
  auto mul = [](T x, T y) { return x * y; };
  return {detail::elementwise_zip(dy, b, a, mul), detail::elementwise_zip(dy, a, b, mul)};
}

// dx = alpha * dy, in dy's layout.
template <CpuFloat T>
Tensor<T> scale_backward(const Tensor<T>& dy, double alpha) {
  return scale(dy, alpha);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
