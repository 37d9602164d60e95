// index_select and gather on the CPU, forward and backward (ops/index.hpp checks the arguments
// and the index values first). Any strides in; outputs and gradients are new row-major tensors.
// The backwards add dy into zeros of x's shape in the order of the index positions (row-major
// over the index for gather), in T: deterministic.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <vector>

#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu {

namespace detail {
// Calls fn(coords, i) for every element of shape in row-major order (i its logical index).
template <class Fn>
void for_each_coord(const Shape& shape, Fn&& fn) {
  const std::int64_t n = shape.numel();
  std::vector<std::int64_t> c(static_cast<std::size_t>(shape.rank()), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    fn(c, i);
    for (int d = shape.rank() - 1; d >= 0; --d) {
      const auto ud = static_cast<std::size_t>(d);
      if (++c[ud] < shape[d]) break;
      c[ud] = 0;
    }
  }
}

inline std::int64_t offset_at(const std::vector<std::int64_t>& c, const Strides& st) {
  std::int64_t off = 0;
  for (std::size_t k = 0; k < c.size(); ++k) off += c[k] * st[k];
  return off;
}
}  // namespace detail

// y = x with position j of dim d taken from position index[j] of x's dim d.
template <CpuFloat T>
Tensor<T> index_select(const Tensor<T>& x, int d, const Tensor<std::int32_t>& index) {
  Shape s = x.shape();
  s[d] = index.numel();
  Tensor<T> y(s);
  for (std::int64_t j = 0; j < index.numel(); ++j) {
    const std::int64_t v = index.data()[j * index.strides()[0]];
    y.slice(d, j, j + 1).copy_from(x.slice(d, v, v + 1));
  }
  return y;
}

// dx (x_shape) = zeros, then dx[.., index[j], ..] += dy[.., j, ..] for j in order.
template <CpuFloat T>
Tensor<T> index_select_backward(const Tensor<T>& dy, const Shape& x_shape, int d, const Tensor<std::int32_t>& index) {
  Tensor<T> dx = Tensor<T>::zeros(x_shape);
  for (std::int64_t j = 0; j < index.numel(); ++j) {
    const std::int64_t v = index.data()[j * index.strides()[0]];
    const Tensor<T> to = dx.slice(d, v, v + 1), from = dy.slice(d, j, j + 1);
    T* pt = to.data();
    const T* pf = from.data();
    cutrain::detail::for_each_offset2(to.shape(), to.strides(), from.strides(),
                                      [&](std::int64_t ot, std::int64_t of) { pt[ot] += pf[of]; });
  }
  return dx;
}

// y (index's shape) at c = x at c with coordinate d replaced by index at c.
template <CpuFloat T>
Tensor<T> gather(const Tensor<T>& x, int d, const Tensor<std::int32_t>& index) {
  Tensor<T> y(index.shape());
  const auto ud = static_cast<std::size_t>(d);
  detail::for_each_coord(index.shape(), [&](std::vector<std::int64_t>& c, std::int64_t i) {
    const std::int64_t keep = c[ud];
    const std::int64_t v = index.data()[detail::offset_at(c, index.strides())];
    c[ud] = v;
    y.data()[i] = x.data()[detail::offset_at(c, x.strides())];
    c[ud] = keep;
  });
  return y;
}

// dx (x_shape) = zeros, then dx at (c with coordinate d = index at c) += dy at c, c row-major.
template <CpuFloat T>
Tensor<T> gather_backward(const Tensor<T>& dy, const Shape& x_shape, int d, const Tensor<std::int32_t>& index) {
  Tensor<T> dx = Tensor<T>::zeros(x_shape);
  const auto ud = static_cast<std::size_t>(d);
  detail::for_each_coord(index.shape(), [&](std::vector<std::int64_t>& c, std::int64_t) {
    const std::int64_t keep = c[ud];
    const T g = dy.data()[detail::offset_at(c, dy.strides())];
    c[ud] = index.data()[detail::offset_at(c, index.strides())];
    dx.data()[detail::offset_at(c, dx.strides())] += g;
    c[ud] = keep;
  });
  return dx;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
